"""Samplers that judge the judge: an exact sampler cheap enough to run check-lossless's procedure
thousands of times, and every deliberately broken sampler of the test suite, in one catalogue.

``ChainSampler`` stands in for a rollout backend: plain and speculative rows alike are drawn from one
Markov chain per (prompt, temperature/top-k/top-p), so every check compares two samples of one
distribution, and the verdict's false-alarm rate can be counted. ``BROKEN`` names each broken
sampler with the tiny model it shows on and the settings of ``LOSSLESS_CONFIGS`` (or the block
verifier's) it affects; ``bench/lossless_verdict.py`` measures how often the procedure catches
each at the default sample count, and tests/check/test_lossless.py pins that it does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from bebop.check.lossless import BLOCK_LOSSLESS_CONFIGS, LosslessConfig
from bebop.speculative import block, engine, sampling, target
from tests.helpers.engine import peaked_model, perturbed_head

CHAIN_VOCAB = 48  # tokens of the simulated chain: wide enough that rare ones get pooled, as on a real model
CHAIN_CONCENTRATION = 0.3  # Dirichlet concentration of each row: a few likely tokens and a long tail
LEAK_ROOM = 64  # extra cache positions for the leaked entries of the broken-rollback engine


class ChainSampler:
    """An exact sampler with the rollout backends' ``rollout`` (speculative settings are ignored: exact by
    construction). Row r's tokens come from numpy's generator keyed by (seed, step, first_row + r's chunk)."""

    name = "chain"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._chains: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def _chain(self, prompt: tuple, key: tuple) -> tuple[np.ndarray, np.ndarray]:
        """(first-token cdf (V,), transition cdfs (V, V)) of one prompt at one sampling key."""
        if (prompt, key) not in self._chains:
            words = [self.seed, *prompt, *(int(1000 * x) for x in key)]
            g = np.random.default_rng(words)
            probs = g.dirichlet(np.full(CHAIN_VOCAB, CHAIN_CONCENTRATION), size=CHAIN_VOCAB + 1)
            self._chains[prompt, key] = (probs[0].cumsum(), probs[1:].cumsum(1))
        return self._chains[prompt, key]

    def rollout(self, prompts, sampling, spec, group_size: int = 1, seed: int = 0, step: int = 0, first_row: int = 0):
        g = np.random.default_rng([seed % 2**63, step, first_row])
        key = (sampling.temperature, sampling.top_k, sampling.top_p)
        out = np.zeros((len(prompts), sampling.max_new_tokens), dtype=np.int64)
        rows_of: dict[tuple, list[int]] = {}
        for r, prompt in enumerate(prompts):
            rows_of.setdefault(tuple(prompt), []).append(r)
        for prompt, rows in rows_of.items():
            first, transitions = self._chain(prompt, key)
            u = g.random((len(rows), sampling.max_new_tokens))
            tokens = np.minimum(np.searchsorted(first, u[:, 0]), CHAIN_VOCAB - 1)
            out[rows, 0] = tokens
            for i in range(1, sampling.max_new_tokens):
                cdf = transitions[tokens]  # (n, V)
                tokens = np.minimum((u[:, i : i + 1] > cdf).sum(1), CHAIN_VOCAB - 1)
                out[rows, i] = tokens
        return SimpleNamespace(token_ids=out.tolist())

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- broken samplers


def tiny_model():
    model = peaked_model(vocab_size=8, hidden_size=16, num_layers=1)
    return model, perturbed_head(model, 0.3)


def context_model():
    """The tiny model with attention weights drawn at std 0.6, so p depends on the whole context: at the
    default init (std 0.02) the model is nearly a Markov chain and a stale KV entry changes nothing."""
    model, head = tiny_model()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "self_attn" in name and weight.dim() == 2:
                weight.copy_(0.6 * torch.randn(weight.shape, generator=g))
    return model, head


def hybrid_model():
    """A NemotronH hybrid (Mamba and attention layers) whose recurrent state matters."""
    from tests.speculative.test_hybrid import _stat_hybrid

    return _stat_hybrid("nemotron_h")


def recover_from_p(monkeypatch) -> None:
    """A wrong residual: the token after a rejection is drawn from p, not from max(0, p - q)."""
    monkeypatch.setattr(sampling, "recovery_weights",
                        lambda p, tokens, q=None: p.to(sampling.compute_dtype(p, q)))


def block_without_correction(monkeypatch) -> None:
    """A wrong block residual: the block verifier's correction dropped (thresholds and emitted token)."""
    monkeypatch.setattr(block, "block_residual", lambda p, q, w: (p.double() - q.double()).clamp_min(0.0))


def break_rollback(monkeypatch) -> None:
    """An off-by-one rollback: from the second verify step on, a row that rejected a draft keeps that draft's
    KV entry in the target's cache (one more committed position than it emitted)."""
    init = target.Target.__init__

    def patched(self, model, batch_size, max_len, **kwargs):
        init(self, model, batch_size, max_len + LEAK_ROOM, **kwargs)
        cache, commit, calls = self.cache, self.cache.commit, []

        def leaky_commit(num_kept):
            calls.append(num_kept)
            if len(calls) >= 3:  # 1 = prefill, 2 = the first verify step (left intact)
                num_kept = [min(n + 1, cache._write_index.shape[1]) for n in num_kept]
            commit(num_kept)

        cache.commit = leaky_commit

    monkeypatch.setattr(target.Target, "__init__", patched)


def stale_state(monkeypatch) -> None:
    """A stale recurrent state: after a verify pass every row keeps the state of the pass's last position."""
    from tests.speculative.test_hybrid import _last_state_commit

    _last_state_commit(monkeypatch)


def _verify_probs(wrong: Callable) -> Callable:
    """Patches the engine's target distribution in verify passes (logits (R, K+1, V)) only: plain sampling
    and the prefill's token keep the right one."""
    def patch(monkeypatch) -> None:
        probs = engine._Runner._probs
        monkeypatch.setattr(engine._Runner, "_probs",
                            lambda self, logits: wrong(self, logits) if logits.dim() == 3 else probs(self, logits))
    return patch


wrong_temperature = _verify_probs(lambda self, logits: sampling.logits_to_probs(
    logits, 1.0, self.sampling.top_k, self.sampling.top_p))
wrong_temperature.__doc__ = "A wrong temperature: verification's p at T = 1 whatever the user's temperature."
wrong_filter = _verify_probs(lambda self, logits: sampling.logits_to_probs(logits, self.sampling.temperature))
wrong_filter.__doc__ = "A wrong filter: verification's p without the user's top-k/top-p."


@dataclass(frozen=True)
class BrokenSampler:
    """A deliberately broken sampler: the patch, the model it shows on, the default settings it breaks."""

    patch: Callable  # takes a pytest MonkeyPatch
    model: Callable  # () -> (model, head)
    configs: tuple[LosslessConfig, ...]  # the settings of the default lists this defect reaches


BROKEN = {
    "wrong residual (recovered from p)": BrokenSampler(recover_from_p, tiny_model, (LosslessConfig("rs", 3, 1.0),)),
    "wrong block residual": BrokenSampler(block_without_correction, tiny_model, BLOCK_LOSSLESS_CONFIGS[:1]),
    "off-by-one KV rollback": BrokenSampler(break_rollback, context_model,
                                            (LosslessConfig("to", 1, 0.7), LosslessConfig("rs", 1, 0.7))),
    "stale recurrent state": BrokenSampler(stale_state, hybrid_model, (LosslessConfig("rs", 3, 1.0),)),
    "wrong temperature": BrokenSampler(wrong_temperature, tiny_model,
                                       (LosslessConfig("rs", 1, 0.7), LosslessConfig("to", 1, 0.7))),
    "wrong top-k/top-p": BrokenSampler(wrong_filter, tiny_model,
                                       (LosslessConfig("to", 1, 1.0, top_k=20, top_p=0.9),)),
}

"""Helpers shared by several test modules: toy models and tokenizers for the engine, the exact
plain-sampling distribution and its chi-square fit, a tiny RL policy and config, random sequences,
and the CLI's error line. Fixtures live in conftest.py.
"""

from __future__ import annotations

import json

import numpy as np
import scipy.stats
import torch

from bebop.embedded import PretrainConfig, build_model, build_tokenizer
from bebop.mtp import MtpHead
from bebop.mtp.data import Sequences
from bebop.rl import RLConfig, resolve_rl_config
from bebop.speculative import engine
from bebop.speculative.sampling import logits_to_probs
from bebop.speculative.settings import SamplingParams
from tests.conftest import tiny_model

# ----------------------------------------------------------------------------- engine: toy models

ALPHA = 1e-4  # false-alarm odds per chi-square check
NUM_ROWS = 100_000  # rows per statistical configuration, one batch of one prompt
MIN_EXPECTED = 5  # chi-square cells with fewer expected counts are pooled into one
VOCAB = 32  # tiny models for exact-match tests: few argmax ties, drafts accepted often enough
STAT_VOCAB = 8  # tiny model for the statistical tests: V^2 = 64 joint cells, V^2 sequences to enumerate
MTP_ATOL = 1e-5  # engine draft logits vs teacher-forced unroll (same float32 ops, different batching)
GREEDY_LENGTHS = (1, 3, 5, 8, 13)  # prompt lengths of one batch
STAT_PROMPT = [3]


class ToyTokenizer:
    """What the engine asks of a tokenizer: ``encode`` (text prompts), ``decode``, ``eos_token_id``.

    Token i is the word ``w{i}``; EOS is skipped when decoding with ``skip_special_tokens``.

    Example: ToyTokenizer(eos_token_id=2).decode([5, 2, 7]) -> "w5 w7".
    """

    WORDS = tuple(f"w{i}" for i in range(VOCAB))  # precomputed: 1e5 rows are decoded per statistical test

    def __init__(self, eos_token_id: int | None = None):
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> list[int]:
        return [int(word[1:]) for word in text.split()]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        skip = self.eos_token_id if skip_special_tokens else None
        return " ".join([self.WORDS[i] for i in ids if i != skip])


def toy_prompts(lengths: tuple[int, ...], vocab: int = VOCAB, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def peaked_model(vocab_size: int = VOCAB, **kwargs):
    """A tiny Qwen3 whose p is peaked and depends on the context (std-1 embeddings, std-0.3 lm_head;
    the default init gives p close to uniform, where q = p nearly always and tests see no rejection)."""
    model = tiny_model("qwen3", vocab_size=vocab_size, **kwargs)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module, std in ((model.get_input_embeddings(), 1.0), (model.get_output_embeddings(), 0.3)):
            module.weight.copy_(std * torch.randn(module.weight.shape, generator=g))
    return model


def perturbed_head(model, scale: float, seed: int = 1) -> MtpHead:
    """A head whose fusion weights are jittered, so q differs from p and drafts are often rejected."""
    head = MtpHead(model)
    g = torch.Generator().manual_seed(seed)
    weight = head.layers[0].eh_proj.weight
    with torch.no_grad():
        weight.add_(scale * torch.randn(weight.shape, generator=g))
    return head


def stat_model():
    """V = 8, one layer, hidden 16, a jittered head: alpha_RS about 0.5, so accepts, rejections and
    bonus tokens all happen often."""
    model = peaked_model(vocab_size=STAT_VOCAB, hidden_size=16, num_layers=1)
    return model, perturbed_head(model, 0.3)


def exact_joint(model, prompt: list[int], sampling: SamplingParams) -> np.ndarray:  # (V, V, V)
    """P(x1, x2, x3) of plain sampling, by enumerating all V^2 continuations (x1, x2) in one forward."""
    vocab = model.config.vocab_size
    n = len(prompt)
    pairs = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))  # (V^2, 2), row = x1 * V + x2
    seqs = torch.cat([torch.tensor(prompt).expand(vocab * vocab, n), pairs], dim=1)  # (V^2, n+2)
    with torch.no_grad():
        logits = model(input_ids=seqs).logits.double()  # (V^2, n+2, V)
    probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    p1 = probs[0, n - 1]  # (V,) p(x1 | prompt)
    p2 = probs[:, n].reshape(vocab, vocab, vocab)[:, 0]  # (V, V) p(x2 | x1)
    p3 = probs[:, n + 1].reshape(vocab, vocab, vocab)  # (V, V, V) p(x3 | x1, x2)
    return (p1[:, None, None] * p2[:, :, None] * p3).numpy()


def assert_fits(observed: np.ndarray, probs: np.ndarray, name: str) -> None:
    """Chi-square goodness of fit of counts to exact probabilities (same shape, any).

    Impossible cells (probability 0, e.g. cut by top-k) must be empty; cells expected below
    MIN_EXPECTED are pooled into one (folded into the smallest cell if still too small).
    """
    observed, probs = observed.reshape(-1), probs.reshape(-1)
    possible = probs > 0
    assert observed[~possible].sum() == 0, f"{name}: tokens drawn outside the support of p"
    observed, expected = observed[possible].astype(float), probs[possible] * observed.sum()
    big = expected >= MIN_EXPECTED
    obs = list(observed[big]) + [observed[~big].sum()]
    exp = list(expected[big]) + [expected[~big].sum()]
    if exp[-1] < MIN_EXPECTED:
        smallest = int(np.argmin(exp[:-1]))
        obs[smallest] += obs.pop()
        exp[smallest] += exp.pop()
    statistic, p_value = scipy.stats.chisquare(obs, exp)
    assert p_value > ALPHA, f"{name}: chi2 = {statistic:.1f} over {len(obs)} cells, p = {p_value:.2e}"


def record_blocks(monkeypatch) -> list[tuple[int, list[int]]]:
    """Spies on the engine: (row, tokens emitted by one prefill or verify step), before truncation."""
    blocks: list[tuple[int, list[int]]] = []
    emit = engine._Runner._emit

    def spy(self, rows, out, num_accepted):
        for row, new, n in zip(rows.index, out.tolist(), num_accepted):
            blocks.append((row, new[: n + 1]))
        return emit(self, rows, out, num_accepted)

    monkeypatch.setattr(engine._Runner, "_emit", spy)
    return blocks


# ----------------------------------------------------------------------------- RL: a tiny policy

TINY = PretrainConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
REWARD = "tests.helpers:char_length_reward"
TIMING_KEYS = ("rollout_s", "rollout_wait_s", "train_s", "mtp_s", "sync_s", "step_s", "tokens_per_s")


def char_length_reward(prompts: list[str], completions: list[str], **_: list) -> list[float]:
    """Dense test reward in [0, 1]: longer decoded completions score higher."""
    return [min(len(c), 100) / 100 for c in completions]


def tiny_policy(seed: int = 0):
    """(model, tokenizer): a random 2-layer Qwen3 with tied embeddings, like the embedded model."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = build_model(TINY, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    return model, tok


def tiny_config(**overrides) -> RLConfig:
    values = dict(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=8, lr=1e-3, save_every=0,
                  reward=REWARD, seed=3)
    return resolve_rl_config(None, {**values, **overrides})


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------- MTP data, CLI


def random_sequences(num=32, vocab=64, seed=0) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(1, vocab, (int(torch.randint(8, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(num)]
    return Sequences(seqs, [3] * num)


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("bebop: error: ")
    return err[-1]

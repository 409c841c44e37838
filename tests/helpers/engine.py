"""Toy models, tokenizers and prompts for the speculative engine's tests, a spy on what it emits, and
plain sampling's exact three-token joint with its chi-square goodness of fit."""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch

from bebop.mtp import MtpHead
from bebop.speculative import engine
from bebop.speculative.completions import UNCUT, Completions
from bebop.speculative.sampling import logits_to_probs
from bebop.speculative.settings import SamplingParams
from bebop.speculative.stats import SpecStats
from tests.helpers.models import tiny_model
from tests.helpers.verification import ALPHA

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

    def spy(self, rows, last_token, num_new, new):
        blocks.extend((row, list(tokens)) for row, tokens in zip(rows.index, new))
        return emit(self, rows, last_token, num_new, new)

    monkeypatch.setattr(engine._Runner, "_emit", spy)
    return blocks


def verifier_stats(completions: Completions) -> SpecStats:
    """Statistics of every verify step as emitted, before the stop check: vLLM's way of counting."""
    if completions.log is None:
        return completions.stats
    stats = completions.log.to_stats([UNCUT] * len(completions.lengths))
    stats.num_generated_tokens = sum(completions.lengths)  # the completions' tokens, not the uncut bound
    return stats


def assert_three_tokens_are_plain(model, out, sampling: SamplingParams, name: str) -> None:
    """``out`` (rows of 3 tokens after STAT_PROMPT) fits plain sampling: the marginals of tokens 1..3 and the joint
    of (1, 2) against the enumerated distribution (``exact_joint``), each by ``assert_fits``."""
    tokens = np.array(out.token_ids)
    assert tokens.shape[1] == 3
    joint = exact_joint(model, STAT_PROMPT, sampling)
    v = model.config.vocab_size
    for t, marginal in enumerate((joint.sum((1, 2)), joint.sum((0, 2)), joint.sum((0, 1)))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), marginal, f"{name} token {t + 1}")
    assert_fits(np.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v), joint.sum(2), f"{name} (1, 2)")


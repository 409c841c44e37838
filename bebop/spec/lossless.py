"""Lossless checks: does speculative sampling, with *your* model and head, sample exactly as plain sampling?

Behind ``bebop check-lossless``. For one prompt (the first of ``prompts``), ``num_samples`` rows are
generated with plain sampling and ``num_samples`` with speculative sampling, and the marginals of
the first ``NUM_TOKENS`` generated tokens are compared with a two-sample chi-square test (Pearson's
test of homogeneity on a 2 x C table of token counts). The speculative settings span both modes
(``to``, ``rs``), K = 1 and 3, temperatures 1.0 and 0.7, one top-k/top-p setting, and batch mixes
(the tested prompt's rows interleaved with rows of the other prompts, so padding, ragged caches
and rows finishing at different steps are exercised).

False-alarm odds: each check fails by chance with probability ``alpha`` when the sampler is exact,
so with m checks the chance of at least one false alarm is 1 - (1 - alpha)^m (at most m * alpha by
the union bound, which holds although checks share samples). With the defaults, alpha = 1e-3 and
m = 21 checks: about 2.1%. A failing check is evidence only if it fails again with another seed or
if its p-value is far below alpha (a broken sampler typically gives p < 1e-10).

Runtime: 11 * num_samples rows of NUM_TOKENS tokens (3 plain references, 7 speculative settings,
two of which add a half-size share of other prompts' rows). The embedded default (8 layers,
hidden 64, V = 218, 8-token prompts) costs about 1 ms of CPU time per row, so the default
num_samples = 10_000 takes about two minutes on 2 CPU cores (20_000: about four). Power: at the
default a check has even odds of catching a total-variation shift of about 3% spread evenly over
10 cells (sqrt(9 / num_samples)); shifts concentrated on rare tokens are caught sooner.

Deviations from a textbook goodness-of-fit test:
    1) Two samples, not one sample against exact probabilities: the plain distribution of token 2
       is a mixture over token 1 that would need V forward passes to enumerate (V^2 for token 3).
       The engine's own tests (tests/spec/test_engine.py) do enumerate it on a tiny vocabulary.
    2) Rare tokens are pooled into one "other" cell so every cell expects >= MIN_EXPECTED counts in
       both samples (the chi-square approximation needs it); a row that ended (EOS) before token i
       counts as its own cell.
    3) Token 1 is drawn by the same prefill code in every mode, so its checks test the batch
       plumbing (padding, mixes) rather than verification; token 2 is the first verified token and
       token 3 the first drawn from a target row after an accepted draft.
    4) The chi-square survival function is computed here (regularized upper incomplete gamma), so
       scipy stays a development-only dependency.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from bebop.spec.engine import SamplingParams, SpecConfig, generate
from bebop.task import arith
from bebop.utils.io import BebopError
from bebop.utils.progress import progress

NUM_TOKENS = 3  # generated tokens whose marginals are checked: 1 = prefill, 2 = verified, 3 = after an accept
DEFAULT_NUM_SAMPLES = 10_000  # rows per sample: about two minutes for the embedded default on 2 cores
DEFAULT_ALPHA = 1e-3  # false-alarm odds per check
MIN_EXPECTED = 5.0  # expected count every chi-square cell needs in both samples
CHUNK_ROWS = 4096  # rows per generate call: bounds cache memory, keeps the working set small
OTHER_ROW_EVERY = 3  # in a batch mix, every third row belongs to another prompt
ENDED = -1  # the "token" of a row that emitted EOS before position i
DEFAULT_NUM_PROMPTS = 4  # the tested prompt and three mix partners
GAMMA_EPS = 1e-15  # relative accuracy of the incomplete-gamma series and continued fraction
GAMMA_MAX_ITER = 10_000  # enough for dof up to ~1e6 (iterations grow like sqrt(dof))
GAMMA_TINY = 1e-300  # Lentz's guard against division by zero


@dataclass(frozen=True)
class LosslessConfig:
    """One speculative setting compared with plain sampling at the same temperature/top-k/top-p."""

    mode: str  # to | rs
    k: int  # speculate_k, drafts verified per target pass
    temperature: float  # > 0: exactness is about sampling; greedy is pinned by the engine's tests
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    batch_mix: bool = False  # interleave the tested prompt's rows with rows of the other prompts

    @property
    def sampling_key(self) -> tuple[float, int, float]:
        return (self.temperature, self.top_k, self.top_p)


LOSSLESS_CONFIGS = (  # every mode meets both K, both temperatures, top-k/top-p and a batch mix
    LosslessConfig("rs", 3, 1.0),
    LosslessConfig("to", 3, 1.0),
    LosslessConfig("rs", 1, 0.7),
    LosslessConfig("to", 1, 0.7),
    LosslessConfig("rs", 3, 1.0, top_k=20, top_p=0.9, batch_mix=True),
    LosslessConfig("to", 1, 1.0, top_k=20, top_p=0.9),
    LosslessConfig("to", 3, 0.7, batch_mix=True),
)


@dataclass(frozen=True)
class LosslessCheck:
    """One two-sample chi-square test: speculative vs plain marginal of one generated token."""

    name: str  # e.g. "rs K=3 T=1 top-k=20 top-p=0.9 mixed, token 2"
    mode: str  # to | rs
    k: int  # speculate_k
    temperature: float  # of the target (q is drawn at the same temperature)
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    statistic: float  # Pearson's chi-square
    dof: int  # cells - 1 (0: both samples are one token, nothing to compare; p = 1)
    p_value: float  # P(chi2_dof >= statistic) under exactness
    passed: bool  # p_value > alpha
    token: int = 1  # which generated token, 1-based
    batch_mix: bool = False  # the speculative rows were mixed with other prompts' rows
    alpha: float = DEFAULT_ALPHA  # the false-alarm odds this check was run at


# ----------------------------------------------------------------------------- chi-square


def _gamma_p_series(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) by its power series (converges fast for x < a + 1)."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(GAMMA_MAX_ITER):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * GAMMA_EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_continued_fraction(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) by its continued fraction (modified Lentz; x >= a + 1).

    Q(a, x) = e^-x x^a / Gamma(a) * 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / (x + 5 - a - ...))).
    """
    b = x + 1.0 - a
    c = 1.0 / GAMMA_TINY
    d = 1.0 / b
    h = d
    for i in range(1, GAMMA_MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = GAMMA_TINY if abs(d) < GAMMA_TINY else d
        c = b + an / c
        c = GAMMA_TINY if abs(c) < GAMMA_TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < GAMMA_EPS:
            break
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with ``dof`` degrees of freedom: Q(dof / 2, statistic / 2).

    Accurate to ~1e-13 relative (tested against scipy.stats.chi2.sf); underflows to 0 below ~1e-300.

    Example: chi2_sf(3.841, 1) ~= 0.05; chi2_sf(0, 4) == 1.0.
    """
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if statistic <= 0:
        return 1.0
    a, x = dof / 2.0, statistic / 2.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _gamma_p_series(a, x))
    return _gamma_q_continued_fraction(a, x)


def pool_rare_cells(
    first: Counter, second: Counter, min_expected: float = MIN_EXPECTED
) -> tuple[list[int], list[int]]:
    """Aligned cell counts of two samples, rare categories pooled so each cell expects >= min_expected.

    A category's expected count in a sample is its pooled share times that sample's size; categories
    below ``min_expected`` in either sample go to one OTHER cell, which is folded into the smallest
    kept cell if it is itself too small.

    Example: first = {a: 50, b: 50, c: 1}, second = {a: 48, b: 52, d: 2} -> ([50, 51], [52, 50])
    (cells b, a; c and d expect 1.5 together, too few for a cell of their own, so they join a).
    """
    n1, n2 = sum(first.values()), sum(second.values())
    total = n1 + n2
    smaller = min(n1, n2)
    categories = sorted(set(first) | set(second), key=lambda c: -(first[c] + second[c]))
    kept = [c for c in categories if smaller * (first[c] + second[c]) / total >= min_expected]
    kept_set = set(kept)
    rare = [c for c in categories if c not in kept_set]
    cells1, cells2 = [first[c] for c in kept], [second[c] for c in kept]
    if rare:
        other1, other2 = sum(first[c] for c in rare), sum(second[c] for c in rare)
        if smaller * (other1 + other2) / total >= min_expected or not kept:
            cells1.append(other1)
            cells2.append(other2)
        else:
            cells1[-1] += other1  # kept is sorted by count, so the last kept cell is the smallest
            cells2[-1] += other2
    return cells1, cells2


def two_sample_chi2(first: Counter, second: Counter) -> tuple[float, int, float]:
    """Pearson's chi-square test that two samples of categories come from one distribution.

    Returns (statistic, dof, p_value). With fewer than two cells after pooling there is nothing to
    compare: (0.0, 0, 1.0).
    """
    cells1, cells2 = pool_rare_cells(first, second)
    if len(cells1) < 2:
        return 0.0, 0, 1.0
    n1, n2 = sum(cells1), sum(cells2)
    total = n1 + n2
    statistic = 0.0
    for o1, o2 in zip(cells1, cells2):
        share = (o1 + o2) / total
        e1, e2 = n1 * share, n2 * share
        statistic += (o1 - e1) ** 2 / e1 + (o2 - e2) ** 2 / e2
    dof = len(cells1) - 1
    return statistic, dof, chi2_sf(statistic, dof)


# ----------------------------------------------------------------------------- sampling


def _first_tokens(completion: list[int]) -> tuple[int, ...]:
    """The first NUM_TOKENS tokens, ENDED after an EOS (the engine stops a row there)."""
    tokens = list(completion[:NUM_TOKENS])
    if len(tokens) < NUM_TOKENS:
        tokens += [ENDED] * (NUM_TOKENS - len(tokens))
    return tuple(tokens)


def _batch_rows(tested, others: list, num_samples: int, batch_mix: bool) -> tuple[list, list[bool]]:
    """The rows of one run: ``num_samples`` of the tested prompt, with other prompts' rows interleaved."""
    rows, is_tested = [], []
    num_tested = num_other = 0
    while num_tested < num_samples:
        if batch_mix and len(rows) % OTHER_ROW_EVERY == OTHER_ROW_EVERY - 1:
            rows.append(others[num_other % len(others)])
            is_tested.append(False)
            num_other += 1
        else:
            rows.append(tested)
            is_tested.append(True)
            num_tested += 1
    return rows, is_tested


def _sample_first_tokens(model, tokenizer, head, rows: list, is_tested: list[bool], sampling: SamplingParams,
                         spec: SpecConfig, seed: int, step: int) -> list[tuple[int, ...]]:
    """Generates every row (in chunks) and returns the first tokens of the tested rows.

    NOTE: row ids are positions in the whole run, so chunking does not change any row's randomness,
    and each run has its own ``step``, so no two runs share noise.
    """
    out = []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        result = generate(
            model, tokenizer, chunk, mtp=head, sampling=sampling, spec=spec,
            seed=seed, step=step, row_ids=list(range(start, start + len(chunk))),
        )
        for tested, completion in zip(is_tested[start : start + CHUNK_ROWS], result.token_ids):
            if tested:
                out.append(_first_tokens(completion))
    return out


def _marginals(samples: list[tuple[int, ...]]) -> list[Counter]:
    return [Counter(s[i] for s in samples) for i in range(NUM_TOKENS)]


def _config_name(config: LosslessConfig) -> str:
    name = f"{config.mode} K={config.k} T={config.temperature:g}"
    if config.top_k:
        name += f" top-k={config.top_k}"
    if config.top_p < 1:
        name += f" top-p={config.top_p:g}"
    return name + (" mixed" if config.batch_mix else "")


def default_prompts(num: int = DEFAULT_NUM_PROMPTS, seed: int = 0) -> list[str]:
    """Embedded-task prompts with three terms (short, so the check is cheap); any tokenizer encodes them.

    Example: default_prompts(1) -> ["Q 13 + 2 + 7 = ?"] (numbers depend on the seed).
    """
    cfg = arith.ArithConfig(min_terms=3, max_terms=3)
    return [p.prompt for p in arith.make_problems(num, seed, cfg)]


def _check_inputs(head, prompts, num_samples: int, alpha: float, configs) -> None:
    if head is None:
        raise BebopError("check-lossless needs an MTP head: modes to and rs draft with it")
    if num_samples < 100:
        raise BebopError(f"num_samples must be >= 100 for a chi-square test, got {num_samples}")
    if not 0 < alpha < 1:
        raise BebopError(f"alpha must lie in (0, 1), got {alpha}")
    if not prompts:
        raise BebopError("no prompts given")
    if any(c.batch_mix for c in configs) and len(prompts) < 2:
        raise BebopError("batch-mix checks need at least two prompts: the first is tested, the rest are mixed in")
    for c in configs:
        if c.mode not in ("to", "rs") or c.k < 1 or c.temperature <= 0:
            raise BebopError(f"bad lossless config {c}: mode to|rs, k >= 1 and temperature > 0")


def run_lossless_checks(
    model,
    tokenizer,
    head,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int = 0,
    prompts: list[str] | list[list[int]] | None = None,
    alpha: float = DEFAULT_ALPHA,
    *,
    configs: tuple[LosslessConfig, ...] = LOSSLESS_CONFIGS,
    show_progress: bool = False,
) -> list[LosslessCheck]:
    """Compares speculative with plain sampling for every config and each of the first NUM_TOKENS tokens.

    Args:
        model: an HF causal LM (eval mode), the target.
        tokenizer: its tokenizer (``encode`` for text prompts, ``decode``, ``eos_token_id``).
        head: an ``MtpHead`` on ``model``.
        num_samples: rows per sample (plain and speculative each); see the module docstring for time.
        seed: run seed; run i (plain references first, then configs) uses step i, so runs are independent.
        prompts: texts or token-id lists; the first is tested, the others are mixed into its batches.
            None = ``default_prompts()``.
        alpha: false-alarm odds per check.
        configs: the speculative settings (default ``LOSSLESS_CONFIGS``).
        show_progress: a progress bar over the runs.

    Returns:
        One ``LosslessCheck`` per (config, token), in config order.
    """
    prompts = list(prompts) if prompts is not None else default_prompts()
    _check_inputs(head, prompts, num_samples, alpha, configs)
    tested, others = prompts[0], prompts[1:]
    plain_keys = list(dict.fromkeys(c.sampling_key for c in configs))
    runs = [("none", key, None) for key in plain_keys] + [("spec", c.sampling_key, c) for c in configs]
    plain: dict[tuple, list[Counter]] = {}
    checks: list[LosslessCheck] = []
    for step, (kind, key, config) in enumerate(progress(runs, total=len(runs), desc="check-lossless",
                                                        enabled=show_progress)):
        temperature, top_k, top_p = key
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=NUM_TOKENS)
        spec = SpecConfig(mode="none") if config is None else SpecConfig(mode=config.mode, speculate_k=config.k)
        rows, is_tested = _batch_rows(tested, others, num_samples, config is not None and config.batch_mix)
        samples = _sample_first_tokens(model, tokenizer, head, rows, is_tested, sampling, spec, seed, step)
        if config is None:
            plain[key] = _marginals(samples)
            continue
        for i, (spec_counts, plain_counts) in enumerate(zip(_marginals(samples), plain[key])):
            statistic, dof, p_value = two_sample_chi2(spec_counts, plain_counts)
            checks.append(LosslessCheck(
                name=f"{_config_name(config)}, token {i + 1}", mode=config.mode, k=config.k,
                temperature=temperature, top_k=top_k, top_p=top_p, statistic=statistic, dof=dof,
                p_value=p_value, passed=p_value > alpha, token=i + 1, batch_mix=config.batch_mix, alpha=alpha,
            ))
    return checks


# ----------------------------------------------------------------------------- report


def false_alarm_odds(alpha: float, num_checks: int) -> float:
    """Chance that at least one of ``num_checks`` checks fails by chance: 1 - (1 - alpha)^m.

    Example: false_alarm_odds(1e-3, 21) ~= 0.0208.
    """
    return 1.0 - (1.0 - alpha) ** num_checks


def format_lossless_table(checks: list[LosslessCheck]) -> str:
    """A markdown table of the checks, a summary line, and a last line stating the false-alarm odds."""
    if not checks:
        return "No lossless checks were run."
    lines = [
        "| check | mode | K | T | top-k | top-p | chi2 | dof | p-value | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        top_k = str(c.top_k) if c.top_k else "off"
        top_p = f"{c.top_p:g}" if c.top_p < 1 else "off"
        lines.append(
            f"| {c.name} | {c.mode} | {c.k} | {c.temperature:g} | {top_k} | {top_p} | {c.statistic:.2f} | "
            f"{c.dof} | {c.p_value:.3g} | {'pass' if c.passed else 'FAIL'} |"
        )
    alpha = max(c.alpha for c in checks)
    m = len(checks)
    num_failed = sum(not c.passed for c in checks)
    lines.append("")
    lines.append(f"{m - num_failed} of {m} checks passed.")
    lines.append(
        f"False-alarm odds: each check fails by chance with probability alpha = {alpha:g} when the sampler is "
        f"exact, so with m = {m} checks the chance of at least one false alarm is 1 - (1 - {alpha:g})^{m} = "
        f"{false_alarm_odds(alpha, m):.2%}."
    )
    return "\n".join(lines)

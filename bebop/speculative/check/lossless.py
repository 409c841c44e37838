"""Lossless checks: does speculative sampling, with *your* model and head, sample exactly as plain sampling?

Behind ``bebop check-lossless``. For one prompt (the first of ``prompts``), ``num_samples`` rows are
generated with plain sampling and ``num_samples`` with speculative sampling, and their token
distributions are compared with two-sample chi-square tests (Pearson's test of homogeneity on a
2 x C table of counts). The speculative settings span both modes (``to``, ``rs``), K = 1 and 3,
temperatures 1.0 and 0.7, one top-k/top-p setting, and batch mixes (the tested prompt's rows
interleaved with rows of the other prompts, so padding, ragged caches and rows finishing at
different steps are exercised).

What is compared (``CHECK_KINDS``; each kind maps one setting's samples to checks, so another
comparison is one more entry):

- ``marginal``: the marginal of every generated token 1 .. 3K+3. Token 1 comes from the prefill,
  the first verify step emits at most K+1 tokens and each later one at most K+1 more, so token
  3K+3 is always drawn at the third verify step or later: a defect that only shows after a
  rollback (a rejected draft's KV entry left behind, noise reused across steps) reaches it.
- ``joint``: the joint of tokens K+2 and K+3, a pair that straddles the boundary between the first
  and the second verify step whenever the first step accepted all K drafts (K+2 is then its
  bonus token) and lies inside or across later steps otherwise.

A check whose tokens all fall in one cell after pooling (dof 0) compared nothing: it is reported
as "uninformative", not as a pass. The run fails when an informative check fails or when fewer
than half the checks are informative (the prompts' continuations are too nearly deterministic
to test anything). The default prompts are five-term problems of the embedded task, whose
completions choose an opener, which term to add next, a connective and a verb, so most of the
first 3K+3 tokens have several likely values.

False-alarm odds: each informative check fails by chance with probability ``alpha`` when the
sampler is exact, so with m informative checks the chance of at least one false alarm is
1 - (1 - alpha)^m (at most m * alpha by the union bound, which holds although checks share
samples). With the defaults, alpha = 3e-4 and at most m = 73 checks (12 marginals + 1 joint for
each K = 3 setting, 6 + 1 for each K = 1 setting): at most 2.2%. With ``verify="block"``
(``BLOCK_LOSSLESS_CONFIGS``, block verification in mode rs) at most m = 49 checks: at most 1.5%. A failing check is evidence only
if it fails again with another seed or if its p-value is far below alpha (a broken sampler
typically gives p < 1e-10).

Runtime: 11 * num_samples rows (3 plain references, 7 speculative settings, two of which add a
half-size share of other prompts' rows) of up to 3K+3 = 12 tokens; cost grows with rows x tokens.
Power: at the default a check has even odds of catching a total-variation shift of about 3%
spread evenly over 10 cells (sqrt(9 / num_samples)); shifts concentrated on rare tokens are
caught sooner.

Deviations from a textbook goodness-of-fit test:
    1) Two samples, not one sample against exact probabilities: the plain distribution of token i
       is a mixture over tokens 1..i-1 that would need V^(i-1) forward passes to enumerate. The
       engine's own tests (tests/speculative/test_engine.py) do enumerate it on a tiny vocabulary.
    2) Rare tokens (or token pairs) are pooled into one "other" cell so every cell expects
       >= MIN_EXPECTED counts in both samples (the chi-square approximation needs it); a row that
       ended (EOS) before token i counts as its own cell.
    3) Token 1 is drawn by the same prefill code in every mode, so its checks test the batch
       plumbing (padding, mixes) rather than verification.
    4) The chi-square survival function is computed in ``bebop.speculative.check.chi2`` (regularized upper
       incomplete gamma), so scipy stays a development-only dependency.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from bebop.speculative.check.chi2 import MIN_EXPECTED, chi2_sf, pool_rare_cells, two_sample_chi2  # noqa: F401 (re-exported)
from bebop.speculative.settings import SamplingParams, SpecConfig, settings_problems
from bebop.task import arith
from bebop.utils.io import BebopError
from bebop.utils.progress import progress

VERIFY_STEPS_REACHED = 3  # the last checked token is always drawn at this verify step or later
DEFAULT_NUM_SAMPLES = 10_000  # rows per sample (plain and speculative each)
DEFAULT_ALPHA = 3e-4  # false-alarm odds per check: about 2% over the default <= 73 checks
CHUNK_ROWS = 4096  # rows per generate call: bounds cache memory, keeps the working set small
OTHER_ROW_EVERY = 3  # in a batch mix, every third row belongs to another prompt
ENDED = -1  # the "token" of a row that emitted EOS before position i
DEFAULT_NUM_PROMPTS = 4  # the tested prompt and three mix partners
DEFAULT_PROMPT_TERMS = 5  # five terms to add: many choices (opener, next term, connective, verb) early on
MIN_INFORMATIVE_SHARE = 0.5  # fewer informative checks than this share fails the run: nothing was tested


@dataclass(frozen=True)
class LosslessConfig:
    """One speculative setting compared with plain sampling at the same temperature/top-k/top-p."""

    mode: str  # to | rs
    speculate_k: int  # K, drafts verified per target pass
    temperature: float  # > 0: exactness is about sampling; greedy is pinned by the engine's tests
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    batch_mix: bool = False  # interleave the tested prompt's rows with rows of the other prompts
    verify: str = "token"  # token | block (bebop.speculative.block; mode rs only)

    @property
    def sampling_key(self) -> tuple[float, int, float]:
        return (self.temperature, self.top_k, self.top_p)

    @property
    def num_tokens(self) -> int:
        """Tokens generated and checked: 3K + 3, so the last is drawn at the third verify step or later."""
        return VERIFY_STEPS_REACHED * (self.speculate_k + 1)

    @property
    def joint_pair(self) -> tuple[int, int]:
        """Tokens (K+2, K+3): across the first verify boundary when step 1 accepted every draft."""
        return (self.speculate_k + 2, self.speculate_k + 3)


LOSSLESS_CONFIGS = (  # every mode meets both K, both temperatures, top-k/top-p and a batch mix
    LosslessConfig("rs", 3, 1.0),
    LosslessConfig("to", 3, 1.0),
    LosslessConfig("rs", 1, 0.7),
    LosslessConfig("to", 1, 0.7),
    LosslessConfig("rs", 3, 1.0, top_k=20, top_p=0.9, batch_mix=True),
    LosslessConfig("to", 1, 1.0, top_k=20, top_p=0.9),
    LosslessConfig("to", 3, 0.7, batch_mix=True),
)
# Block verification (``--verify block``) is rs only: K = 2 and 3, both temperatures, top-k/top-p, a batch mix.
BLOCK_LOSSLESS_CONFIGS = (
    LosslessConfig("rs", 3, 1.0, verify="block"),
    LosslessConfig("rs", 3, 0.7, verify="block"),
    LosslessConfig("rs", 3, 1.0, top_k=20, top_p=0.9, batch_mix=True, verify="block"),
    LosslessConfig("rs", 2, 0.7, top_k=20, top_p=0.9, verify="block"),
)
# Another engine (``--backend vllm``) runs one K per engine start, so its settings share K = 3 and
# group by mode: three engine starts (plain, rs, to) cover all of them.
BACKEND_LOSSLESS_CONFIGS = (
    LosslessConfig("rs", 3, 1.0),
    LosslessConfig("rs", 3, 0.7),
    LosslessConfig("rs", 3, 1.0, top_k=20, top_p=0.9, batch_mix=True),
    LosslessConfig("to", 3, 1.0),
    LosslessConfig("to", 3, 0.7, batch_mix=True),
)


@dataclass(frozen=True)
class LosslessCheck:
    """One two-sample chi-square test: speculative vs plain distribution of one token (or token pair)."""

    name: str  # e.g. "rs K=3 T=1 top-k=20 top-p=0.9 mixed, token 2"
    mode: str  # to | rs
    speculate_k: int  # K (0 for plain sampling)
    temperature: float  # of the target (q is drawn at the same temperature)
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    statistic: float  # Pearson's chi-square
    dof: int  # cells - 1 (0: both samples are one token, nothing to compare; p = 1)
    p_value: float  # P(chi2_dof >= statistic) under exactness
    passed: bool  # p_value > alpha (true for an uninformative check, which cannot fail)
    token: int = 1  # which generated token, 1-based (the first of ``tokens``)
    batch_mix: bool = False  # the speculative rows were mixed with other prompts' rows
    alpha: float = DEFAULT_ALPHA  # the false-alarm odds this check was run at
    kind: str = "marginal"  # which entry of CHECK_KINDS made it
    tokens: tuple[int, ...] = ()  # the generated tokens compared (1-based): (i,) or a joint (i, j)

    @property
    def informative(self) -> bool:
        """Compared something: at least two cells after pooling (dof >= 1)."""
        return self.dof >= 1

    @property
    def result(self) -> str:
        return "uninformative" if not self.informative else "pass" if self.passed else "FAIL"


# ----------------------------------------------------------------------------- sampling


def _leading_tokens(completion: list[int], num: int) -> tuple[int, ...]:
    """The first ``num`` tokens, ENDED after an EOS (the engine stops a row there)."""
    tokens = list(completion[:num])
    return tuple(tokens + [ENDED] * (num - len(tokens)))


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


def _sample_leading_tokens(backend, rows: list, is_tested: list[bool], sampling: SamplingParams,
                           spec: SpecConfig, seed: int, step: int) -> list[tuple[int, ...]]:
    """Generates every row (in chunks) with a rollout backend; the leading ``max_new_tokens`` tokens of tested rows.

    NOTE: row ids are positions in the whole run, so chunking does not change any row's randomness,
    and each run has its own ``step``, so no two runs share noise.
    """
    out = []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        result = backend.rollout(chunk, sampling, spec, seed=seed, step=step, first_row=start)
        for tested, completion in zip(is_tested[start : start + CHUNK_ROWS], result.token_ids):
            if tested:
                out.append(_leading_tokens(completion, sampling.max_new_tokens))
    return out


# ----------------------------------------------------------------------------- check kinds


@dataclass(frozen=True)
class CheckInputs:
    """What a check kind compares: one speculative setting's samples and the plain samples at its sampling."""

    config: LosslessConfig
    spec: list[tuple[int, ...]]  # (num_samples,) leading tokens of the speculative rows, config.num_tokens each
    plain: list[tuple[int, ...]]  # (num_samples,) leading tokens of plain rows, at least config.num_tokens each
    alpha: float  # false-alarm odds per check
    reference: str = ""  # which plain sampler ``plain`` came from, when there are several (e.g. "vLLM plain")


def _chi2_check(inputs: CheckInputs, kind: str, tokens: tuple[int, ...], spec: Counter, plain: Counter,
                label: str) -> LosslessCheck:
    c = inputs.config
    statistic, dof, p_value = two_sample_chi2(spec, plain)
    against = f" vs {inputs.reference}" if inputs.reference else ""
    return LosslessCheck(
        name=f"{_config_name(c)}{against}, {label}", mode=c.mode, speculate_k=c.speculate_k, temperature=c.temperature, top_k=c.top_k,
        top_p=c.top_p, statistic=statistic, dof=dof, p_value=p_value, passed=p_value > inputs.alpha,
        token=tokens[0], batch_mix=c.batch_mix, alpha=inputs.alpha, kind=kind, tokens=tokens,
    )


def marginal_checks(inputs: CheckInputs) -> list[LosslessCheck]:
    """The marginal of each generated token 1 .. 3K+3."""
    return [_chi2_check(inputs, "marginal", (i,), Counter(s[i - 1] for s in inputs.spec),
                        Counter(s[i - 1] for s in inputs.plain), f"token {i}")
            for i in range(1, inputs.config.num_tokens + 1)]


def joint_checks(inputs: CheckInputs) -> list[LosslessCheck]:
    """The joint of tokens (K+2, K+3), which straddle the first verify boundary on fully accepted rows."""
    i, j = inputs.config.joint_pair
    spec = Counter((s[i - 1], s[j - 1]) for s in inputs.spec)
    plain = Counter((s[i - 1], s[j - 1]) for s in inputs.plain)
    return [_chi2_check(inputs, "joint", (i, j), spec, plain, f"tokens {i} & {j} (joint)")]


CHECK_KINDS: dict[str, Callable[[CheckInputs], list[LosslessCheck]]] = {
    "marginal": marginal_checks,
    "joint": joint_checks,
}


def lossless_configs(verify: str = "token") -> tuple[LosslessConfig, ...]:
    """The engine's default settings for a verifier: LOSSLESS_CONFIGS (token) or BLOCK_LOSSLESS_CONFIGS (block)."""
    return BLOCK_LOSSLESS_CONFIGS if verify == "block" else LOSSLESS_CONFIGS


def _config_name(config: LosslessConfig) -> str:
    name = f"{config.mode}{' block' if config.verify == 'block' else ''} K={config.speculate_k} T={config.temperature:g}"
    if config.top_k:
        name += f" top-k={config.top_k}"
    if config.top_p < 1:
        name += f" top-p={config.top_p:g}"
    return name + (" mixed" if config.batch_mix else "")


def default_prompts(num: int = DEFAULT_NUM_PROMPTS, seed: int = 0) -> list[str]:
    """Embedded-task prompts with five terms, whose completions branch early; any tokenizer encodes them.

    A completion picks an opener, which of the five terms to add first, a connective, the next
    term and a verb before its first running sum, so most of the first 3K+3 tokens have several
    likely values even under a well-trained policy.

    Example: default_prompts(1) -> ["Q 14 + 2 + 9 + 17 + 16 = ?"] (numbers depend on the seed).
    """
    cfg = arith.ArithConfig(min_terms=DEFAULT_PROMPT_TERMS, max_terms=DEFAULT_PROMPT_TERMS)
    return [p.prompt for p in arith.make_problems(num, seed, cfg)]


MAX_UNKNOWN_SHARE = 0.5  # a tested prompt mostly of the unknown token tests a prompt the model never sees in use


def check_prompt_known(tokenizer, prompt, defaults: bool) -> None:
    """Raises BebopError (one line) when the tested prompt (text or chat messages) encodes to more than
    MAX_UNKNOWN_SHARE unknown tokens: its continuations say little about the model on its own text (the
    embedded task's prompts, ``defaults``, to a foreign tokenizer). Tokenizers without an unknown token pass.

    Example: with a word-level tokenizer that knows "a" and "b" only, "Q 14 + 2 = ?" is refused.
    """
    from bebop.utils.tokens import encode_prompt

    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return
    special = set(getattr(tokenizer, "all_special_ids", [])) - {unk}
    text_ids = [t for t in encode_prompt(tokenizer, prompt) if t not in special]  # NOTE: BOS is not the text
    num_unknown = sum(t == unk for t in text_ids)
    if text_ids and num_unknown > MAX_UNKNOWN_SHARE * len(text_ids):
        fix = ("these are the embedded task's prompts, not your model's text: give --prompts" if defaults
               else "give --prompts with text of your model's own domain")
        raise BebopError(f"the tested prompt {_describe_prompt(prompt)} is {num_unknown} of {len(text_ids)} "
                         f"unknown tokens to this tokenizer, so the check would test little; {fix}")


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
        problems = settings_problems(SpecConfig(c.mode, c.speculate_k, verify=c.verify),
                                     SamplingParams(c.temperature, c.top_k, c.top_p), greedy_ok=False, auto_ok=False)
        if c.mode == "none":
            problems.insert(0, "mode must be to or rs (the check compares them with plain sampling)")
        if problems:
            raise BebopError(f"bad lossless config {c}: " + "; ".join(problems))


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
    kinds: tuple[str, ...] = tuple(CHECK_KINDS),
    show_progress: bool = False,
    backend=None,
    references: dict | None = None,
) -> list[LosslessCheck]:
    """Compares speculative with plain sampling for every config and every check kind.

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
        kinds: names in ``CHECK_KINDS`` to run, in this order for each config.
        show_progress: a progress bar over the runs.
        backend: the ``bebop.rollout`` backend whose speculative sampling is judged (default: Bebop's
            engine on model and head).
        references: plain samplers to compare with, by label (e.g. {"vLLM plain": ..., "Bebop plain": ...});
            default: ``backend``'s own plain sampling, unlabelled. Each config is checked against each.

    Returns:
        The checks of each config in config order: per kind, as that kind lists them (marginals
        by token, then the joint).
    """
    prompts = list(prompts) if prompts is not None else default_prompts()
    _check_inputs(head, prompts, num_samples, alpha, configs)
    if unknown := [k for k in kinds if k not in CHECK_KINDS]:
        raise BebopError(f"unknown check kind(s) {', '.join(unknown)}; choose from {', '.join(CHECK_KINDS)}")
    if backend is None:
        from bebop.rollout.engine import EngineBackend

        backend = EngineBackend(model, tokenizer, head)
    references = references if references is not None else {"": backend}
    tested, others = prompts[0], prompts[1:]
    plain_keys = list(dict.fromkeys(c.sampling_key for c in configs))
    # A plain reference generates as many tokens as the deepest setting at its temperature/top-k/top-p needs.
    runs = [(key, None, max(c.num_tokens for c in configs if c.sampling_key == key), label)
            for label in references for key in plain_keys]
    runs += [(c.sampling_key, c, c.num_tokens, None) for c in configs]
    plain: dict[tuple, list[tuple[int, ...]]] = {}
    checks: list[LosslessCheck] = []
    for step, (key, config, num_tokens, label) in enumerate(progress(runs, total=len(runs), desc="check-lossless",
                                                                      enabled=show_progress)):
        temperature, top_k, top_p = key
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=num_tokens)
        spec = SpecConfig(mode="none") if config is None else SpecConfig(mode=config.mode, speculate_k=config.speculate_k,
                                                                          verify=config.verify)
        rows, is_tested = _batch_rows(tested, others, num_samples, config is not None and config.batch_mix)
        sampler = references[label] if config is None else backend
        try:
            samples = _sample_leading_tokens(sampler, rows, is_tested, sampling, spec, seed, step)
        except (RuntimeError, ValueError) as e:  # NOTE: another engine crashing on a setting fails that setting
            if config is None or sampler.name == "engine":
                raise
            checks.append(_crash_check(config, e, alpha))
            sampler.close()  # the next setting starts a fresh engine
            continue
        if config is None:
            plain[label, key] = samples
            continue
        for ref in references:
            inputs = CheckInputs(config, samples, plain[ref, key], alpha, ref)
            for kind in kinds:
                checks.extend(CHECK_KINDS[kind](inputs))
    return checks


def _crash_check(config: LosslessConfig, error: Exception, alpha: float) -> LosslessCheck:
    """A failed check standing for a setting whose sampling raised (e.g. an index out of bounds in the engine)."""
    message = (str(error).strip().splitlines() or [type(error).__name__])[-1][:160]
    return LosslessCheck(
        name=f"{_config_name(config)}, sampling raised {type(error).__name__}: {message}", mode=config.mode,
        speculate_k=config.speculate_k, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        statistic=float("nan"), dof=1, p_value=0.0, passed=False, batch_mix=config.batch_mix, alpha=alpha,
        kind="crash",
    )


# ----------------------------------------------------------------------------- report


def false_alarm_odds(alpha: float, num_checks: int) -> float:
    """Chance that at least one of ``num_checks`` checks fails by chance: 1 - (1 - alpha)^m.

    Example: false_alarm_odds(1e-3, 21) ~= 0.0208.
    """
    return 1.0 - (1.0 - alpha) ** num_checks


@dataclass(frozen=True)
class LosslessSummary:
    """The verdict of a set of checks."""

    num_checks: int
    num_informative: int  # dof >= 1
    num_failed: int  # informative checks with p <= alpha
    alpha: float  # the largest per-check alpha

    @property
    def enough_informative(self) -> bool:
        return self.num_informative >= MIN_INFORMATIVE_SHARE * self.num_checks

    @property
    def passed(self) -> bool:
        """No informative check failed and at least half the checks were informative."""
        return self.num_failed == 0 and self.enough_informative and self.num_checks > 0


def summarize_checks(checks: list[LosslessCheck]) -> LosslessSummary:
    informative = [c for c in checks if c.informative]
    return LosslessSummary(len(checks), len(informative), sum(not c.passed for c in informative),
                           max((c.alpha for c in checks), default=DEFAULT_ALPHA))


def _describe_prompt(prompt) -> str:
    return repr(prompt) if isinstance(prompt, str) else "token ids " + repr(list(prompt))


def format_lossless_table(checks: list[LosslessCheck], prompts: list | None = None) -> str:
    """The prompts used (if given), a markdown table of the checks, the summary, and the false-alarm odds."""
    if not checks:
        return "No lossless checks were run."
    lines = []
    if prompts:
        others = ", ".join(_describe_prompt(p) for p in prompts[1:]) or "none"
        lines += [f"Tested prompt: {_describe_prompt(prompts[0])}; mixed into batches: {others}.", ""]
    lines += [
        "| check | mode | K | T | top-k | top-p | chi2 | dof | p-value | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        top_k = str(c.top_k) if c.top_k else "off"
        top_p = f"{c.top_p:g}" if c.top_p < 1 else "off"
        lines.append(
            f"| {c.name} | {c.mode} | {c.speculate_k} | {c.temperature:g} | {top_k} | {top_p} | {c.statistic:.2f} | "
            f"{c.dof} | {c.p_value:.3g} | {c.result} |"
        )
    s = summarize_checks(checks)
    m, alpha = s.num_informative, s.alpha
    lines.append("")
    failed = [c for c in checks if c.informative and not c.passed]
    if failed:
        configs = list(dict.fromkeys(c.name.split(", ")[0] for c in failed))
        lines.append(f"FAILING configurations ({len(configs)}): " + "; ".join(configs) + ".")
    lines.append(f"{s.num_checks} checks: {m} informative, {s.num_checks - m} uninformative (dof 0: every sample in "
                 f"one cell, nothing compared); {m - s.num_failed} of {m} informative checks passed.")
    if not s.enough_informative:
        lines.append(f"FAIL: fewer than {MIN_INFORMATIVE_SHARE:.0%} of the checks are informative, so this run "
                     "tested little; use prompts whose continuations are less deterministic (--prompts).")
    lines.append(
        f"False-alarm odds: each informative check fails by chance with probability alpha = {alpha:g} when the "
        f"sampler is exact, so with m = {m} informative checks the chance of at least one false alarm is "
        f"1 - (1 - {alpha:g})^{m} = {false_alarm_odds(alpha, m):.2%}."
    )
    return "\n".join(lines)

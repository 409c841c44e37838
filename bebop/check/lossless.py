"""Lossless checks: does speculative sampling, with *your* model and head, sample exactly as plain sampling?

Behind ``bebop check-lossless``. For each tested prompt (the first ``num_tested_prompts`` of
``prompts``), ``num_samples`` rows are generated with plain sampling and ``num_samples`` with
speculative sampling, and their token
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
as "uninformative", not as a pass. The checks against one plain sample are one event; an event
that fails is retested on fresh samples under another seed, and the verdict
(``bebop.check.verdict``: lossless, not lossless or inconclusive, the command's exit code
``VERDICT_EXIT_CODES``) counts only an event that fails twice. The default prompts are five-term
problems of the embedded task, whose completions choose an opener, which term to add next, a
connective and a verb, so most of the first 3K+3 tokens have several likely values.

False-alarm odds: each informative check fails by chance with probability ``alpha`` when the
sampler is exact; with the defaults (alpha = 3e-4, per tested prompt 3 events of 26, 27 and 20
checks; 12 marginals + 1 joint for each K = 3 setting, 6 + 1 for each K = 1 setting) an exact
sampler fails some first check in about 6% of runs over three tested prompts, and fails an event
twice with odds at most sum_e (alpha * n_e)^2 = 0.05% (``false_alarm_bound``); bench/lossless_verdict.py
measures both by simulation. With ``verify="block"`` (``BLOCK_LOSSLESS_CONFIGS``, block verification
in mode rs) every setting has a plain sample of its own.

Runtime: 11 * num_samples rows per tested prompt (3 plain references, 7 speculative settings, two of
which add a half-size share of other prompts' rows) of up to 3K+3 = 12 tokens; cost grows with rows x tokens.
A retest redraws a failed event's plain sample and failing settings only (at most 4 runs).
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
    4) The chi-square survival function is computed in ``bebop.check.chi2`` (regularized upper
       incomplete gamma), so scipy stays a development-only dependency.
    5) Tested prompts are checked one after the other, each against its own plain sample, with the
       other prompts (tested or not) as its batch-mix partners.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from bebop.check.chi2 import MIN_EXPECTED, chi2_sf, pool_rare_cells, two_sample_chi2  # noqa: F401 (re-exported)
from bebop.check.config import ALPHA_CHECK, DEFAULT_ALPHA, DEFAULT_NUM_SAMPLES, NUM_SAMPLES_CHECK, TESTED_PROMPTS_CHECK
from bebop.check.verdict import (  # noqa: F401 (re-exported: the harness's results)
    VERDICT_EXIT_CODES,
    LosslessCheck,
    LosslessSummary,
    describe_prompt,
    false_alarm_odds,
    format_lossless_table,
    events_to_retest,
    retest_seed,
    summarize_checks,
)
from bebop.speculative.settings import SamplingParams, SpecConfig, head_problem, settings_problems
from bebop.task import arith
from bebop.utils.errors import BebopError
from bebop.utils.memory import check_memory, samples_bytes
from bebop.utils.progress import progress

VERIFY_STEPS_REACHED = 3  # the last checked token is always drawn at this verify step or later
CHUNK_ROWS = 4096  # rows per generate call: bounds cache memory, keeps the working set small
OTHER_ROW_EVERY = 3  # in a batch mix, every third row belongs to another prompt
ENDED = -1  # the "token" of a row that emitted EOS before position i
DEFAULT_NUM_PROMPTS = 4  # the tested prompt and three mix partners
DEFAULT_PROMPT_TERMS = 5  # five terms to add: many choices (opener, next term, connective, verb) early on


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
    num_drafts: int = 1  # chains per row (bebop.speculative.multidraft; mode rs, verify token)

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
# Several chains per row (``SpecConfig.num_drafts``) are rs with token-wise verification: n = 2 and 3, both
# temperatures, top-k/top-p, a batch mix.
MULTI_DRAFT_LOSSLESS_CONFIGS = (
    LosslessConfig("rs", 3, 1.0, num_drafts=2),
    LosslessConfig("rs", 2, 0.7, top_k=20, top_p=0.9, batch_mix=True, num_drafts=3),
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


# ----------------------------------------------------------------------------- sampling


def _leading_tokens(completions: list[list[int]], num: int) -> np.ndarray:  # (N, num)
    """The first ``num`` tokens of each completion, ENDED after an EOS (the engine stops a row there).

    Example: _leading_tokens([[4, 1], [4, 1, 5, 6]], 3) -> [[4, 1, ENDED], [4, 1, 5]].
    """
    if all(len(c) >= num for c in completions):
        return np.array([c[:num] for c in completions], dtype=np.int64).reshape(len(completions), num)
    out = np.full((len(completions), num), ENDED, dtype=np.int64)
    for r, completion in enumerate(completions):
        out[r, : min(len(completion), num)] = completion[:num]
    return out


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
                           spec: SpecConfig, seed: int, step: int) -> np.ndarray:  # (num tested rows, max_new_tokens)
    """Generates every row (in chunks) with a rollout backend; the leading ``max_new_tokens`` tokens of tested rows.

    NOTE: row ids are positions in the whole run, so chunking does not change any row's randomness,
    and each run has its own ``step``, so no two runs share noise.
    """
    out = []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        result = backend.rollout(chunk, sampling, spec, seed=seed, step=step, first_row=start)
        tested = [c for t, c in zip(is_tested[start : start + CHUNK_ROWS], result.token_ids) if t]
        out.append(_leading_tokens(tested, sampling.max_new_tokens))
    return np.concatenate(out)


# ----------------------------------------------------------------------------- check kinds


@dataclass(frozen=True)
class CheckInputs:
    """What a check kind compares: one speculative setting's samples and the plain samples at its sampling."""

    config: LosslessConfig
    spec: np.ndarray  # (num_samples, config.num_tokens) leading tokens of the speculative rows
    plain: np.ndarray  # (num_samples, >= config.num_tokens) leading tokens of plain rows
    alpha: float  # false-alarm odds per check
    reference: str = ""  # which plain sampler ``plain`` came from, when there are several (e.g. "vLLM plain")
    prompt: int = 0  # the tested prompt's index; named in the check when several are tested
    num_tested: int = 1  # tested prompts in the run
    retest: bool = False  # fresh samples of an event that failed on its first ones


def _chi2_check(inputs: CheckInputs, kind: str, tokens: tuple[int, ...], spec: Counter, plain: Counter,
                label: str) -> LosslessCheck:
    c = inputs.config
    statistic, dof, p_value = two_sample_chi2(spec, plain)
    against = f" vs {inputs.reference}" if inputs.reference else ""
    which = f", prompt {inputs.prompt + 1}" if inputs.num_tested > 1 else ""
    return LosslessCheck(
        name=f"{_config_name(c)}{against}{which}, {label}", mode=c.mode, speculate_k=c.speculate_k,
        temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, statistic=statistic, dof=dof, p_value=p_value,
        passed=p_value > inputs.alpha, token=tokens[0], batch_mix=c.batch_mix, alpha=inputs.alpha, kind=kind,
        tokens=tokens, prompt=inputs.prompt, reference=inputs.reference, retest=inputs.retest,
    )


def _counts(values: np.ndarray) -> Counter:
    """How often each value occurs. Example: _counts(np.array([3, 1, 3])) -> Counter({3: 2, 1: 1})."""
    cells, counts = np.unique(values, return_counts=True)
    return Counter(dict(zip(cells.tolist(), counts.tolist())))


def marginal_checks(inputs: CheckInputs) -> list[LosslessCheck]:
    """The marginal of each generated token 1 .. 3K+3."""
    return [_chi2_check(inputs, "marginal", (i,), _counts(inputs.spec[:, i - 1]), _counts(inputs.plain[:, i - 1]),
                        f"token {i}") for i in range(1, inputs.config.num_tokens + 1)]


def joint_checks(inputs: CheckInputs) -> list[LosslessCheck]:
    """The joint of tokens (K+2, K+3), which straddle the first verify boundary on fully accepted rows."""
    i, j = inputs.config.joint_pair
    base = int(max(inputs.spec[:, j - 1].max(), inputs.plain[:, j - 1].max())) + 2  # NOTE: ENDED (-1) maps to 0

    def pairs(samples: np.ndarray) -> Counter:  # one integer per (token i, token j) pair
        return _counts((samples[:, i - 1] + 1) * base + samples[:, j - 1] + 1)

    return [_chi2_check(inputs, "joint", (i, j), pairs(inputs.spec), pairs(inputs.plain), f"tokens {i} & {j} (joint)")]


CHECK_KINDS: dict[str, Callable[[CheckInputs], list[LosslessCheck]]] = {
    "marginal": marginal_checks,
    "joint": joint_checks,
}


def lossless_configs(verify: str = "token", num_drafts: int = 1) -> tuple[LosslessConfig, ...]:
    """The engine's default settings for a verifier: LOSSLESS_CONFIGS (token), BLOCK_LOSSLESS_CONFIGS (block), or
    with ``num_drafts`` > 1 MULTI_DRAFT_LOSSLESS_CONFIGS, each at that many chains per row."""
    if num_drafts > 1:
        return tuple(replace(c, num_drafts=num_drafts) for c in MULTI_DRAFT_LOSSLESS_CONFIGS)
    return BLOCK_LOSSLESS_CONFIGS if verify == "block" else LOSSLESS_CONFIGS


def _config_name(config: LosslessConfig) -> str:
    name = f"{config.mode}{' block' if config.verify == 'block' else ''} K={config.speculate_k} T={config.temperature:g}"
    if config.num_drafts > 1:
        name += f" n={config.num_drafts}"
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
        raise BebopError(f"the tested prompt {describe_prompt(prompt)} is {num_unknown} of {len(text_ids)} "
                         f"unknown tokens to this tokenizer, so the check would test little; {fix}")


def _check_inputs(head, prompts, num_samples: int, alpha: float, configs, num_tested: int, num_plain: int) -> None:
    problems = [head_problem("rs", head is not None), NUM_SAMPLES_CHECK("num_samples", num_samples),
                ALPHA_CHECK("alpha", alpha), TESTED_PROMPTS_CHECK("num_tested_prompts", num_tested)]
    if problem := next((p for p in problems if p), None):
        raise BebopError(f"check-lossless: {problem}")
    if not prompts:
        raise BebopError("no prompts given")
    if any(c.batch_mix for c in configs) and len(prompts) < 2:
        raise BebopError("batch-mix checks need at least two prompts: the first is tested, the rest are mixed in")
    for c in configs:
        problems = settings_problems(SpecConfig(c.mode, c.speculate_k, verify=c.verify, num_drafts=c.num_drafts),
                                     SamplingParams(c.temperature, c.top_k, c.top_p), greedy_ok=False, auto_ok=False)
        if c.mode == "none":
            problems.insert(0, "mode must be to or rs (the check compares them with plain sampling)")
        if problems:
            raise BebopError(f"bad lossless config {c}: " + "; ".join(problems))
    # NOTE: the plain samples of one tested prompt are kept until its settings are checked
    kept = samples_bytes(num_samples * num_plain, max(c.num_tokens for c in configs))
    check_memory(kept, "cpu", f"{num_samples} samples per configuration", "lower --samples")


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
    num_tested_prompts: int = 1,
) -> list[LosslessCheck]:
    """Compares speculative with plain sampling for every tested prompt, config and check kind.

    Args:
        model: an HF causal LM (eval mode), the target.
        tokenizer: its tokenizer (``encode`` for text prompts, ``decode``, ``eos_token_id``).
        head: an ``MtpHead`` on ``model``.
        num_samples: rows per sample (plain and speculative each); see the module docstring for time.
        seed: run seed; run i (per tested prompt: plain references first, then configs) uses step i, so
            runs are independent.
        prompts: texts or token-id lists; the first ``num_tested_prompts`` are tested, each with the
            others mixed into its batches. None = ``default_prompts()``.
        alpha: false-alarm odds per check.
        configs: the speculative settings (default ``LOSSLESS_CONFIGS``).
        kinds: names in ``CHECK_KINDS`` to run, in this order for each config.
        show_progress: a progress bar over the runs.
        backend: the ``bebop.rollout`` backend whose speculative sampling is judged (default: Bebop's
            engine on model and head).
        references: plain samplers to compare with, by label (e.g. {"vLLM plain": ..., "Bebop plain": ...});
            default: ``backend``'s own plain sampling, unlabelled. Each config is checked against each.
        num_tested_prompts: how many prompts are tested (at most ``len(prompts)``).

    Returns:
        The checks of each tested prompt in order, and within it of each config in config order: per
        kind, as that kind lists them (marginals by token, then the joint).
    """
    prompts = list(prompts) if prompts is not None else default_prompts()
    references = references if references is not None else {"": None}
    plain_keys = list(dict.fromkeys(c.sampling_key for c in configs))
    _check_inputs(head, prompts, num_samples, alpha, configs, num_tested_prompts, len(references) * len(plain_keys))
    num_tested = min(num_tested_prompts, len(prompts))
    if unknown := [k for k in kinds if k not in CHECK_KINDS]:
        raise BebopError(f"unknown check kind(s) {', '.join(unknown)}; choose from {', '.join(CHECK_KINDS)}")
    if backend is None:
        from bebop.rollout.engine import EngineBackend

        backend = EngineBackend(model, tokenizer, head)
    references = {label: sampler or backend for label, sampler in references.items()}
    runs = _runs(configs, list(references), plain_keys, num_tested)
    checks = _sample_and_check(runs, prompts, num_samples, alpha, kinds, backend, references, seed, num_tested,
                               desc="check-lossless", show_progress=show_progress)
    if failed := events_to_retest(checks):  # NOTE: only a failure costs a retest
        again = [(step, run) for step, run in runs if _in_retest(run, failed)]
        checks += _sample_and_check(again, prompts, num_samples, alpha, kinds, backend, references,
                                    retest_seed(seed), num_tested, desc="check-lossless retest",
                                    show_progress=show_progress)
    return checks


def _in_retest(run: tuple, failed: dict[tuple, set[str]]) -> bool:
    """Whether a run is redrawn: the plain sample of a failed event, or a setting that failed in one."""
    index, key, config, _, label = run
    if config is None:
        return (index, label, *key) in failed
    return any(e[0] == index and e[2:] == key and _config_name(config) in names for e, names in failed.items())


def _sample_and_check(runs: list[tuple], prompts: list, num_samples: int, alpha: float, kinds: tuple[str, ...],
                      backend, references: dict, seed: int, num_tested: int, desc: str,
                      show_progress: bool) -> list[LosslessCheck]:
    """Draws every run's rows under ``seed`` and checks each speculative run against the plain runs drawn here.

    NOTE: a run keeps its step number in a retest, so a retest is the first run redrawn under another seed.
    """
    retest = desc.endswith("retest")
    plain: dict[tuple, np.ndarray] = {}
    checks: list[LosslessCheck] = []
    for step, (index, key, config, num_tokens, label) in progress(runs, total=len(runs), desc=desc,
                                                                  enabled=show_progress):
        temperature, top_k, top_p = key
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=num_tokens)
        spec = SpecConfig(mode="none") if config is None else SpecConfig(mode=config.mode, speculate_k=config.speculate_k,
                                                                          verify=config.verify,
                                                                          num_drafts=config.num_drafts)
        others = prompts[:index] + prompts[index + 1:]
        rows, is_tested = _batch_rows(prompts[index], others, num_samples, config is not None and config.batch_mix)
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
            plain = {k: v for k, v in plain.items() if k[0] == index}  # NOTE: the last prompt's samples are freed
            plain[index, label, key] = samples
            continue
        for ref in references:
            if (index, ref, key) in plain:
                inputs = CheckInputs(config, samples, plain[index, ref, key], alpha, ref, index, num_tested, retest)
                for kind in kinds:
                    checks.extend(CHECK_KINDS[kind](inputs))
    return checks


def _runs(configs, labels: list[str], plain_keys: list[tuple], num_tested: int) -> list[tuple]:
    """(step, (tested prompt, sampling key, config or None for a plain reference, tokens, reference label)) of
    every generation, in order: per tested prompt, its plain references, then its speculative settings. A plain
    reference generates as many tokens as the deepest setting at its temperature/top-k/top-p needs."""
    runs = [(key, None, max(c.num_tokens for c in configs if c.sampling_key == key), label)
            for label in labels for key in plain_keys]
    runs += [(c.sampling_key, c, c.num_tokens, None) for c in configs]
    return list(enumerate((index, *run) for index in range(num_tested) for run in runs))


def _crash_check(config: LosslessConfig, error: Exception, alpha: float) -> LosslessCheck:
    """A failed check standing for a setting whose sampling raised (e.g. an index out of bounds in the engine)."""
    message = (str(error).strip().splitlines() or [type(error).__name__])[-1][:160]
    return LosslessCheck(
        name=f"{_config_name(config)}, sampling raised {type(error).__name__}: {message}", mode=config.mode,
        speculate_k=config.speculate_k, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        statistic=float("nan"), dof=1, p_value=0.0, passed=False, batch_mix=config.batch_mix, alpha=alpha,
        kind="crash",
    )

"""Automatic choice of the verification mode and depth K (``--mode auto``, ``--speculate-k auto``).

Terms (K = speculation depth, R = rows decoding, p the target's distribution, q the draft's):
    alpha_j     acceptance at draft depth j given drafts 1..j-1 were accepted. Estimated by the mean
                of the counterfactual alpha_RS = sum min(p_j, q_j) and alpha_TO = p_j(argmax q_j) that
                the engine records at every kept draft position (``bebop.spec.stats``), whichever mode
                ran; at T = 0 by the accepted / reached counts (both rules are then greedy matching).
    E[L]        expected accepted drafts per verify step, sum_{j<=K} prod_{i<=j} alpha_i (arXiv
                2606.12370 Eq. 12; Leviathan et al. 2023); a verify step emits 1 + E[L] tokens.
    step cost   seconds of one engine decode step: plain_s for ``none``; K c_draft + c_verify(K) for
                ``to``/``rs``, modelled as a + b K from timed steps at two depths (``StepCosts``).
    predicted   tokens/s = R (1 + E[L]) / step cost (``none``: R / plain_s).

``generate_auto`` decodes in chunks, all kept: probe chunks at fixed settings (the deepest K, the
shallowest K, plain decoding; each timed by the engine and recording both alphas), then the rest
at the setting with the highest predicted tokens/s. An RL run (``bebop.rollout``) re-decides every
``auto_every`` steps the same way and updates the acceptance model from every rollout in between.

Exactness: every chunk is an ordinary exact ``generate`` call whose randomness (seed ^ chunk << 48)
is independent of the other chunks', and the setting of a chunk is a function of the tokens before
it and of timings only; each token is therefore drawn from p given its prefix, whatever was chosen,
and at T = 0 every chunk is greedy.

Deviations from the paper's speedup formula:
    1) Costs are whole engine decode steps (drafting, verify forward, verification, bookkeeping) as
       the engine times them (``GenerationResult.step_times``), not forwards alone: the overhead
       around the forwards decides the choice on a small model. Whole steps do not separate
       K c_draft from the verify pass's growth with K, so the model is linear, a + b K, fitted to
       the probed depths; ``to`` and ``rs`` share it (they differ only in sampling drafts from q).
    2) alpha_TO recorded while ``rs`` runs (and alpha_RS while ``to`` runs) is measured on the other
       rule's accepted prefixes, a small bias at depths >= 2.
    3) Depths with too few recorded positions are extrapolated conservatively (``Acceptance``).
    4) The prediction ignores a batch's tail (rows end at different steps, the batch decodes in
       lockstep), so it overestimates tokens/s at large B; ``bench/auto.py`` reports the error.
    5) Chunk boundaries cost one prefill each (the prompt plus the tokens so far), and the probe
       chunks run settings that may be slower than the chosen one.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import torch

from bebop.spec.engine import GenerationResult, SamplingParams, SpecConfig, generate
from bebop.spec.stats import SpecStats
from bebop.utils.io import BebopError

AUTO = "auto"  # the value of mode / speculate_k that asks for a choice
AUTO_MAX_K = 4  # deepest K that speculate_k auto considers
PROBE_SHARE = 12  # each probe chunk decodes max_new_tokens // PROBE_SHARE tokens (at least MIN_PROBE_TOKENS)
MIN_PROBE_TOKENS = 2  # a probe chunk shorter than this times too few steps
MIN_POSITIONS = 4.0  # weight of recorded positions below which a depth counts as unseen
UNSEEN_DECAY = 0.9  # alpha ratio per unseen depth when only depth 1 was seen (alpha never rises with depth here)
DECAY = 0.5  # weight kept by older acceptance evidence at each new decision (RL: the policy drifts)
CHUNK_SEED_SHIFT = 48  # chunk c of a call draws from seed ^ (c << 48): independent of the other chunks
RULES = ("rs", "to")  # acceptance rules, named as the modes that use them


def candidates(spec: SpecConfig) -> list[tuple[str, int]]:
    """The (mode, K) pairs a spec allows, K = 0 for ``none``; simplest first (ties keep the first).

    Example: candidates(SpecConfig("rs", "auto")) -> [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)].
    """
    modes = ("none", "to", "rs") if spec.mode == AUTO else (spec.mode,)
    ks = range(1, AUTO_MAX_K + 1) if spec.speculate_k == AUTO else (spec.speculate_k,)
    return [(m, 0) if m == "none" else (m, k) for m in modes for k in ((0,) if m == "none" else ks)]


def is_auto(spec: SpecConfig) -> bool:
    return spec.mode == AUTO or (spec.speculate_k == AUTO and spec.mode != "none")


def check_auto_spec(spec: SpecConfig) -> None:
    """Raises BebopError (one line) on a mode or K no choice could use."""
    if spec.mode not in ("none", "to", "rs", AUTO):
        raise BebopError(f"unknown mode {spec.mode!r}; choose one of none, to, rs, auto")
    k = spec.speculate_k
    if k != AUTO and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise BebopError(f"speculate_k must be an integer >= 1 or 'auto', got {k!r}")


def expected_accepted(alphas: list[float]) -> float:
    """E[L] = sum_j prod_{i<=j} alpha_i.

    Example: expected_accepted([0.5, 0.5]) = 0.5 + 0.25 = 0.75.
    """
    total, prod = 0.0, 1.0
    for a in alphas:
        prod *= a
        total += prod
    return total


@dataclass
class Acceptance:
    """Running per-depth acceptance of both rules: weighted sums of alpha and their weights."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in RULES})
    weights: list[float] = field(default_factory=list)  # (J,) recorded positions per depth

    def _grow(self, depth: int) -> None:
        while len(self.weights) < depth:
            self.weights.append(0.0)
            for rule in RULES:
                self.sums[rule].append(0.0)

    def add(self, depth: int, weight: float, alpha_rs: float, alpha_to: float) -> None:
        """Adds ``weight`` positions at ``depth`` (1-based) whose alphas sum to alpha_rs, alpha_to."""
        self._grow(depth)
        self.weights[depth - 1] += weight
        self.sums["rs"][depth - 1] += alpha_rs
        self.sums["to"][depth - 1] += alpha_to

    def observe(self, stats: SpecStats, greedy: bool) -> None:
        """Adds a call's kept draft positions (counterfactual alphas; accept counts at T = 0)."""
        if greedy:  # both rules accept iff argmax q = argmax p; the recorded alphas are T=1 numbers
            reached = [sum(stats.accept_length_hist[j:]) for j in range(stats.speculate_k)]
            for j, (n, a) in enumerate(zip(reached, stats.accepted_per_pos)):
                if n:
                    self.add(j + 1, n, a, a)
            return
        arrays = stats.token_arrays()
        for j in range(1, stats.speculate_k + 1):
            sel = arrays["position"] == j
            if sel.any():
                self.add(j, float(sel.sum()), float(arrays["alpha_rs"][sel].sum()), float(arrays["alpha_to"][sel].sum()))

    def decay(self, factor: float) -> None:
        self.weights = [w * factor for w in self.weights]
        self.sums = {r: [s * factor for s in v] for r, v in self.sums.items()}

    def alphas(self, rule: str, k: int) -> list[float]:
        """alpha_1..alpha_K of a rule; unseen depths extrapolated conservatively.

        A depth is seen when its positions weigh at least MIN_POSITIONS. Past the last seen depth J,
        alpha_j = alpha_J * rho^(j - J) with rho = min(1, alpha_J / alpha_{J-1}) (the last observed
        fall, never a rise), or UNSEEN_DECAY when only depth 1 was seen; nothing seen gives 0.

        Example: seen [0.8, 0.6] -> alphas(rule, 4) = [0.8, 0.6, 0.45, 0.3375].
        """
        seen = []
        for w, s in zip(self.weights, self.sums[rule]):
            if w < MIN_POSITIONS:
                break
            seen.append(s / w)
        if not seen:
            return [0.0] * k
        rho = min(1.0, seen[-1] / seen[-2]) if len(seen) >= 2 and seen[-2] > 0 else UNSEEN_DECAY
        return [seen[j] if j < len(seen) else seen[-1] * rho ** (j + 1 - len(seen)) for j in range(k)]


@dataclass
class StepCosts:
    """Seconds per engine decode step by K (0 = plain) at the rows measured, latest measurement each."""

    seconds: dict[int, float] = field(default_factory=dict)  # K -> median seconds per decode step
    rows: dict[int, float] = field(default_factory=dict)  # K -> median active rows of those steps

    def observe(self, k: int, step_times: list[tuple[int, float]]) -> None:
        if step_times:
            self.seconds[k] = statistics.median(s for _, s in step_times)
            self.rows[k] = statistics.median(r for r, _ in step_times)

    def line(self) -> tuple[float, float] | None:
        """(a, b) of step(K) = a + b K over the measured K >= 1 (least squares; b >= 0), or None."""
        points = sorted((k, s) for k, s in self.seconds.items() if k >= 1)
        if not points:
            return None
        if len(points) == 1:  # one depth measured: no slope to fit, only K itself is known
            return points[0][1], 0.0
        mean_k = sum(k for k, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        var = sum((k - mean_k) ** 2 for k, _ in points)
        b = max(0.0, sum((k - mean_k) * (s - mean_s) for k, s in points) / var)
        return mean_s - b * mean_k, b

    def step_seconds(self, k: int) -> float | None:
        """Predicted seconds of a step at depth k (0 = plain), or None when nothing predicts it."""
        if k == 0:
            return self.seconds.get(0)
        if k in self.seconds:
            return self.seconds[k]
        line = self.line()
        if line is None or len([j for j in self.seconds if j >= 1]) < 2:
            return None
        return line[0] + line[1] * k


def predict(mode: str, k: int, acceptance: Acceptance, costs: StepCosts, rows: float) -> float:
    """Predicted tokens/s of (mode, K) for ``rows`` decoding rows; 0 when the costs cannot say.

    Example: rs, K=2, alpha_RS = [0.5, 0.5], 0.01 s per step, 4 rows -> 4 * 1.75 / 0.01 = 700.
    """
    seconds = costs.step_seconds(0 if mode == "none" else k)
    if not seconds:
        return 0.0
    tokens = 1.0 if mode == "none" else 1.0 + expected_accepted(acceptance.alphas(mode, k))
    return rows * tokens / seconds


@dataclass
class Decision:
    """The chosen setting, its prediction and every candidate's."""

    mode: str
    speculate_k: int  # 0 for none
    predicted_tok_s: float
    predictions: dict[str, float]  # "none", "to3", "rs1", ... -> predicted tokens/s
    measured_tok_s: float = float("nan")  # tokens/s of the chunk decoded at the chosen setting

    def to_metrics(self) -> dict:
        return {"auto/mode": self.mode, "auto/speculate_k": self.speculate_k,
                "auto/predicted_tok_s": self.predicted_tok_s}


def config_name(mode: str, k: int) -> str:
    return mode if mode == "none" else f"{mode}{k}"


class AutoChooser:
    """The acceptance and cost models of one run; ``choose`` picks the best candidate."""

    def __init__(self) -> None:
        self.acceptance = Acceptance()
        self.costs = StepCosts()

    def observe(self, result: GenerationResult, mode: str, k: int, greedy: bool) -> None:
        """Learns from a call decoded at (mode, K): its step times and, when it drafted, its alphas."""
        self.costs.observe(0 if mode == "none" else k, result.step_times)
        if mode != "none":
            self.acceptance.observe(result.stats, greedy)

    def choose(self, options: list[tuple[str, int]], rows: float) -> Decision:
        """The candidate with the highest predicted tokens/s (the first of equals)."""
        predictions = {config_name(m, k): predict(m, k, self.acceptance, self.costs, rows) for m, k in options}
        mode, k = max(options, key=lambda c: predictions[config_name(*c)])
        return Decision(mode, k, predictions[config_name(mode, k)], predictions)


def probe_plan(options: list[tuple[str, int]], max_new_tokens: int) -> list[tuple[str, int, int]]:
    """Probe chunks (mode, K, tokens): the deepest and shallowest K (rs when allowed), then none.

    Example: probe_plan(candidates(SpecConfig("auto", "auto")), 48) -> [("rs", 4, 4), ("rs", 1, 4), ("none", 0, 4)].
    """
    tokens = max(MIN_PROBE_TOKENS, max_new_tokens // PROBE_SHARE)
    drafted = [(m, k) for m, k in options if m != "none"]
    plan = []
    if drafted:
        mode = "rs" if any(m == "rs" for m, _ in drafted) else "to"
        ks = sorted({k for _, k in drafted})
        plan += [(mode, k, tokens) for k in dict.fromkeys((ks[-1], ks[0]))]
    if ("none", 0) in options and len(options) > 1:
        plan.append(("none", 0, tokens))
    return plan


def generate_auto(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
    *,
    mtp=None,
    sampling: SamplingParams = SamplingParams(),
    spec: SpecConfig = SpecConfig(AUTO, AUTO),
    seed: int = 0,
    step: int = 0,
    row_ids: list[int] | None = None,
    chooser: AutoChooser | None = None,
) -> tuple[GenerationResult, Decision]:
    """``generate`` with the mode and/or K chosen on the fly: probe chunks, a decision, the rest.

    Args:
        model, tokenizer, prompts, mtp, sampling, seed, step, row_ids: as for ``generate``.
        spec: mode and/or speculate_k ``"auto"``; the other fields as for ``generate``.
        chooser: the run's models (RL keeps one across steps); a fresh one when None.

    Returns:
        ``(result, decision)``: every chunk's tokens in prompt order, the chunks' statistics merged
        (``SpecStats.merge(mixed_k=True)``; no ``log``), and the decision with its prediction and
        the tokens/s measured on the chunk decoded at the chosen setting.
    """
    check_auto_spec(spec)
    options = candidates(spec)
    if mtp is None and any(m != "none" for m, _ in options):
        raise BebopError(f"mode {spec.mode!r} needs an MTP head (--mtp)")
    chooser = chooser if chooser is not None else AutoChooser()
    chooser.acceptance.decay(DECAY)
    prompt_ids = [list(p) if not isinstance(p, str) else tokenizer.encode(p) for p in prompts]
    state = _Chunks(model, tokenizer, mtp, sampling, spec, seed, step, prompt_ids, row_ids)
    for mode, k, tokens in probe_plan(options, sampling.max_new_tokens):
        result = state.run(mode, k, tokens)
        if result is not None:
            chooser.observe(result, mode, k, sampling.temperature == 0)
    decision = chooser.choose(options, rows=max(len(state.active()), 1))
    start, before = time.perf_counter(), state.num_tokens()
    result = state.run(decision.mode, decision.speculate_k, sampling.max_new_tokens)
    if result is not None:
        chooser.observe(result, decision.mode, decision.speculate_k, sampling.temperature == 0)
        decision.measured_tok_s = (state.num_tokens() - before) / max(time.perf_counter() - start, 1e-9)
    return state.result(), decision


class _Chunks:
    """The rows' completions so far, extended one ``generate`` call (chunk) at a time."""

    def __init__(self, model, tokenizer, mtp, sampling, spec, seed, step, prompt_ids, row_ids):
        self.model, self.tokenizer, self.mtp, self.sampling, self.spec = model, tokenizer, mtp, sampling, spec
        self.seed, self.step, self.prompt_ids = seed, step, prompt_ids
        self.row_ids = list(row_ids) if row_ids is not None else list(range(len(prompt_ids)))
        self.outputs: list[list[int]] = [[] for _ in prompt_ids]
        self.finish = [""] * len(prompt_ids)
        self.stats = SpecStats()
        self.num_chunks = 0

    def active(self) -> list[int]:
        return [r for r, reason in enumerate(self.finish) if not reason]

    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    def run(self, mode: str, k: int, tokens: int) -> GenerationResult | None:
        """Decodes up to ``tokens`` more tokens of every active row at (mode, K); None if none is active."""
        active = self.active()
        if not active:
            return None
        budget = min(tokens, self.sampling.max_new_tokens - len(self.outputs[active[0]]))
        sampling = dataclasses.replace(self.sampling, max_new_tokens=budget)
        spec = dataclasses.replace(self.spec, mode=mode, speculate_k=max(k, 1))
        # NOTE: every unfinished row holds the same number of tokens (only EOS or a stop ends a row early).
        result = generate(self.model, self.tokenizer, [self.prompt_ids[r] + self.outputs[r] for r in active],
                          mtp=self.mtp if mode != "none" else None, sampling=sampling, spec=spec,
                          seed=self.seed ^ (self.num_chunks << CHUNK_SEED_SHIFT), step=self.step,
                          row_ids=[self.row_ids[r] for r in active])
        self.num_chunks += 1
        for i, r in enumerate(active):
            self.outputs[r] += result.token_ids[i]
            reason = result.finish_reasons[i]
            if reason in ("eos", "stop") or self._cut_at_stop(r):
                self.finish[r] = "stop" if reason != "eos" else "eos"
            elif len(self.outputs[r]) >= self.sampling.max_new_tokens:
                self.finish[r] = "length"
        stats = dataclasses.replace(result.stats, draft_row=[torch.tensor(active)[rows] for rows in result.stats.draft_row])
        self.stats.merge(stats, mixed_k=True)
        return result

    def _cut_at_stop(self, row: int) -> bool:
        """Cuts a completion right after the first stop string (one may span two chunks); True if cut."""
        out, stop = self.outputs[row], self.sampling.stop
        if not stop or not any(s in self.tokenizer.decode(out, skip_special_tokens=True) for s in stop):
            return False
        for end in range(1, len(out) + 1):
            if any(s in self.tokenizer.decode(out[:end], skip_special_tokens=True) for s in stop):
                del out[end:]
                return True
        return False

    def result(self) -> GenerationResult:
        lengths = [len(o) for o in self.outputs]
        self.stats.num_generated_tokens = sum(lengths)
        texts = [self.tokenizer.decode(o, skip_special_tokens=True) for o in self.outputs]
        return GenerationResult(prompt_ids=self.prompt_ids, token_ids=self.outputs, texts=texts, lengths=lengths,
                                finish_reasons=[f or "length" for f in self.finish], stats=self.stats)

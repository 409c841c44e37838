"""Batched speculative generation with an MTP head: plain (``none``), target-only (``to``) and
rejection sampling (``rs``), exact for any batch mix.

One verify step of a row (``to``/``rs``)::

    draft:   d_1..d_K from the MTP head, chained (step j feeds step j-1's hidden state and d_{j-1}):
             ``bebop.speculative.drafter``, which owns the head's cache and its pending inputs
    verify:  one target forward over [last token, d_1..d_K] -> p_1..p_{K+1}
    accept:  the run's verifier (``VERIFIERS[SpecConfig.verify]``, chosen once): token-wise rejection sampling
             (RS, q = the draft's distribution) or target-only (q one-hot); or, RS only, block verification
    commit:  the row keeps 1 + num_accepted KV entries (and recurrent states at that length); the
             recovered/bonus token is the next "last token"

Rows accept different numbers of tokens in the same step; a ragged cache (one per model) keeps a
length per row, so a rollback costs nothing: KV entries past a row's length are ignored, and a
recurrent layer's state is the one at the row's kept length, a snapshot the verify pass took or its
kept prefix replayed (``bebop.speculative.target``, ``bebop.speculative.state_cache``). Finished
rows are dropped from the batch, their KV entries and states with them. A row's randomness comes from
``bebop.speculative.rng`` keyed by (its seed, its number of emitted tokens), so its output does not
depend on which other rows share the batch.
Statistics (``Completions.stats``) count only the tokens the completions keep (see
``bebop.speculative.stats``): each step is logged first and trimmed once every row's end is known.
A decode step reads the device once (its tokens, with a verify step's counts and q's finiteness), so on
a GPU the host waits for the queue once per step.

Deviations from a textbook implementation:
    1) The MTP head's own KV cache holds one entry per committed position (step-1 inputs); the
       chained steps 2..K append speculative entries that are rolled back after every verify step,
       as vLLM and SGLang do.
    2) By default top-k/top-p apply to the target only; the draft is sampled from its own
       temperature-scaled distribution q and verified against exactly that q (exactness holds for
       any q). With ``SpecConfig.filter_drafts`` the target's top-k/top-p also filter q (on the
       draft's own logits) before drafts are drawn, and verification uses that filtered q: still
       exact, and q no longer spends mass on tokens the filtered target can only reject.
    3) The engine builds its own attention masks (per-row lengths), one per attention pattern the
       target uses: full causal, or the sliding window of each ``sliding_attention`` layer (see
       ``bebop.speculative.attention``, which refuses, in one line, any pattern it cannot reproduce exactly).
       The MTP head's layers are full-attention layers, in training and here.
    4) Recurrent layers (Gated DeltaNet, Mamba2) run a verify pass position by position with their
       sequential recurrence, keeping the state after each position, as a plain step runs them, or
       (``SpecConfig.recurrent_rollback``, replay) in their chunked form, each row's kept prefix run
       again at the commit; prefill chunks end at every row's prompt end, so no recurrent layer ever
       sees padding.
    5) The prefill runs in chunks under a fixed mask budget, rows ordered longest prompt first, and
       computes logits only at each row's last prompt position; the MTP head reads its first input
       pairs chunk by chunk alongside (``bebop.speculative.target``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from bebop.config import drafted_k, is_auto
from bebop.speculative import rng
from bebop.speculative.completions import Completions
from bebop.speculative.drafter import Drafter
from bebop.speculative.kv_cache import fill_order
from bebop.speculative.multidraft import verify_multi_draft_keyed
from bebop.speculative.sampling import keyed_race, logits_to_probs
from bebop.speculative.settings import MODES, SamplingParams, SpecConfig, check_settings, head_problem
from bebop.speculative.stats import EmissionLog, entropy
from bebop.speculative.target import Target
from bebop.speculative.verification import (
    VERIFIERS,
    finite_at_drafts,
    greedy_verify,
    noise_keys,
    race_key,
    verify_keyed,
)
from bebop.utils.errors import BebopError
from bebop.utils.torch_utils import release_inference_buffers


@dataclass
class _Rows:
    """Decode state of the active rows (R of them), all row-aligned."""

    index: list[int]  # original row of each active row
    keys: torch.Tensor  # (R, 2 + K) int64 rng stream keys: accept, resample, draft step 0..K-1
    counters: torch.Tensor  # (R,) int64, tokens emitted so far (the rng counter)
    last_token: torch.Tensor  # (R,) newest emitted token, not yet fed to the target

    def select(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, dtype=torch.long, device=self.keys.device)
        self.index = [self.index[i] for i in keep]
        self.keys, self.counters, self.last_token = self.keys[idx], self.counters[idx], self.last_token[idx]


def generate(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
    *,
    mtp=None,
    sampling: SamplingParams = SamplingParams(),
    spec: SpecConfig = SpecConfig(),
    seed: int = 0,
    step: int = 0,
    row_ids: list[int] | None = None,
) -> Completions:
    """Generates one completion per prompt.

    Args:
        model: an HF causal LM (eval mode).
        tokenizer: its tokenizer (EOS id, decoding).
        prompts: texts, or token-id lists.
        mtp: an ``MtpHead`` on ``model``; required for modes ``to`` and ``rs``.
        sampling, spec: see the dataclasses.
        seed, step, row_ids: row b's randomness is keyed by (seed, step, row_ids[b]) only
            (row_ids default to 0..B-1), so it does not depend on the rest of the batch.

    Returns:
        A ``Completions`` in prompt order.
    """
    decoder = Decoder(model, tokenizer, prompts, mtp=mtp, sampling=sampling, spec=spec, seed=seed, step=step,
                      row_ids=row_ids)
    while decoder.num_active:
        decoder.step()
    return decoder.result()


class Decoder:
    """One ``generate`` call, a decode step at a time; the mode and K may change between steps.

    ``bebop.speculative.auto.generate`` probes settings and switches to the chosen one within a call. A switch
    keeps exactness: every step draws from its rows' randomness at a counter no other step uses
    (each step starts at the row's number of emitted tokens), and the setting of a step depends
    only on what came before it. Switching to a deeper K than ``max_speculate_k`` is refused; with
    an MTP head and ``max_speculate_k`` > 0, plain steps keep the head's inputs, so ``none`` can be
    followed by ``to``/``rs``.

    The prefill and every step run under ``torch.inference_mode`` (no autograd bookkeeping per op: 12-25%
    of a step's time on a small model on a CPU, docs/results.md); ``result`` turns any buffer the model or
    head made meanwhile back into a normal tensor (``release_inference_buffers``), so training may follow.

    Args:
        model, tokenizer, prompts, mtp, sampling, spec, seed, step, row_ids: as for ``generate``.
        max_speculate_k: the deepest K any step may draft (default: the spec's K).
        time_drafts: time the drafting of each verify step (``step_times``); on CUDA one more host
            sync per step.
    """

    def __init__(self, model, tokenizer, prompts, *, mtp=None, sampling: SamplingParams = SamplingParams(),
                 spec: SpecConfig = SpecConfig(), seed: int = 0, step: int = 0, row_ids: list[int] | None = None,
                 max_speculate_k: int | None = None, time_drafts: bool = False):
        _check_args(model, mtp, prompts, sampling, spec)
        self.tokenizer = tokenizer
        self.prompt_ids = [list(p) if not isinstance(p, str) else tokenizer.encode(p) for p in prompts]
        if any(len(p) == 0 for p in self.prompt_ids):
            raise BebopError("empty prompt: every prompt needs at least one token")
        k = drafted_k(spec.mode, spec.speculate_k)
        self.max_speculate_k = max(k, max_speculate_k or 0) if mtp is not None else k
        max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        longest = max(len(p) for p in self.prompt_ids)
        capacity = longest + sampling.max_new_tokens + self.max_speculate_k + 1
        if max_pos is not None and capacity > max_pos:
            raise BebopError(
                f"prompt too long: {longest} prompt tokens + {sampling.max_new_tokens} new tokens + {self.max_speculate_k + 1} "
                f"verify slots exceed the model's max_position_embeddings={max_pos}"
            )
        device = next(model.parameters()).device
        batch = len(self.prompt_ids)
        ids = torch.tensor(row_ids if row_ids is not None else range(batch), dtype=torch.long, device=device)
        self.runner = _Runner(model, tokenizer, mtp, sampling, spec, batch, capacity, device, self.max_speculate_k)
        self.runner.time_drafts = time_drafts
        self.rows = _Rows(
            index=list(range(batch)),
            keys=noise_keys(rng.derive_seeds(seed, step, ids), self.max_speculate_k),
            counters=torch.zeros(batch, dtype=torch.long, device=device), last_token=ids.new_zeros(batch),
        )
        self.step_times: list[tuple[int, float, float]] = []
        start = time.perf_counter()
        with torch.inference_mode():
            self.runner.prefill(self.rows, self.prompt_ids)
        self.prefill_seconds = time.perf_counter() - start

    @property
    def num_active(self) -> int:
        """Rows still decoding."""
        return len(self.rows.index)

    def num_tokens(self) -> int:
        """Tokens emitted so far, all rows."""
        return sum(len(t) for t in self.runner.outputs)

    def active_lengths(self) -> list[int]:
        """Tokens emitted so far by each row still decoding."""
        return [len(self.runner.outputs[i]) for i in self.rows.index]

    def set_spec(self, spec: SpecConfig) -> None:
        """Decodes the next steps at ``spec`` (mode and K; its other fields must stay the same)."""
        k = drafted_k(spec.mode, spec.speculate_k)
        old = self.runner.spec
        if spec.mode not in MODES or k > self.max_speculate_k or (k and self.runner.drafter is None) \
                or replace(spec, mode=old.mode, speculate_k=old.speculate_k) != old:  # the rest is fixed per run
            raise ValueError(f"cannot switch from {old} to {spec} (max_speculate_k={self.max_speculate_k})")
        self.runner.spec, self.runner.k = spec, k

    def step(self) -> tuple[int, float, float]:
        """One decode step of the active rows -> (rows, seconds, seconds of its drafting or 0)."""
        num_rows, start = len(self.rows.index), time.perf_counter()
        self.runner.draft_seconds = 0.0
        with torch.inference_mode():
            self.runner.decode_step(self.rows)
        self.step_times.append((num_rows, time.perf_counter() - start, self.runner.draft_seconds))
        return self.step_times[-1]

    def result(self) -> Completions:
        """The completions and statistics; call once every row has finished."""
        runner = self.runner
        release_inference_buffers(runner.target.model, runner.drafter.head if runner.drafter else None)
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in runner.outputs]
        lengths = [len(t) for t in runner.outputs]
        return Completions(
            prompt_ids=self.prompt_ids, token_ids=runner.outputs, texts=texts,
            lengths=lengths, finish_reasons=runner.finish, stats=runner.log.to_stats(lengths), log=runner.log,
            step_times=self.step_times, prefill_seconds=self.prefill_seconds,
        )


def _check_args(model, mtp, prompts, sampling: SamplingParams, spec: SpecConfig) -> None:
    if is_auto(spec.mode, spec.speculate_k):
        raise BebopError("mode/speculate_k 'auto' is chosen by bebop.speculative.auto.generate.generate_auto, not by generate")
    check_settings(spec, sampling, auto_ok=False)
    if problem := head_problem(spec.mode, mtp is not None):
        raise BebopError(problem)
    if not prompts:
        raise BebopError("no prompts given")


@dataclass(frozen=True)
class _Stops:
    """When a completion ends: at EOS, at max_new_tokens, or right after a stop string (cut token-aligned)."""

    eos: int | None
    max_new_tokens: int
    stop: tuple[str, ...]
    tokenizer: object  # decodes a completion to look for the stop strings

    def append(self, out: list[int], new: list[int]) -> str:
        """Adds tokens to a completion ``out``; returns why it finished ("eos", "length", "stop"), or ""."""
        for token in new:
            out.append(token)
            if token == self.eos:
                return "eos"
            if len(out) >= self.max_new_tokens:
                return "length"
        return self._cut_at_stop(out) if self.stop else ""

    def _cut_at_stop(self, out: list[int]) -> str:
        if not any(s in self.tokenizer.decode(out, skip_special_tokens=True) for s in self.stop):
            return ""
        for end in range(1, len(out) + 1):
            if any(s in self.tokenizer.decode(out[:end], skip_special_tokens=True) for s in self.stop):
                del out[end:]
                return "stop"
        return ""


class _Runner:
    """The decode loop's state and steps (prefill, plain step, speculative step); drafting is the ``Drafter``'s."""

    def __init__(self, model, tokenizer, mtp, sampling, spec, batch, capacity, device, max_speculate_k):
        self.sampling, self.spec = sampling, spec
        self.k = drafted_k(spec.mode, spec.speculate_k)
        self.verifier = VERIFIERS[spec.verify]  # token-wise or block, chosen once per run
        self.greedy = sampling.temperature == 0
        self.stops = _Stops(tokenizer.eos_token_id, sampling.max_new_tokens, tuple(sampling.stop), tokenizer)
        self.target = Target(model, batch, capacity, head_reads_prenorm=bool(mtp and mtp.config.target_prenorm),
                             recurrent_rollback=spec.recurrent_rollback)
        self.drafter = None  # NOTE: present whenever a step may draft; then every step feeds the head's inputs
        if max_speculate_k:
            filtered = (sampling.top_k, sampling.top_p) if spec.filter_drafts else (None, None)
            self.drafter = Drafter(mtp, batch, capacity, device, next(model.parameters()).dtype,
                                   spec.draft_temperature or sampling.temperature or 1.0, *filtered)
        self.outputs: list[list[int]] = [[] for _ in range(batch)]
        self.finish = [""] * batch
        self.log = EmissionLog(max_speculate_k)  # turned into SpecStats once the completions' ends are known
        self.time_drafts = False  # time the drafting of every verify step (draft_seconds)
        self.draft_seconds = 0.0  # the last step's drafting, when timed

    # ------------------------------------------------------------------ target distribution
    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from (softmax at T=1 for greedy, used for statistics only)."""
        if self.greedy:
            return torch.softmax(logits.float(), dim=-1)
        s = self.sampling
        return logits_to_probs(logits, s.temperature, s.top_k, s.top_p)

    def _sample(self, logits: torch.Tensor, rows: _Rows) -> torch.Tensor:
        """One token per row from (R, V) logits at the rows' current counters; logs the rows' block."""
        probs = self._probs(logits)
        self._log_block(rows, [1] * len(rows.index), entropy(probs)[:, None])
        if self.greedy:
            return logits.argmax(-1)
        return keyed_race(probs, race_key(rows.keys, rows.counters))

    def _log_block(self, rows: _Rows, widths: list[int], token_entropy: torch.Tensor, drafts=None) -> None:
        """Logs a step's tokens (emitted next, from each row's current completion length)."""
        starts = [len(self.outputs[r]) for r in rows.index]
        self.log.add_block(rows.index, starts, widths, token_entropy, drafts)

    # ------------------------------------------------------------------ steps
    def prefill(self, rows: _Rows, prompt_ids: list[list[int]]) -> None:
        # NOTE: the rows' order is free (each row's randomness is its own); longest prompt first makes the rows
        # of every prefill chunk a prefix of the batch (``bebop.speculative.target``).
        order = sorted(range(len(prompt_ids)), key=lambda b: -len(prompt_ids[b]))
        rows.select(order)
        prompts = [prompt_ids[b] for b in order]
        lengths = [len(p) for p in prompts]
        ids = torch.tensor([p + [0] * (lengths[0] - len(p)) for p in prompts], dtype=torch.long,
                           device=rows.keys.device)
        feed = self.drafter.prefill_feeder(ids, lengths) if self.drafter is not None else None
        logits, hidden = self.target.prefill(ids, lengths, feed)  # (B, V), (B, D) at each row's last prompt token
        if not bool(torch.isfinite(logits).all()):  # NOTE: one host sync per generate call
            raise BebopError("the model produces NaN or infinite logits; check its weights and dtype")
        first = self._sample(logits, rows)
        if self.drafter is not None:  # the head's input pair at the last prompt position waits for the first token
            self.drafter.push(hidden, first)
        self._emit(rows, first, 1, [[t] for t in first.tolist()])  # NOTE: a host sync: the tokens

    def decode_step(self, rows: _Rows) -> None:
        if self.k:
            self._speculative_step(rows)
        else:
            logits, hidden = self.target.forward(rows.last_token[:, None])
            self.target.cache.shift_all(1)
            token = self._sample(logits[:, 0], rows)
            if self.drafter is not None:  # a later step may draft: the head's input pair (h_t, x_{t+1}) waits
                self.drafter.push(hidden[:, 0], token)
            self._emit(rows, token, 1, [[t] for t in token.tolist()])  # NOTE: the step's one host sync

    def _speculative_step(self, rows: _Rows) -> None:
        if self.spec.num_drafts > 1 and not self.greedy:  # NOTE: at T = 0 the n argmax chains would be one
            self._multi_draft_step(rows)
            return
        drafts, q = self._timed(self.drafter.draft, rows, self.k, sampled=self.spec.mode == "rs" and not self.greedy)
        logits, hidden = self.target.forward(torch.cat([rows.last_token[:, None], drafts], 1))
        p = self._probs(logits)  # (R, K+1, V)
        if self.greedy:
            out, accepted = greedy_verify(logits, drafts, validate=False)
        else:
            q_verify = q if self.spec.mode == "rs" else None
            out, accepted = verify_keyed(self.verifier, p, drafts, q_verify, rows.keys, rows.counters)
        host = _read_step(out, accepted, finite_at_drafts(q, drafts))
        kept = [h[-2] + 1 for h in host]
        self.target.cache.commit(kept)
        self._close(rows, p, q, hidden, out, accepted, host, kept)

    def _multi_draft_step(self, rows: _Rows) -> None:
        """n chains per row (``bebop.speculative.multidraft``): the target verifies every chain on its own copy of
        the row's cache (lane r * n + c), the kept chain's lane becomes the row, the other lanes are dropped."""
        n, k = self.spec.num_drafts, self.k
        drafts, q = self._timed(self.drafter.draft_lanes, rows, k, n)  # (R, n, K), (R, n, K, V)
        num, vocab = drafts.shape[0], q.shape[-1]
        self.target.cache.select_rows([r for r in range(num) for _ in range(n)])
        lane_drafts = drafts.view(num * n, k)
        logits, hidden = self.target.forward(torch.cat([rows.last_token.repeat_interleave(n)[:, None], lane_drafts], 1))
        p = self._probs(logits).view(num, n, k + 1, vocab)
        chain, out, accepted = verify_multi_draft_keyed(p, drafts, q, rows.keys, rows.counters)
        finite = finite_at_drafts(q.view(num * n, k, vocab), lane_drafts).view(num, n).all(1)
        host = _read_step(out, accepted, finite, chain)  # NOTE: the kept chains come with the step's one host read
        kept, kept_chain = [h[-2] + 1 for h in host], [h[-3] for h in host]
        self.target.cache.commit([kept[lane // n] for lane in range(num * n)])
        self.target.cache.select_rows([r * n + c for r, c in enumerate(kept_chain)])
        rows_index = torch.arange(num, device=chain.device)
        self._close(rows, p[rows_index, chain], q[rows_index, chain], hidden.view(num, n, k + 1, -1)[rows_index, chain],
                    out, accepted, host, kept)

    def _timed(self, draft, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft(*args, **kwargs)``, its seconds in ``draft_seconds`` when ``time_drafts`` asks for them."""
        start = time.perf_counter()
        drafts, q = draft(*args, **kwargs)
        if self.time_drafts:
            if drafts.is_cuda:  # NOTE: a host sync, only when asked: the drafts' kernels must have run
                torch.cuda.synchronize(drafts.device)
            self.draft_seconds = time.perf_counter() - start
        return drafts, q

    def _close(self, rows: _Rows, p: torch.Tensor, q: torch.Tensor, hidden: torch.Tensor, out: torch.Tensor,
               accepted: torch.Tensor, host: list[list[int]], kept: list[int]) -> None:
        """After the target's cache kept each row's tokens: the step's statistics along the kept chain (p (R, K+1, V),
        q (R, K, V)), the head's next inputs (hidden (R, K+1, D) at each fed position) and the emitted tokens."""
        p_draft = p[:, : self.k]
        alpha_to = p_draft.gather(-1, q.argmax(-1, keepdim=True))[..., 0]
        token_entropy = entropy(p)  # (R, K+1)
        self._log_block(rows, kept, token_entropy,
                        (token_entropy[:, : self.k], torch.minimum(p_draft, q).sum(-1), alpha_to))
        self.drafter.accept(hidden, out, kept)  # the head's next inputs: each kept position's (h, emitted token)
        self._emit(rows, out.gather(1, accepted[:, None])[:, 0], accepted + 1, [h[:n] for h, n in zip(host, kept)])

    # ------------------------------------------------------------------ bookkeeping
    def _emit(self, rows: _Rows, last_token: torch.Tensor, num_new: torch.Tensor | int, new: list[list[int]]) -> None:
        """Appends each row's new tokens (host lists; ``last_token`` (R,) the last of them, ``num_new`` (R,) or an
        int their count, on the device), ends rows at EOS/length/stop, drops finished rows."""
        num = len(rows.index)
        rows.last_token = last_token
        rows.counters = rows.counters + num_new
        keep = []
        for i, (row, tokens) in enumerate(zip(rows.index, new)):
            reason = self.stops.append(self.outputs[row], tokens)
            if reason:
                self.finish[row] = reason
            else:
                keep.append(i)
        if len(keep) < num:
            keep = fill_order(keep)  # NOTE: the rows' order is free (each row's randomness is its own)
            rows.select(keep)
            self.target.cache.select_rows(keep)
            if self.drafter is not None:
                self.drafter.select_rows(keep)


def _read_step(out: torch.Tensor, accepted: torch.Tensor, finite: torch.Tensor, *extra: torch.Tensor) -> list[list[int]]:
    """The step's one host sync: per row its output tokens (K+1), then ``extra`` values, its count and q's
    finiteness (``finite_at_drafts``, read at the drafts), so the check costs no sync of its own."""
    host = torch.cat([out, *(e[:, None] for e in extra), accepted[:, None], finite[:, None].long()], 1).tolist()
    if not all(h[-1] for h in host):  # verification against a NaN q is not exact: no token of this step is kept
        raise BebopError("the MTP head drafted NaN or infinite probabilities; check its weights and --dtype")
    return host

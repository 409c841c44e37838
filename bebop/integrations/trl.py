"""TRL's ``GRPOTrainer`` rolling out with Bebop: a rollout function on the trainer's own model.

    from bebop.integrations.trl import bebop_rollout_func
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=data,
                          rollout_func=bebop_rollout_func(head="path/to/mtp-head", mode="rs", speculate_k=3))
    trainer.train()

TRL's contract (``GRPOTrainer._generate``, TRL 1.16): ``rollout_func(prompts, trainer) -> dict`` with
``prompt_ids``, ``completion_ids`` and ``logprobs`` (lists of per-row lists); other keys go to the
reward functions. ``prompts`` is the process's slice of the batch, each prompt already repeated
``num_generations`` times by TRL's sampler, so one completion per entry is one group per prompt.

The sampled distribution is TRL's own: temperature, top-k, top-p, greedy (``do_sample=False``),
``max_new_tokens`` and the EOS ids are read from the trainer's ``generation_config`` (which
``GRPOConfig`` and its ``generation_kwargs`` build), and settings Bebop cannot reproduce exactly
(repetition penalty, min-p, ...) are refused in one line. Mode ``rs`` is lossless, so the completions
are distributed exactly as TRL's ``model.generate`` would sample them; ``to`` too; ``none`` is plain
decoding by Bebop's engine. Prompts are tokenized by the trainer itself (chat template included).

Statistics go into TRL's metrics (``trainer._metrics``), summed over processes, so they appear in
``trainer.state.log_history``, the console and every ``report_to``: ``spec/accept_length``,
``spec/accepted_per_pos/j``, ``spec/alpha_rs/j``, ``spec/alpha_to/j``, ``spec/target_entropy``,
``spec/num_drafts``, ``spec/num_accepted_tokens``, ``spec/rollout_seconds`` (the slowest process).
With ``token_stats=True`` the main process also appends each training rollout's per-position
entropy and acceptance to ``<output_dir>/token_stats.jsonl``, which ``bebop report`` reads.

Deviations from TRL's own generation:
    1) Randomness is Bebop's: row r of call c draws from (seed, c, r) with r offset by the process
       index, so ranks never share a stream; the samples differ from TRL's draw by draw, not in
       distribution. Greedy decoding is identical token for token.
    2) The model runs in eval mode during the rollout (no dropout), as a sampler should; TRL's own
       ``generate`` call runs it in the mode it is in (train mode during training), which differs only
       for models with dropout.
    3) ``logprobs`` are recomputed in one teacher-forced forward (no grad) as TRL computes its own:
       log softmax(logits / args.temperature) of each emitted token, without top-k/top-p; by default
       only when the trainer reads them (otherwise ``None``, which TRL accepts).
    4) The engine stops at the tokenizer's EOS; completions are then cut after the first of TRL's
       other EOS ids (the statistics count only the kept tokens). Cutting a sample is exact.
    5) Every process needs the whole policy: FSDP and DeepSpeed ZeRO-3 are refused in one line.

With ``backend="vllm"`` the completions come from Bebop's vLLM backend (``bebop.rollout.vllm``, the
one ``bebop rl --backend vllm`` uses): a vLLM engine in this process serving the policy with the head as
its MTP layer (rs: probabilistic drafts), the trainer's current weights pushed into it in place before
every call. vLLM draws its own randomness (deviation 1 becomes: not a function of (seed, call, row)),
and measures no per-token entropy or counterfactual acceptance: ``spec/target_entropy``,
``spec/accepted_per_pos/j``, ``spec/alpha_*/j`` are NaN (TRL logs null) and no token statistics are
written. Mode/K auto needs the engine.

``train_head_on_policy`` trains a head on the policy's own samples in one call, for users without one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bebop.config import AUTO, is_auto
from bebop.speculative.auto.chooser import AutoChooser, candidates
from bebop.speculative.auto.generate import generate_auto
from bebop.speculative.engine import generate
from bebop.speculative.settings import SamplingParams, SpecConfig, check_settings
from bebop.speculative.stats import SpecStats
from bebop.utils.io import BebopError, read_json, write_json

TOKEN_STATS_FILE = "token_stats.jsonl"  # per-position entropy and acceptance, as ``bebop rl`` writes it
CONFIG_FILE = "bebop_rollout.json"  # the rollout's settings, written beside TRL's output
BACKENDS = ("engine", "vllm")  # what samples: Bebop's engine on the trainer's model, or Bebop's vLLM backend
LOGPROB_BATCH = 16  # rows per teacher-forced forward of ``policy_logprobs``
# GenerationConfig fields that change the sampled distribution, with the values that leave it alone.
UNSUPPORTED_SETTINGS = {
    "repetition_penalty": (1.0,), "encoder_repetition_penalty": (1.0,), "min_p": (0.0,), "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,), "eta_cutoff": (0.0,), "top_h": (), "no_repeat_ngram_size": (0,),
    "bad_words_ids": (), "suppress_tokens": (), "begin_suppress_tokens": (), "sequence_bias": (),
    "min_new_tokens": (0,), "min_length": (0,), "forced_bos_token_id": (), "forced_eos_token_id": (),
    "num_beams": (1,), "stop_strings": (), "guidance_scale": (1.0,), "watermarking_config": (),
    "exponential_decay_length_penalty": (), "penalty_alpha": (), "diversity_penalty": (0.0,),
}


@dataclass
class BebopRollout:
    """The rollout function ``bebop_rollout_func`` returns; TRL calls it as ``rollout(prompts, trainer)``.

    Attributes:
        head: an ``MtpHead`` on the trainer's model, or the directory of one (loaded at the first call).
        spec: mode (none/to/rs/auto) and K (int or "auto").
        logprobs: return the policy's log-probabilities of the emitted tokens (one extra forward);
            None = only when the trainer reads them (``off_policy_mask_threshold`` set: without vLLM,
            TRL 1.16 reads a rollout's logprobs nowhere else).
        token_stats: append per-position statistics to ``<output_dir>/token_stats.jsonl``.
        seed: base of the rows' randomness; None = the trainer's ``args.seed``.
        backend: "engine" (Bebop's engine on the trainer's model) or "vllm" (Bebop's vLLM backend, synced
            with the trainer's weights before every call).
    """

    head: object = None
    spec: SpecConfig = SpecConfig("rs", 3)
    logprobs: bool | None = None
    token_stats: bool = True
    seed: int | None = None
    backend: str = "engine"
    num_calls: int = field(default=0, init=False)  # the call counter keys each call's randomness
    chooser: AutoChooser | None = field(default=None, init=False, repr=False)  # mode/K auto: the run's chooser
    loaded_head: object = field(default=None, init=False, repr=False)  # the MtpHead, once on the model
    vllm: object = field(default=None, init=False, repr=False)  # backend "vllm": the VllmBackend, from the first call

    def __post_init__(self) -> None:
        check_settings(self.spec, None)
        if self.spec.mode != "none" and self.head is None:
            raise BebopError(f"mode {self.spec.mode!r} needs an MTP head (head=path or MtpHead)")
        if self.backend not in BACKENDS:
            raise BebopError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.backend == "vllm" and is_auto(self.spec.mode, self.spec.speculate_k):
            raise BebopError("mode/K auto needs backend engine; the vllm backend takes a fixed mode and K")

    def __call__(self, prompts: list, trainer) -> dict:
        model = policy_model(trainer)
        split = "train" if trainer.model.training else "eval"
        sampling = sampling_params(trainer, model)
        prompt_ids = prompt_token_ids(trainer, prompts)
        head = self._head_on(model)
        first_row = trainer.accelerator.process_index * len(prompt_ids)
        seed = trainer.args.seed if self.seed is None else self.seed
        was_training = model.training
        model.eval()
        try:
            start = time.perf_counter()
            if self.backend == "vllm":
                result = self._rollout_vllm(model, text_tokenizer(trainer), prompt_ids, head, sampling, seed)
            else:
                result = self._generate(model, text_tokenizer(trainer), prompt_ids, head, sampling, seed, first_row)
            seconds = time.perf_counter() - start
            completion_ids, stats = cut_at_eos(result, set(trainer.eos_token_ids))
            wanted = self.logprobs if self.logprobs is not None else trainer.off_policy_mask_threshold is not None
            logprobs = policy_logprobs(model, prompt_ids, completion_ids, trainer.temperature) if wanted else None
        finally:
            model.train(was_training)
        self.num_calls += 1
        log_spec_metrics(trainer, split, stats, seconds, self.max_k, result.token_stats)
        if self.token_stats and split == "train":
            write_token_stats(trainer, stats if result.token_stats else None, first_row, self.spec, self.head)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    @property
    def max_k(self) -> int:
        """The deepest K a call may draft: the length of the per-position metrics."""
        return max(k for _, k in candidates(self.spec))

    def _head_on(self, model):
        if self.spec.mode == "none":
            return None
        if self.loaded_head is None and isinstance(self.head, (str, Path)):
            from bebop.mtp.head import MtpHead

            self.loaded_head = MtpHead.from_pretrained(self.head, model)
        head = self.loaded_head if self.loaded_head is not None else self.head
        return head.eval()  # NOTE: a sampler runs without dropout, as the policy does here

    def _rollout_vllm(self, model, tokenizer, prompt_ids, head, sampling, seed):
        """Bebop's vLLM backend, with the trainer's current weights pushed into its engine first."""
        if self.vllm is None:
            from bebop.rollout.vllm import VllmBackend

            self.vllm = VllmBackend(model, tokenizer, head, seed=seed)
        self.vllm.sync(model)  # NOTE: the head's own layer is frozen; its embedding and lm_head are the target's
        return self.vllm.rollout(prompt_ids, sampling, self.spec, seed=seed, step=self.num_calls)

    def close(self) -> None:
        """Shuts down the vLLM engine (backend "vllm"); the engine backend holds nothing to close."""
        if self.vllm is not None:
            self.vllm.close()

    def _generate(self, model, tokenizer, prompt_ids, head, sampling, seed, first_row):
        row_ids = list(range(first_row, first_row + len(prompt_ids)))
        if is_auto(self.spec.mode, self.spec.speculate_k):
            self.chooser = self.chooser or AutoChooser()
            result, _ = generate_auto(model, tokenizer, prompt_ids, mtp=head, sampling=sampling, spec=self.spec,
                                      seed=seed, step=self.num_calls, row_ids=row_ids, chooser=self.chooser)
            return result
        return generate(model, tokenizer, prompt_ids, mtp=head, sampling=sampling, spec=self.spec, seed=seed,
                        step=self.num_calls, row_ids=row_ids)


def bebop_rollout_func(head=None, *, mode: str = "rs", speculate_k: int | str = 3, logprobs: bool | None = None,
                       token_stats: bool = True, seed: int | None = None, backend: str = "engine") -> BebopRollout:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` that samples with Bebop on the trainer's model.

    Args:
        head: the MTP head's directory (``bebop train-mtp`` output) or an ``MtpHead`` on the model;
            None only with mode "none".
        mode: "rs" (lossless rejection sampling), "to", "none" or "auto".
        speculate_k: K, drafts per verify step, or "auto".
        logprobs: return the policy's log-probabilities of the emitted tokens; None = only when the
            trainer reads them (``off_policy_mask_threshold``), True = always, False = never.
        token_stats: append per-position statistics to ``<output_dir>/token_stats.jsonl``.
        seed: base of the randomness; None = the trainer's ``args.seed``.
        backend: "engine" (Bebop's engine on the trainer's model) or "vllm" (Bebop's vLLM backend, the
            trainer's weights pushed into it before every call; needs vLLM).

    Example: ``GRPOTrainer(..., rollout_func=bebop_rollout_func("heads/e2e_tv", mode="rs"))``.
    """
    return BebopRollout(head=head, spec=SpecConfig(mode, speculate_k), logprobs=logprobs, token_stats=token_stats,
                        seed=seed, backend=backend)


def train_head_on_policy(trainer, out_dir: str | Path, num_prompts: int = 64, samples_per_prompt: int = 4,
                         config=None, seed: int = 0) -> Path:
    """Trains an MTP head on the trainer's policy's own samples (as ``bebop train-mtp`` does) and saves it.

    Samples ``samples_per_prompt`` completions of the first ``num_prompts`` training prompts with the
    trainer's sampling settings (Bebop's engine, plain decoding), then runs ``bebop.mtp.train.train_mtp``
    (default: e2e-TV, with its CE warm-up when the head starts from the backbone's last layer). Call it
    before ``trainer.train()``, with ``out_dir`` the head path given to ``bebop_rollout_func``; under
    several processes every rank calls it and draws the same samples (the head's batches are sharded).

    Args:
        trainer: a ``GRPOTrainer`` whose ``train_dataset`` has a ``prompt`` column.
        out_dir: where the head is written (a new or empty directory).
        num_prompts, samples_per_prompt: how much policy data the head trains on.
        config: a ``bebop.mtp.config.TrainMtpConfig``; None = its defaults.
        seed: the samples' randomness.

    Returns:
        ``out_dir``.
    """
    from bebop.mtp.config import TrainMtpConfig
    from bebop.mtp.data import Sequences
    from bebop.mtp.train import train_mtp

    model = policy_model(trainer)
    prompts = list(trainer.train_dataset["prompt"][:num_prompts])
    prompt_ids = [ids for ids in prompt_token_ids(trainer, prompts) for _ in range(samples_per_prompt)]
    was_training, trainable = model.training, [p.requires_grad for p in model.parameters()]
    model.eval()
    try:
        result = generate(model, text_tokenizer(trainer), prompt_ids, sampling=sampling_params(trainer, model),
                          seed=seed)
        completions, _ = cut_at_eos(result, set(trainer.eos_token_ids))
        data = Sequences([p + c for p, c in zip(prompt_ids, completions)], [len(p) for p in prompt_ids])
        train_mtp(model, data, out_dir, config or TrainMtpConfig(), pad_id=text_tokenizer(trainer).pad_token_id,
                  show_progress=trainer.accelerator.is_main_process)
    finally:  # NOTE: train_mtp freezes the backbone; the policy goes back to training as it was
        for p, flag in zip(model.parameters(), trainable):
            p.requires_grad_(flag)
        model.train(was_training)
    return Path(out_dir)


# ----------------------------------------------------------------------------- TRL's settings


def policy_model(trainer):
    """The trainer's model, unwrapped; BebopError when its weights are sharded over processes."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if getattr(trainer, "is_fsdp_enabled", False) or getattr(plugin, "zero_stage", None) == 3:
        raise BebopError("bebop_rollout_func needs the whole policy on every process; FSDP and DeepSpeed ZeRO-3 "
                         "shard it (use DDP or ZeRO-1/2)")
    return trainer.accelerator.unwrap_model(trainer.model)


def _setting(trainer, model, name: str):
    """A GenerationConfig field as TRL's generate sees it: the trainer's, else the model's default."""
    value = getattr(trainer.generation_config, name, None)
    return value if value is not None else getattr(getattr(model, "generation_config", None), name, None)


def sampling_params(trainer, model) -> SamplingParams:
    """The trainer's sampling settings as Bebop's; BebopError (one line) for any Bebop cannot reproduce."""
    if getattr(trainer, "use_vllm", False):
        raise BebopError("bebop_rollout_func samples on the trainer's own model: set use_vllm=False in GRPOConfig")
    changed = []
    for name, off in UNSUPPORTED_SETTINGS.items():
        value = _setting(trainer, model, name)
        if value is not None and value not in off and value != []:
            changed.append(f"{name}={value!r}")
    if changed:
        raise BebopError(f"Bebop's rollouts cannot reproduce these sampling settings exactly: {', '.join(changed)}")
    greedy = _setting(trainer, model, "do_sample") is False
    return SamplingParams(
        temperature=0.0 if greedy else float(_setting(trainer, model, "temperature") or 1.0),
        top_k=int(_setting(trainer, model, "top_k") or 0),
        top_p=float(_setting(trainer, model, "top_p") or 1.0),
        max_new_tokens=int(trainer.generation_config.max_new_tokens),
    )


def text_tokenizer(trainer):
    """The trainer's tokenizer (a processor's own tokenizer when TRL was given a processor)."""
    return getattr(trainer.processing_class, "tokenizer", trainer.processing_class)


def prompt_token_ids(trainer, prompts: list) -> list[list[int]]:
    """The prompts tokenized exactly as the trainer's own generation tokenizes them (chat template, tools)."""
    prompt_ids, images, multimodal = trainer._tokenize_prompts(prompts)
    if images is not None or multimodal:
        raise BebopError("bebop_rollout_func takes text prompts only; this batch has images or multimodal fields")
    return [list(map(int, ids)) for ids in prompt_ids]


# ----------------------------------------------------------------------------- completions


def cut_at_eos(result, eos_ids: set[int]) -> tuple[list[list[int]], SpecStats]:
    """Each completion cut right after its first token in ``eos_ids``, and the statistics of what is kept.

    Example: tokens [5, 7, 2, 9] with eos_ids {2} -> [5, 7, 2].
    """
    cut = []
    for tokens in result.token_ids:
        end = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
        cut.append(list(tokens[:end]))
    if all(len(c) == len(t) for c, t in zip(cut, result.token_ids)):
        return cut, result.stats
    if result.log is None:  # NOTE: vLLM stops at the EOS ids the model's generation config declares, as TRL does
        raise BebopError(f"the rollout ran past one of TRL's EOS ids {sorted(eos_ids)}; add it to the model's "
                         "generation_config.eos_token_id")
    return cut, result.log.to_stats([len(c) for c in cut])


def policy_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float,
                    batch_size: int = LOGPROB_BATCH) -> list[list[float]]:
    """log softmax(logits / temperature) of every completion token under ``model``, row by row.

    Rows are right-padded, so every real token keeps its position; no gradient is kept. The logits are
    made only at the completion tokens, a tile at a time (``bebop.rl.grpo.token_logprobs``).
    """
    from bebop.rl.grpo import pad_sequences, token_logprobs

    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, completions = prompt_ids[start:start + batch_size], completion_ids[start:start + batch_size]
        inputs = (t.to(device) for t in pad_sequences(prompts, completions, pad_id=0))  # 3 x (b, S)
        with torch.no_grad():
            logprobs = token_logprobs(model, *inputs, temperature=temperature)  # (b, S)
        for b, (p, c) in enumerate(zip(prompts, completions)):
            out.append(logprobs[b, len(p):len(p) + len(c)].tolist())  # NOTE: one host sync per row
    return out


# ----------------------------------------------------------------------------- metrics


def _local_sums(stats: SpecStats, max_k: int, token_stats: bool = True) -> torch.Tensor:
    """(5 + 4 * max_k,) float64: this process's counts and sums, summed over processes by the caller
    (``token_stats`` False: the tokens are counted without their entropies, which vLLM does not give)."""
    pos = torch.cat(stats.draft_position).long() if stats.draft_position else torch.zeros(0, dtype=torch.long)
    per_pos = [torch.bincount(pos - 1, minlength=max_k)[:max_k].double()]
    for values in (stats.alpha_rs, stats.alpha_to):
        weights = torch.cat(values).double() if values else torch.zeros(0, dtype=torch.float64)
        per_pos.append(torch.bincount(pos - 1, weights=weights, minlength=max_k)[:max_k])
    accepted = list(stats.accepted_per_pos) + [0] * (max_k - len(stats.accepted_per_pos))
    entropy = torch.cat(stats.token_entropy).double() if stats.token_entropy else torch.zeros(0, dtype=torch.float64)
    num_tokens = entropy.numel() if token_stats else stats.num_generated_tokens
    head = [stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens, float(entropy.sum()), num_tokens]
    return torch.cat([torch.tensor(head + accepted[:max_k], dtype=torch.float64), *per_pos])


def spec_metrics(sums: torch.Tensor, max_k: int, seconds: float, token_stats: bool = True) -> dict[str, float]:
    """TRL metrics from summed counts (``_local_sums`` over processes); NaN where nothing was counted, and
    (``token_stats`` False: vLLM) for entropy and per-position acceptance."""
    drafts, draft_tokens, accepted, entropy_sum, num_tokens = sums[:5].tolist()
    accepted_per_pos = sums[5:5 + max_k].tolist()
    positions, alpha_rs, alpha_to = (sums[5 + max_k * i:5 + max_k * (i + 1)].tolist() for i in (1, 2, 3))
    nan = float("nan")
    metrics = {
        "spec/accept_length": 1 + accepted / drafts if drafts else nan,
        "spec/num_drafts": drafts,
        "spec/num_draft_tokens": draft_tokens,
        "spec/num_accepted_tokens": accepted,
        "spec/target_entropy": entropy_sum / num_tokens if num_tokens else nan,
        "spec/num_generated_tokens": num_tokens,
        "spec/rollout_seconds": seconds,
    }
    for j in range(max_k):
        metrics[f"spec/accepted_per_pos/{j + 1}"] = accepted_per_pos[j] / drafts if drafts else nan
        metrics[f"spec/alpha_rs/{j + 1}"] = alpha_rs[j] / positions[j] if positions[j] else nan
        metrics[f"spec/alpha_to/{j + 1}"] = alpha_to[j] / positions[j] if positions[j] else nan
    if not token_stats:
        absent = [k for k in metrics if k == "spec/target_entropy" or k.startswith("spec/accepted_per_pos/")]
        metrics.update(dict.fromkeys(absent, nan))
    return metrics


def log_spec_metrics(trainer, split: str, stats: SpecStats, seconds: float, max_k: int,
                     token_stats: bool = True) -> dict[str, float]:
    """Sums the statistics over processes (a collective: every rank calls it) and appends them to TRL's metrics."""
    accelerator = trainer.accelerator
    local = _local_sums(stats, max_k, token_stats).to(accelerator.device)
    sums = accelerator.gather(local[None]).sum(0).cpu()
    slowest = accelerator.gather(torch.tensor([seconds], dtype=torch.float64, device=accelerator.device)).max().item()
    metrics = spec_metrics(sums, max_k, slowest, token_stats)
    for key, value in metrics.items():
        trainer._metrics[split][key].append(value)
    return metrics


def rollout_settings(spec: SpecConfig, head) -> dict:
    """What ``bebop report`` needs to place the run: mode, K, the head and the loss it was trained with."""
    settings = {"trainer": "trl", "mode": spec.mode, "speculate_k": spec.speculate_k, "mtp": None, "mtp_loss": None}
    if isinstance(head, (str, Path)):
        from bebop.mtp.head import CONFIG_NAME

        settings["mtp"] = str(head)
        saved = read_json(Path(head) / CONFIG_NAME, "MTP head config")
        settings["mtp_loss"] = (saved.get("train") or {}).get("loss") if isinstance(saved, dict) else None
    return settings


def write_token_stats(trainer, stats: SpecStats | None, first_row: int, spec: SpecConfig, head) -> None:
    """Appends this rollout's per-position statistics (every process's) as one line, on the main process,
    and the rollout's settings once; ``stats`` None (vLLM measures none): the settings only."""
    from accelerate.utils import gather_object

    cat = (lambda xs: torch.cat(xs).tolist() if xs else [])
    rows = None
    if stats is not None:
        row = {"step": trainer.state.global_step + 1, "position": cat(stats.draft_position),
               "row": [first_row + r for r in cat(stats.draft_row)], "entropy": cat(stats.draft_entropy),
               "alpha_rs": cat(stats.alpha_rs), "alpha_to": cat(stats.alpha_to)}
        rows = gather_object([row])
    if not trainer.accelerator.is_main_process:
        return
    out = Path(trainer.args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / CONFIG_FILE).exists():
        write_json(out / CONFIG_FILE, rollout_settings(spec, head))
    if rows is not None:
        merged = {"step": row["step"], **{k: [v for r in rows for v in r[k]] for k in row if k != "step"}}
        with open(out / TOKEN_STATS_FILE, "a") as f:
            f.write(json.dumps(merged) + "\n")


__all__ = ["AUTO", "BebopRollout", "bebop_rollout_func", "cut_at_eos", "policy_logprobs", "sampling_params",
           "train_head_on_policy"]

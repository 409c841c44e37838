"""TRL's ``GRPOTrainer`` rolling out with Bebop: a rollout function on the trainer's own model.

    from bebop.integrations.trl import bebop_rollout_func
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=data,
                          rollout_func=bebop_rollout_func(head="path/to/mtp-head", mode="rs", speculate_k=3))
    trainer.train()

This module is TRL's side of the contract: it reads the trainer's settings and calls Bebop's rollout
seam (``bebop.rollout``: ``make_backend``, ``sync``, ``rollout``, as `bebop rl` does). TRL 1.16 calls
``rollout_func(prompts, trainer) -> dict`` from ``GRPOTrainer._generate`` and takes ``prompt_ids``,
``completion_ids`` and ``logprobs`` (lists of per-row lists); ``prompts`` is the process's slice of the
batch, each prompt already repeated ``num_generations`` times, so one completion per entry is one group
per prompt.

The sampled distribution is the one TRL's own ``model.generate`` samples: the trainer's
``generation_config`` (which ``GRPOConfig`` and its ``generation_kwargs`` build), its unset fields taken
from the model's and then transformers' defaults, is read field by field as transformers reads it
(``sampling_params``; ``GENERATION_FIELDS`` says what each field means here), and every setting Bebop
cannot reproduce exactly (a repetition penalty, min-p, beams, DoLa, a time limit, ...) is refused in one
line naming what to remove, at the first rollout, before anything is sampled. Mode ``rs`` is lossless,
so the completions are distributed exactly as TRL's generate would sample them; ``to`` too; ``none`` is
plain decoding by Bebop's engine. Prompts are tokenized by the trainer itself (chat template included).

What ran is recorded: each rollout's statistics (``SpecStats.to_metrics()``, summed over processes, as
``scalar_metrics`` spells lists for TRL: ``spec/alpha_rs/j``, ...), ``spec/rollout_seconds`` (the
slowest process) and, with mode/K auto, the setting chosen (``auto/speculate_k``, ``auto/mode/<mode>``
= 1) go into TRL's metrics, hence ``trainer.state.log_history``, the console and every ``report_to``.
With ``token_stats=True`` the main process writes ``<output_dir>/bebop_rollout.json`` (mode, K, head,
backend, the sampling settings read from the trainer) and appends each training rollout's per-position
statistics to ``<output_dir>/token_stats.jsonl`` (``bebop.utils.run_files``), which ``bebop report`` reads.

Deviations from TRL's own generation:
    1) Randomness is Bebop's: row r of call c draws from (seed, c, r) with r offset by the process
       index, so ranks never share a stream; the samples differ from TRL's draw by draw, not in
       distribution. Greedy decoding is identical token for token.
    2) The model runs in eval mode during the rollout (no dropout), as a sampler should; TRL's own
       ``generate`` call runs it in the mode it is in (train mode during training), which differs only
       for models with dropout.
    3) ``logprobs`` are recomputed in one teacher-forced forward (no grad) as TRL computes its own
       (``bebop.rollout.logprobs``); by default only when the trainer reads them (otherwise ``None``,
       which TRL accepts).
    4) The engine stops at the tokenizer's EOS; completions are then cut after the first of the
       generation config's other EOS ids (``Completions.cut_after``; the statistics count only the kept
       tokens). Cutting a sample is exact.
    5) Every process needs the whole policy: FSDP and DeepSpeed ZeRO-3 are refused in one line; so is
       mode/K auto under several processes (each would choose from its own timings).

With ``backend="vllm"`` the completions come from Bebop's vLLM backend (``bebop.rollout.vllm``, the
one ``bebop rl --backend vllm`` uses): a vLLM engine in this (single) process serving the policy with
the head as its MTP layer (rs: probabilistic drafts), the trainer's current weights pushed into it in
place before every call (``RolloutBackend.sync``). vLLM draws its own randomness (deviation 1 becomes:
not a function of (seed, call, row)), and measures no per-token entropy or counterfactual acceptance:
those metrics are NaN (TRL logs null) and no token statistics are written.

``train_head_on_policy`` trains a head on the policy's own samples in one call, for users without one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from bebop.config import temperature_problem
from bebop.rollout.base import backend_problem, make_backend
from bebop.rollout.logprobs import policy_logprobs
from bebop.rollout.runner import gather_completions
from bebop.rollout.spec_guard import check_lossless_verification
from bebop.speculative.completions import ABSENT_WITHOUT_TOKEN_STATS, Completions
from bebop.speculative.settings import MODES, SamplingParams, SpecConfig, check_settings, head_problem
from bebop.utils.errors import BebopError
from bebop.utils.files import read_json, write_json
from bebop.utils.run_files import ROLLOUT_FILE, TOKEN_STATS_FILE, scalar_metrics, token_stats_row


READ = "read"  # reproduced: ``sampling_params`` reads it
NO_EFFECT = "no effect"  # changes how generate computes, not which tokens it emits


def _off(*values):
    """A field's test: unset or one of ``values``. Example: _off(1)(None) and _off(1)(1) are True, _off(1)(4) False."""
    return lambda value: value is None or value in values


def _at_most(limit):
    """A field's test: unset or <= ``limit`` (transformers applies it only above)."""
    return lambda value: value is None or value <= limit


def _outside_unit(value) -> bool:
    """A cutoff's test: transformers applies epsilon/eta cutoffs only strictly between 0 and 1."""
    return value is None or not 0.0 < value < 1.0


# Every GenerationConfig field (transformers 5) by what TRL's ``model.generate`` does with it, as transformers'
# ``get_generation_mode``, ``_get_logits_processor`` and ``_get_stopping_criteria`` read it: READ, NO_EFFECT,
# or a test that passes when the field leaves the tokens alone (refused by name otherwise). A field of
# GenerationConfig missing here (a newer transformers) is refused unless unset.
GENERATION_FIELDS = {
    "do_sample": READ, "temperature": READ, "top_k": READ, "top_p": READ, "max_new_tokens": READ, "eos_token_id": READ,
    "max_length": NO_EFFECT,  # NOTE: max_new_tokens, which TRL always sets, takes precedence
    # the generation mode: greedy search or sampling only
    "num_beams": _off(1), "num_beam_groups": _off(1), "constraints": _off(), "force_words_ids": _off(),
    "penalty_alpha": _off(0.0), "dola_layers": _off(), "prompt_lookup_num_tokens": _off(),
    "assistant_early_exit": _off(), "use_mtp": _off(False), "speculation_type": _off(), "token_healing": _off(False),
    "num_return_sequences": _off(1), "guidance_scale": _off(1.0),
    # logits processors
    "min_p": _off(0.0), "typical_p": lambda value: value is None or value >= 1.0, "top_h": _off(),
    "epsilon_cutoff": _outside_unit, "eta_cutoff": _outside_unit, "repetition_penalty": _off(1.0),
    "encoder_repetition_penalty": _off(1.0), "no_repeat_ngram_size": _at_most(0),
    "encoder_no_repeat_ngram_size": _at_most(0), "bad_words_ids": _off(), "sequence_bias": _off(),
    "suppress_tokens": _off([]), "begin_suppress_tokens": _off([]), "min_length": _at_most(0),
    "min_new_tokens": _at_most(0), "forced_bos_token_id": _off(), "forced_eos_token_id": _off(),
    "exponential_decay_length_penalty": _off(), "watermarking_config": _off(),
    # stopping criteria
    "max_time": _off(), "stop_strings": _off([]), "is_assistant": _off(False),
    # finite logits, beam-only or assisted-only settings, caching, outputs
    **dict.fromkeys((
        "remove_invalid_values", "renormalize_logits", "early_stopping", "length_penalty", "diversity_penalty",
        "low_memory", "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
        "max_matching_ngram_size", "assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight",
        "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile",
        "continuous_batching_config", "prefill_chunk_size", "output_attentions", "output_hidden_states",
        "output_scores", "output_logits", "return_dict_in_generate", "pad_token_id", "bos_token_id",
        "decoder_start_token_id", "transformers_version", "_from_model_config"), NO_EFFECT),
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
        token_stats: write ``bebop_rollout.json`` and append per-position statistics to ``token_stats.jsonl``
            in the trainer's output directory.
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
    sampler: object = field(default=None, init=False, repr=False)  # the RolloutBackend, from the first call
    loaded_head: object = field(default=None, init=False, repr=False)  # the MtpHead, once on the model
    recorded: dict | None = field(default=None, init=False, repr=False)  # what bebop_rollout.json holds
    last_step: tuple[int, int] = field(default=(0, 0), init=False, repr=False)  # (step, rollouts in it) of the stats

    def __post_init__(self) -> None:
        check_settings(self.spec, None)
        if problem := head_problem(self.spec.mode, self.head is not None, given_by="head=path or MtpHead"):
            raise BebopError(problem)
        if problem := backend_problem(self.backend, self.spec.mode, self.spec.speculate_k):
            raise BebopError(problem)

    def __call__(self, prompts: list, trainer) -> dict:
        model = policy_model(trainer)
        sampling, eos_ids = sampling_params(trainer, model)
        accelerator = trainer.accelerator
        if problem := backend_problem(self.backend, self.spec.mode, self.spec.speculate_k, accelerator.num_processes):
            raise BebopError(problem)
        split = "train" if trainer.model.training else "eval"
        tokenizer = text_tokenizer(trainer)
        prompt_ids = prompt_token_ids(trainer, prompts)
        seed = trainer.args.seed if self.seed is None else self.seed
        was_training = model.training
        model.eval()
        try:
            sampler = self._sampler(model, tokenizer, seed)
            start = time.perf_counter()
            result = sampler.rollout(prompt_ids, sampling, self.spec, seed=seed, step=self.num_calls,
                                     first_row=accelerator.process_index * len(prompt_ids))
            seconds = time.perf_counter() - start
            result = result.cut_after(eos_ids, tokenizer)
            wanted = self.logprobs if self.logprobs is not None else trainer.off_policy_mask_threshold is not None
            completion_ids = result.token_ids
            logprobs = policy_logprobs(model, prompt_ids, completion_ids, trainer.temperature) if wanted else None
        finally:
            model.train(was_training)
        self.num_calls += 1
        merged, slowest = gather_completions(result, seconds)  # NOTE: a collective: every process calls it
        log_metrics(trainer, split, merged, slowest, result.decision)
        if self.token_stats and split == "train" and accelerator.is_main_process:
            self._record(Path(trainer.args.output_dir), trainer.state.global_step + 1, merged,
                         rollout_record(self, sampling, eos_ids, seed))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def _sampler(self, model, tokenizer, seed: int):
        """The backend, made at the first call; every call syncs it with the trainer's current policy
        (the engine rebinds, vLLM copies the weights in place; the head's own layer stays frozen)."""
        head = self._head_on(model)
        if self.sampler is None:
            self.sampler = make_backend(self.backend, model, tokenizer, head, seed=seed)
        self.sampler.sync(model)
        return self.sampler

    def _head_on(self, model):
        if self.spec.mode == "none":
            return None
        if self.loaded_head is None and isinstance(self.head, (str, Path)):
            from bebop.mtp.head import MtpHead

            self.loaded_head = MtpHead.from_pretrained(self.head, model)
        head = self.loaded_head if self.loaded_head is not None else self.head
        return head.eval()  # NOTE: a sampler runs without dropout, as the policy does here

    def _record(self, out: Path, step: int, result: Completions, settings: dict) -> None:
        """On the main process: the rollout's settings when they changed, and its per-position statistics
        (when the backend measures them) as one row of every process's positions."""
        out.mkdir(parents=True, exist_ok=True)
        if settings != self.recorded:
            write_json(out / ROLLOUT_FILE, settings)
            self.recorded = settings
        if not result.token_stats:
            return
        rollouts = self.last_step[1] + 1 if self.last_step[0] == step else 1
        self.last_step = (step, rollouts)
        row = token_stats_row(step, result.stats.token_arrays(), rollout=rollouts if rollouts > 1 else None)
        with open(out / TOKEN_STATS_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Frees the backend (shuts down the vLLM engine; the engine backend holds nothing to close)."""
        if self.sampler is not None:
            self.sampler.close()


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
        token_stats: write ``bebop_rollout.json`` and ``token_stats.jsonl`` in the trainer's output directory.
        seed: base of the randomness; None = the trainer's ``args.seed``.
        backend: "engine" (Bebop's engine on the trainer's model) or "vllm" (Bebop's vLLM backend, the
            trainer's weights pushed into it before every call; needs vLLM, one process).

    Example: ``GRPOTrainer(..., rollout_func=bebop_rollout_func("heads/e2e_tv", mode="rs"))``.
    """
    return BebopRollout(head=head, spec=SpecConfig(mode, speculate_k), logprobs=logprobs, token_stats=token_stats,
                        seed=seed, backend=backend)


def train_head_on_policy(trainer, out_dir: str | Path, num_prompts: int = 64, samples_per_prompt: int = 4,
                         config=None, seed: int = 0) -> Path:
    """Trains an MTP head on the trainer's policy's own samples (as ``bebop train-mtp`` does) and saves it.

    Samples ``samples_per_prompt`` completions of the first ``num_prompts`` training prompts with the
    trainer's sampling settings (Bebop's engine backend, plain decoding), then runs
    ``bebop.mtp.train.train_mtp`` (default: e2e-TV, with its CE warm-up when the head starts from the
    backbone's last layer). Call it before ``trainer.train()``, with ``out_dir`` the head path given to
    ``bebop_rollout_func``; under several processes every rank calls it and draws the same samples (the
    head's batches are sharded).

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
    sampling, eos_ids = sampling_params(trainer, model)
    tokenizer = text_tokenizer(trainer)
    prompts = list(trainer.train_dataset["prompt"][:num_prompts])
    prompt_ids = prompt_token_ids(trainer, prompts)
    was_training, trainable = model.training, [p.requires_grad for p in model.parameters()]
    model.eval()
    try:
        sampler = make_backend("engine", model, tokenizer)
        result = sampler.rollout(prompt_ids, sampling, SpecConfig("none"), group_size=samples_per_prompt, seed=seed)
        result = result.cut_after(eos_ids, tokenizer)
        rows = [p + c for p, c in zip(result.prompt_ids, result.token_ids)]
        data = Sequences(rows, [len(p) for p in result.prompt_ids])
        train_mtp(model, data, out_dir, config or TrainMtpConfig(), pad_id=tokenizer.pad_token_id,
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


def generation_config(trainer, model):
    """The GenerationConfig TRL's generate runs with: the trainer's, its unset fields filled from the
    model's own and then transformers' defaults (as ``model.generate`` fills them)."""
    config, _ = model._prepare_generation_config(trainer.generation_config)
    return config


def sampling_params(trainer, model) -> tuple[SamplingParams, set[int]]:
    """The sampling settings TRL's generate would use, as Bebop's, and the EOS ids that end a completion.

    Raises BebopError (one line naming what to remove) for any setting Bebop cannot reproduce exactly.
    """
    check_lossless_verification(trainer.args, "GRPOConfig")  # NOTE: a lossy verifier is refused before all else
    if getattr(trainer, "use_vllm", False):
        raise BebopError("bebop_rollout_func samples on the trainer's own model: set use_vllm=False in GRPOConfig")
    if problem := temperature_problem(trainer.temperature, greedy_ok=False, name="GRPOConfig temperature"):
        raise BebopError(f"{problem}: TRL's loss divides the policy's logits by it (for greedy rollouts set "
                         "generation_kwargs={'do_sample': False})")
    from transformers import GenerationConfig

    config = generation_config(trainer, model)
    fields = GenerationConfig().to_dict()  # NOTE: generate ignores a config's other (custom) entries
    changed = []
    for name, value in config.to_dict().items():
        meaning = GENERATION_FIELDS.get(name, None if name in fields else NO_EFFECT)
        if (meaning is None and value is not None) or (callable(meaning) and not meaning(value)):
            changed.append(f"{name}={value!r}")
    if changed:
        raise BebopError(f"Bebop's rollouts cannot reproduce these settings of TRL's generate exactly: "
                         f"{', '.join(changed)}; remove them from GRPOConfig and its generation_kwargs")
    return _distribution(config), _eos_ids(config, text_tokenizer(trainer))


def _distribution(config) -> SamplingParams:
    """Temperature, top-k, top-p and length as transformers applies them (only when sampling)."""
    if config.max_new_tokens is None or config.max_new_tokens < 1:
        raise BebopError(f"max_new_tokens={config.max_new_tokens!r}: set max_completion_length in GRPOConfig")
    if config.do_sample is not True:
        return SamplingParams(temperature=0.0, max_new_tokens=config.max_new_tokens)
    temperature, top_k, top_p = config.temperature, config.top_k, config.top_p
    # NOTE: transformers leaves a warper out at its "off" value and refuses the rest, as TRL's generate would
    if temperature not in (None, 1.0) and (problem := temperature_problem(temperature, greedy_ok=False)):
        trl_refuses = not isinstance(temperature, float) or not 0 < temperature < float("inf")
        why = "TRL's generate refuses it (a float > 0)" if trl_refuses else problem
        raise BebopError(f"temperature={temperature!r} with do_sample=True: {why}; for greedy rollouts set "
                         "generation_kwargs={'do_sample': False}")
    if top_k not in (None, 0) and not (isinstance(top_k, int) and top_k > 0):
        raise BebopError(f"top_k={top_k!r}: TRL's generate refuses it (0 = off, else an int > 0)")
    if top_p is not None and top_p < 0:
        raise BebopError(f"top_p={top_p!r}: TRL's generate refuses it (0 <= top_p <= 1)")
    top_p = 1.0 if top_p is None or top_p >= 1.0 else float(top_p)
    top_k = top_k or 0
    if top_p == 0.0:  # NOTE: transformers keeps at least one token: top-p 0 samples the most likely token only
        top_k, top_p = 1, 1.0
    return SamplingParams(temperature=1.0 if temperature is None else float(temperature), top_k=top_k, top_p=top_p,
                          max_new_tokens=config.max_new_tokens)


def _eos_ids(config, tokenizer) -> set[int]:
    """The ids generate stops at: the generation config's EOS ids (TRL puts the tokenizer's among them)."""
    ids = config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return {int(i) for i in ids} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def text_tokenizer(trainer):
    """The trainer's tokenizer (a processor's own tokenizer when TRL was given a processor)."""
    return getattr(trainer.processing_class, "tokenizer", trainer.processing_class)


def prompt_token_ids(trainer, prompts: list) -> list[list[int]]:
    """The prompts tokenized exactly as the trainer's own generation tokenizes them (chat template, tools)."""
    prompt_ids, images, multimodal = trainer._tokenize_prompts(prompts)
    if images is not None or multimodal:
        raise BebopError("bebop_rollout_func takes text prompts only; this batch has images or multimodal fields")
    return [list(map(int, ids)) for ids in prompt_ids]


# ----------------------------------------------------------------------------- what ran


def log_metrics(trainer, split: str, result: Completions, seconds: float, decision=None) -> dict[str, float]:
    """Appends a rollout's statistics (every process's, ``gather_completions``) to TRL's metrics, as
    ``scalar_metrics`` spells them; with mode/K auto, the setting ``decision`` chose."""
    metrics = result.stats.to_metrics()
    if not result.token_stats:  # NOTE: what the backend cannot measure is NaN, which TRL logs as null
        metrics.update({key: [None] * len(value) if isinstance(value, list) else None
                        for key, value in metrics.items() if key in ABSENT_WITHOUT_TOKEN_STATS})
    metrics["spec/rollout_seconds"] = seconds
    if decision is not None:
        auto = decision.to_metrics()
        metrics.update({key: value for key, value in auto.items() if key != "auto/mode"},
                       **{f"auto/mode/{mode}": float(mode == auto["auto/mode"]) for mode in MODES},
                       **{"auto/measured_tok_s": decision.measured_tok_s})
    metrics = scalar_metrics(metrics)
    for key, value in metrics.items():
        trainer._metrics[split][key].append(value)
    return metrics


def rollout_record(rollout: BebopRollout, sampling: SamplingParams, eos_ids: set[int], seed: int) -> dict:
    """What ``bebop_rollout.json`` holds: mode, K, backend, the head and the loss it was trained with (which
    place the run for ``bebop report``), and the sampling settings read from the trainer."""
    record = {"trainer": "trl", "mode": rollout.spec.mode, "speculate_k": rollout.spec.speculate_k,
              "backend": rollout.backend, "mtp": None, "mtp_loss": None, "seed": seed,
              "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                           "max_new_tokens": sampling.max_new_tokens, "eos_token_ids": sorted(eos_ids)}}
    if isinstance(rollout.head, (str, Path)):
        from bebop.mtp.head import CONFIG_NAME

        record["mtp"] = str(rollout.head)
        saved = read_json(Path(rollout.head) / CONFIG_NAME, "MTP head config")
        record["mtp_loss"] = (saved.get("train") or {}).get("loss") if isinstance(saved, dict) else None
    return record


__all__ = ["BebopRollout", "bebop_rollout_func", "generation_config", "sampling_params", "train_head_on_policy"]

"""The settings of each ``bebop`` command that are not a library config: paths, the model, and
the settings of generate, eval-mtp, import/export and the demo.

One small frozen dataclass per concern, every field declared with ``bebop.config.option`` (help,
choices, check, the role of a path), a shared ``bebop.config.Setting``, or a ``bebop.config.group``
(generate's sampling and spec settings); ``bebop.cli`` builds every subcommand's flags from these
classes and the library's configs (``TrainMtpConfig``, ``RLConfig``, ``LosslessOptions``). Nothing
here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bebop.architectures import supported_families
from bebop.config import (
    BACKEND,
    DEFAULT_DRAFT_LOSS,
    DRAFT_LOSS_NAMES,
    SEED,
    TOKENIZER,
    fixed_speculate_k,
    group,
    integer_in,
    option,
)
from bebop.mtp.config import CHAIN_CONTEXTS, LOSS_TEMPERATURE
from bebop.speculative.settings import ROLLOUT_SPEC, SamplingParams, SpecConfig

NUM_CPUS = os.cpu_count() or 1  # more torch threads than CPUs only slows a step (and very many crash torch)
OVERWRITE_HELP = "if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first"
DTYPE_HELP = ("weights and activations: auto (bfloat16 on CUDA, float32 on CPU), float32 or bfloat16; "
              "losses, acceptance statistics and sampling probabilities are float32 either way")
THREADS_HELP = ("CPU threads for torch's intra-op parallelism (default: torch's choice); on a busy machine one "
                "thread can be several times faster than two; results such as pretrained weights repeat bit "
                "for bit only at the same thread count")


@dataclass(frozen=True)
class ProcessOptions:
    """How the process runs (every command)."""

    threads: int | None = option(None, THREADS_HELP, parse=int,
                                 check=integer_in(1, NUM_CPUS, note=" (this machine's CPUs)"))


@dataclass(frozen=True)
class ModelOptions:
    """The model and the head a command runs on."""

    model: str | None = option(None, "HF causal LM directory (default: the embedded model, trained on first use); "
                               f"supported: {supported_families()}", parse=str, role="input")
    mtp: str | None = option(None, "MTP head directory (default: the embedded model's cached e2e_tv head)",
                             parse=str, role="input")
    tokenizer: str | None = TOKENIZER.field()


@dataclass(frozen=True)
class DeviceOptions:
    """Where and in which dtype the model runs."""

    device: str = option("auto", "cpu, cuda, cuda:N or auto (CUDA when present)")
    dtype: str = option("auto", DTYPE_HELP)


@dataclass(frozen=True)
class PretrainOptions:
    """``bebop pretrain``: the embedded model's training (None: ``bebop.embedded.PretrainConfig``'s default)."""

    out: str | None = option(None, "output directory (default: the cache location every command reads)",
                             parse=str, role="output_dir")
    steps: int | None = option(None, "optimizer steps (default 1200)", parse=int, check=integer_in(1))
    seed: int | None = SEED.field(default=None)
    eval_problems: int | None = option(None, "held-out problems sampled to measure accuracy (default 256)",
                                       parse=int, check=integer_in(1))
    device: str = option("auto", "cpu, cuda, cuda:N or auto (CUDA when present)")
    dtype: str | None = option(None, "weights while training: float32 (default; the cached model's) or bfloat16 / "
                               "auto (bfloat16 on CUDA), with float32 master weights; saved in float32 either way",
                               parse=str)
    overwrite: bool = option(False, OVERWRITE_HELP)


@dataclass(frozen=True)
class TrainMtpOptions:
    """``bebop train-mtp``'s data and head directory (how the head trains: ``TrainMtpConfig``)."""

    data: str | None = option(None, "JSONL of {token_ids, start} (generate's output), {text} or {prompt, completion} "
                              "rows (default: self-generated embedded data)", parse=str, role="input")
    out: str | None = option(None, "output directory for the head (default: the embedded head cache)", parse=str,
                             role="output_dir")
    num_sequences: int | None = option(None, "self-generated embedded sequences when no --data (default 2048; used "
                                       "when first cached)", parse=int, check=integer_in(1))
    resume: bool = option(False, "continue from OUT/checkpoint with its settings (flags may change only --steps, "
                          "--save-every and --log-every)")
    overwrite: bool = option(False, OVERWRITE_HELP)
    fsdp: bool = option(False, "under torchrun: shard the backbone's decoder layers and the head over the processes "
                        "(FSDP2), for a backbone that does not fit one device")


@dataclass(frozen=True)
class ImportMtpOptions:
    """``bebop import-mtp``: a checkpoint's native MTP layer, saved as a head."""

    model: str | None = option(None, "HF model directory with a native MTP layer", parse=str, required=True,
                               role="input")
    tokenizer: str | None = TOKENIZER.field()
    out: str | None = option(None, "output head directory (weights in --dtype)", parse=str, required=True,
                             role="output_dir")
    overwrite: bool = option(False, OVERWRITE_HELP)


@dataclass(frozen=True)
class ExportMtpOptions:
    """``bebop export-mtp``: a model directory with the head as its native MTP layer."""

    out: str | None = option(None, "output model directory (new or empty; never the model or the head)", parse=str,
                             required=True, role="output_dir")
    format: str = option("auto", "MTP layout to write: auto (the backbone's family) or a family name; an unknown "
                         "name is refused with the list")
    overwrite: bool = option(False, OVERWRITE_HELP)


@dataclass(frozen=True)
class EvalMtpOptions:
    """``bebop eval-mtp``: exact acceptance of a head along teacher-forced chains."""

    loss: str = option(DEFAULT_DRAFT_LOSS, "which cached embedded head to use when --mtp is not given",
                       choices=DRAFT_LOSS_NAMES)
    data: str | None = option(None, "JSONL evaluation data (default: held-out self-generated embedded data)",
                              parse=str, role="input")
    speculate_k: int = option(3, "draft depth K", check=fixed_speculate_k)
    temperature: float = LOSS_TEMPERATURE.field()
    chain_context: str = option("served", "what draft steps >= 2 attend to: served (the engine's context; one-layer "
                                "heads) or unrolled", choices=CHAIN_CONTEXTS)
    num_sequences: int | None = option(None, "held-out self-generated sequences when no --data (default 256; used "
                                       "when first cached)", parse=int, check=integer_in(1))
    json: str | None = option(None, "write the result as JSON here", parse=str, role="output_file")


@dataclass(frozen=True)
class GenerateOptions:
    """``bebop generate``: which prompts, how they are sampled (the groups of ``bebop.speculative.settings``),
    and where completions go."""

    prompts: str | None = option(None, "JSONL/parquet with a 'prompt' field (text or chat messages, as rl --data "
                                 "reads it), or a text file with one prompt per line", parse=str, role="input")
    num_prompts: int = option(16, "embedded-task prompts when --prompts is not given", check=integer_in(1))
    sampling: SamplingParams = group(SamplingParams())  # temperature, top-k, top-p, max new tokens, stop
    spec: SpecConfig = group(ROLLOUT_SPEC, skip=("draft_temperature",))  # mode, K, filter drafts, verify, chains
    seed: int = SEED.field()
    out: str | None = option(None, "output JSONL, one line per completion (prompt, completion, token_ids = prompt + "
                             "completion ids, start): train-mtp --data as is", parse=str, required=True,
                             role="output_file")
    stats_json: str | None = option(None, "write speculative-decoding statistics here", parse=str,
                                    role="output_file")
    auto_profile: str | None = option(None, "with mode or K auto: JSON file that keeps what auto learned between "
                                      "calls (default: one per model, head, device and sampling under "
                                      "$BEBOP_CACHE_DIR/auto-profiles; none: start from nothing)", parse=str,
                                      role="output_file")
    backend: str = BACKEND.field()


@dataclass(frozen=True)
class RunOptions:
    """``bebop rl``'s run directory (what the run does: ``RLConfig``)."""

    out: str | None = option(None, "run directory (config.json, metrics.jsonl, checkpoint/)", parse=str,
                             role="output_dir")
    resume: str | None = option(None, "continue the run in RUN_DIR from its last checkpoint", parse=str,
                                metavar="RUN_DIR")
    overwrite: bool = option(False, OVERWRITE_HELP)


@dataclass(frozen=True)
class DemoOptions:
    """``bebop demo``: the whole recipe on the embedded model."""

    quick: bool = option(False, "smoke-test budgets (about 3 minutes)")
    out: str | None = option(None, "output directory (default demo_out); an existing one is continued", parse=str,
                             role="output_dir")
    overwrite: bool = option(False, "if OUT exists and is not empty, move it aside to NAME.old-<timestamp> and "
                             "start afresh")

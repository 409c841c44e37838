"""The ``bebop`` command: its parser and ``main``; what each subcommand does is in ``bebop.commands``.

Every subcommand runs with no model arguments on the embedded default model (trained and cached
on first use). Errors caused by input print one line and exit with status 2. Every flag, file and
output path is checked before any output is created or changed; a non-empty output directory is
written into only with ``--resume`` or ``--overwrite`` (which moves it aside, never deletes it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from bebop.architectures import supported_families
from bebop.commands import (
    cmd_check_lossless,
    cmd_demo,
    cmd_eval_mtp,
    cmd_export_mtp,
    cmd_generate,
    cmd_import_mtp,
    cmd_pretrain,
    cmd_report,
    cmd_rl,
    cmd_train_mtp,
)
from bebop.config import AUTO_EVERY, DEFAULT_DRAFT_LOSS, VERIFY_CHOICES, flags_of, seed_value, speculate_k_value
from bebop.mtp.config import CHAIN_CONTEXTS, TrainMtpConfig
from bebop.rl.config import config_fields
from bebop.utils.io import BebopError


def _add_model_args(p: argparse.ArgumentParser, mtp: bool = True) -> None:
    p.add_argument("--model", help="HF causal LM directory (default: the embedded model, trained on first use); "
                                   f"supported: {supported_families()}")
    if mtp:
        p.add_argument("--mtp", help="MTP head directory (default: the embedded model's cached e2e_tv head)")
    _add_device_args(p)


DTYPE_HELP = ("weights and activations: auto (bfloat16 on CUDA, float32 on CPU; default), float32 or bfloat16; "
              "losses, acceptance statistics and sampling probabilities are float32 either way")


def _add_device_args(p: argparse.ArgumentParser, dtype_default: str | None = "auto",
                     dtype_help: str = DTYPE_HELP) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when present; default: auto)")
    p.add_argument("--dtype", default=dtype_default, help=dtype_help)


def _add_config_flags(p: argparse.ArgumentParser, flags: dict) -> None:
    """One flag per config field (``bebop.config.flags_of``: help, type, choices); an unset flag is None,
    so the config file's value or the field's default stays."""
    for name, flag in flags.items():
        names = ["--" + name.replace("_", "-"), *flag.aliases]
        if flag.type is bool:
            p.add_argument(*names, dest=name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{flag.help} (default {flag.default})")
        else:
            p.add_argument(*names, dest=name, type=flag.type, default=None, choices=flag.choices or None,
                           help=f"{flag.help} (default {flag.default!r})")


def _add_overwrite_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")


def _add_backend_arg(p: argparse.ArgumentParser, what: str = "that samples: engine (Bebop's) or vllm") -> None:
    from bebop.rollout.base import BACKENDS, DEFAULT_BACKEND

    p.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT_BACKEND,
                   help=f"rollout engine {what} (default {DEFAULT_BACKEND}; vllm needs the vllm extra)")


# ---------------------------------------------------------------------------------------------- parser
def _add_verify_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", choices=VERIFY_CHOICES, default="token",
                   help="how mode rs verifies a drafted chain: token (token-wise, default) or block (jointly, "
                        "Sun et al. 2024: exact, never fewer accepted drafts in expectation; engine backend only)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bebop", description="Faster RL rollouts for LLMs, exactly: MTP drafts verified by rejection sampling.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pretrain", help="train the embedded default model on the embedded task")
    p.add_argument("--out", help="output directory (default: the cache location every command reads)")
    p.add_argument("--steps", type=int, help="optimizer steps (default 1200)")
    p.add_argument("--seed", type=seed_value, help="seed for init and data (default 0)")
    p.add_argument("--eval-problems", type=int, help="held-out problems sampled to measure accuracy (default 256)")
    _add_device_args(p, dtype_default=None, dtype_help="weights while training: float32 (default; the cached model's) "
                     "or bfloat16 / auto (bfloat16 on CUDA), with float32 master weights; saved in float32 either way")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("train-mtp", help="train an MTP draft head on a frozen model")
    _add_model_args(p, mtp=False)
    p.add_argument("--config", help="TOML/YAML file of TrainMtpConfig fields (flags override it)")
    p.add_argument("--data", help="JSONL of {token_ids, start} (generate's output), {text} or {prompt, completion} "
                                  "rows (default: self-generated embedded data)")
    p.add_argument("--out", help="output directory for the head (default: the embedded head cache)")
    _add_config_flags(p, flags_of(TrainMtpConfig))
    p.add_argument("--num-sequences", type=int,
                   help="self-generated embedded sequences when no --data (default 2048; used when first cached)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint with its settings (flags may change only --steps, --save-every "
                        "and --log-every)")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard the backbone's decoder layers and the head over the processes "
                        "(FSDP2), for a backbone that does not fit one device")
    p.set_defaults(func=cmd_train_mtp)

    p = sub.add_parser("import-mtp", help="save the MTP layer a checkpoint ships (Qwen3.5, Qwen3-Next, DeepSeek-V3, "
                                          "GLM-4.5, MiMo) as a Bebop head")
    p.add_argument("--model", required=True, help="HF model directory with a native MTP layer")
    p.add_argument("--out", required=True, help="output head directory (weights in --dtype)")
    _add_device_args(p)
    _add_overwrite_arg(p)
    p.set_defaults(func=cmd_import_mtp)

    p = sub.add_parser("export-mtp", help="write a model directory with the head as its native MTP layer, "
                                          "for vLLM and SGLang")
    _add_model_args(p)
    p.add_argument("--out", required=True, help="output model directory (new or empty; never the model or the head)")
    p.add_argument("--format", default="auto",
                   help="MTP layout to write: auto (the backbone's family, default) or a family name; an unknown "
                        "name is refused with the list")
    _add_overwrite_arg(p)
    p.set_defaults(func=cmd_export_mtp)

    p = sub.add_parser("eval-mtp", help="exact RS/TO acceptance of a head along teacher-forced chains "
                                        "(RS token-wise and with block verification)")
    _add_model_args(p)
    p.add_argument("--loss", default=DEFAULT_DRAFT_LOSS, help="which cached embedded head to use when --mtp is not given")
    p.add_argument("--data", help="JSONL evaluation data (default: held-out self-generated embedded data)")
    p.add_argument("--speculate-k", type=int, default=3, help="draft depth K (default 3)")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of p and q (default 1)")
    p.add_argument("--chain-context", choices=CHAIN_CONTEXTS, default="served",
                   help="what draft steps >= 2 attend to: served (the engine's context, default; one-layer heads) "
                        "or unrolled")
    p.add_argument("--num-sequences", type=int,
                   help="held-out self-generated sequences when no --data (default 256; used when first cached)")
    p.add_argument("--json", help="write the result as JSON here")
    p.set_defaults(func=cmd_eval_mtp)

    p = sub.add_parser("generate", help="generate completions (plain, target-only or rejection sampling)")
    _add_model_args(p)
    p.add_argument("--prompts", help="JSONL/parquet with a 'prompt' field (text or chat messages, as rl --data "
                                     "reads it), or a text file with one prompt per line")
    p.add_argument("--num-prompts", type=int, default=16, help="embedded-task prompts when --prompts is not given")
    p.add_argument("--mode", choices=["none", "to", "rs", "auto"], default="rs",
                   help="verification mode; auto: the fastest predicted after short probes (default rs)")
    p.add_argument("--speculate-k", type=speculate_k_value, default=3,
                   help="drafts per verify step, or auto (1-4, the fastest predicted) (default 3)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="top-k on the target, 0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p on the target, 1 = off")
    _add_verify_arg(p)
    p.add_argument("--filter-drafts", action="store_true",
                   help="apply --top-k/--top-p to the draft distribution q too (drafts and verification; exact)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="completion length limit (default 64)")
    p.add_argument("--stop", action="append", help="stop string, non-empty (repeatable)")
    p.add_argument("--seed", type=seed_value, default=0, help="seed (default 0)")
    p.add_argument("--out", required=True, help="output JSONL, one line per completion (prompt, completion, "
                                                "token_ids = prompt + completion ids, start): train-mtp --data as is")
    p.add_argument("--stats-json", help="write speculative-decoding statistics here")
    p.add_argument("--auto-profile",
                   help="with mode or K auto: JSON file that keeps what auto learned between calls; a call with a "
                        f"profile probes every {AUTO_EVERY}th call (and after a setting's first choice) and keeps the "
                        "last probe's choice in between "
                        "(default: one per model, head, device and sampling under $BEBOP_CACHE_DIR/auto-profiles; "
                        "none: start from nothing)")
    _add_backend_arg(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("check-lossless", help="chi-square checks that speculative sampling equals plain sampling, "
                                              "and plain sampling the model's own forward pass")
    _add_model_args(p)
    p.add_argument("--samples", type=int, default=10_000,
                   help="completions per configuration, each of up to 3K+3 tokens (default 10000)")
    p.add_argument("--prompts", help="prompt file (the first prompt is tested; the others are mixed into batches); "
                                     "default: five-term task prompts, whose continuations branch early")
    p.add_argument("--alpha", type=float, default=3e-4, help="false-alarm probability of each check (default 3e-4)")
    p.add_argument("--seed", type=seed_value, default=0, help="seed (default 0)")
    _add_verify_arg(p)
    _add_backend_arg(p, "whose speculative sampling is judged: engine (Bebop's) or vllm (against vLLM's own plain "
                        "sampling and Bebop's, K=3, T 1 and 0.7, top-k/top-p)")
    p.set_defaults(func=cmd_check_lossless)

    p = sub.add_parser("rl", help="GRPO with speculative rollouts (frozen or online MTP head)")
    _add_model_args(p)
    p.add_argument("--config", help="TOML/YAML file of RL settings (flags override it)")
    p.add_argument("--out", help="run directory (config.json, metrics.jsonl, checkpoint/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")
    _add_config_flags(p, config_fields())
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("report", help="markdown report with tables and plots from RL run directories")
    p.add_argument("runs", nargs="+", help="run directories written by `bebop rl`, or TRL output directories")
    p.add_argument("--out", help="output directory for report.md and the PNG plots (default for one run: RUN/report)")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")
    p.add_argument("--eval", action="append", metavar="JSON",
                   help="`bebop eval-mtp --json` result for the head-evaluation section (repeatable)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="the whole recipe on the embedded model, with the paper's analyses")
    p.add_argument("--quick", action="store_true", help="smoke-test budgets (about 3 minutes)")
    p.add_argument("--out", help="output directory (default demo_out); an existing one is continued")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> and start afresh")
    _add_device_args(p)
    p.set_defaults(func=cmd_demo)
    for command in sub.choices.values():
        command.add_argument("--threads", type=int, help=THREADS_HELP)
    return parser


THREADS_HELP = ("CPU threads for torch's intra-op parallelism (default: torch's choice); on a busy machine one "
                "thread can be several times faster than two; results such as pretrained weights repeat bit "
                "for bit only at the same thread count")


def _set_threads(threads: int | None) -> None:
    if threads is None:
        return
    if threads < 1:
        raise BebopError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


DATA_PARALLEL_COMMANDS = ("train-mtp", "eval-mtp", "rl")  # what torchrun may start as several processes


@contextlib.contextmanager
def _data_parallel(args):
    """Under torchrun: joins the process group for a data-parallel command (others are refused) and
    silences ranks other than 0 (errors are still printed by ``main``); without torchrun, nothing."""
    from bebop.utils import distributed

    if not distributed.launched():
        yield
        return
    if args.command not in DATA_PARALLEL_COMMANDS:
        raise BebopError(f"`bebop {args.command}` runs as one process; under torchrun only "
                         f"{', '.join(DATA_PARALLEL_COMMANDS)} do")
    from bebop.utils.torch_utils import resolve_device

    started = not distributed.initialized()  # NOTE: a caller that joined the group itself keeps it
    distributed.init_distributed(resolve_device(getattr(args, "device", None)))
    quiet = open(os.devnull, "w") if not distributed.is_main() else None
    with contextlib.redirect_stdout(quiet) if quiet else contextlib.nullcontext(), \
            contextlib.redirect_stderr(quiet) if quiet else contextlib.nullcontext():
        yield
    distributed.barrier()
    if started:
        distributed.close_distributed()


def _error_prefix() -> str:
    """``rank R: `` under torchrun with several ranks, else nothing."""
    from bebop.utils import distributed

    return f"rank {distributed.rank()}: " if distributed.world_size() > 1 else ""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _set_threads(args.threads)
        with _data_parallel(args):
            status = args.func(args)
    except (BebopError, ValueError, FileNotFoundError) as e:
        # NOTE: library checks on user input (shapes, NaN logits, missing files) raise these; one line
        # each, exit 2. BEBOP_DEBUG=1 shows the traceback instead.
        if os.environ.get("BEBOP_DEBUG"):
            raise
        print(f"bebop: error: {_error_prefix()}{str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - only a failed collective is turned into one line
        from bebop.utils import distributed

        if distributed.world_size() == 1 or not _is_collective_error(e) or os.environ.get("BEBOP_DEBUG"):
            raise
        print(f"bebop: error: {distributed.lost_rank_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bebop: interrupted", file=sys.stderr)
        return 130
    return status or 0


def _is_collective_error(error: BaseException) -> bool:
    """A torch.distributed failure: a peer's closed connection, a timeout, a store that went away."""
    import torch.distributed as dist

    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and any(
        word in str(error) for word in ("Connection closed", "Connection reset", "Timed out", "timed out")))


if __name__ == "__main__":
    sys.exit(main())

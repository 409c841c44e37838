"""The ``bebop`` command: its parser and ``main``; what each subcommand does is in ``bebop.commands``.

Every subcommand's flags are built from its settings (``COMMANDS``: the dataclasses of
``bebop.options``, ``TrainMtpConfig``, ``RLConfig``, ``LosslessOptions``; help, choices and
check declared once in each field), and every subcommand but report takes ``--config FILE``, a
TOML/YAML table of the same settings (defaults < file < flags). Every subcommand runs with no
model arguments on the embedded default model (trained and cached on first use). Errors caused
by input print one line and exit with status 2. Every flag, file and output path is checked
before any output is created or changed; a non-empty output directory is written into only with
``--resume`` or ``--overwrite`` (which moves it aside, never deletes it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from typing import Callable, NamedTuple

from bebop import __version__
from bebop.check.config import LosslessOptions
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
from bebop.config import Flag, flags_of, flat_keys, flatten, merge_sources, resolve
from bebop.mtp.config import TrainMtpConfig
from bebop.options import (
    DemoOptions,
    DeviceOptions,
    EvalMtpOptions,
    ExportMtpOptions,
    GenerateOptions,
    ImportMtpOptions,
    ModelOptions,
    PretrainOptions,
    ProcessOptions,
    RunOptions,
    TrainMtpOptions,
)
from bebop.rl.config import config_fields
from bebop.utils.allocator import return_large_blocks
from bebop.utils.errors import BebopError
from bebop.utils.outputs import check_output_file


class Command(NamedTuple):
    """A subcommand: its help, its function, and the settings its flags are built from."""

    help: str
    func: Callable
    options: tuple[type, ...]  # dataclasses resolved here: defaults < --config file < flags, then checked
    skip: tuple[str, ...] = ()  # fields of ``options`` this command does not take
    library: Callable[[], dict[str, Flag]] | None = None  # a library config's flags, resolved by the command
    config_file: bool = True  # takes --config


MODEL = (ModelOptions, DeviceOptions)
COMMANDS = {
    "pretrain": Command("train the embedded default model on the embedded task", cmd_pretrain, (PretrainOptions,)),
    "train-mtp": Command("train an MTP draft head on a frozen model", cmd_train_mtp, (*MODEL, TrainMtpOptions),
                         skip=("mtp",), library=lambda: flags_of(TrainMtpConfig)),
    "import-mtp": Command("save the MTP layer a checkpoint ships (Qwen3.5, Qwen3-Next, DeepSeek-V3, GLM-4.5, MiMo, "
                          "Nemotron-H) as a Bebop head", cmd_import_mtp, (ImportMtpOptions, DeviceOptions)),
    "export-mtp": Command("write a model directory with the head as its native MTP layer, for vLLM and SGLang",
                          cmd_export_mtp, (*MODEL, ExportMtpOptions)),
    "eval-mtp": Command("exact RS/TO acceptance of a head along teacher-forced chains (RS token-wise and with "
                        "block verification)", cmd_eval_mtp, (*MODEL, EvalMtpOptions)),
    "generate": Command("generate completions (plain, target-only or rejection sampling)", cmd_generate,
                        (*MODEL, GenerateOptions)),
    "check-lossless": Command("chi-square checks that speculative sampling equals plain sampling, and plain "
                              "sampling the model's own forward pass; exit 0 lossless, 1 not lossless, "
                              "3 inconclusive", cmd_check_lossless, (*MODEL, LosslessOptions)),
    "rl": Command("GRPO with speculative rollouts (frozen or online MTP head)", cmd_rl, (*MODEL, RunOptions),
                  library=config_fields),
    "report": Command("markdown report with tables and plots from RL run directories", cmd_report, (),
                      config_file=False),
    "demo": Command("the whole recipe on the embedded model, with the paper's analyses", cmd_demo,
                    (DemoOptions, DeviceOptions)),
}


def _settings(command: Command) -> dict[str, Flag]:
    """Every setting of ``command`` as a flag: its option classes' fields (but ``skip``), the library
    config's, and the process's (--threads)."""
    flags = {}
    for cls in (*command.options, ProcessOptions):
        flags.update(flags_of(cls, skip=command.skip))
    flags.update(command.library() if command.library else {})
    return flags


def _flag_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """``parse`` for argparse: a builtin type keeps argparse's own message; another parser's ValueError
    becomes the flag's error line."""
    if parse in (int, float, str):
        return parse

    def typed(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def _add_flags(p: argparse.ArgumentParser, flags: dict[str, Flag]) -> None:
    """One flag per setting; an unset flag is None, so the config file's value or the default stays."""
    for name, flag in flags.items():
        names = ["--" + name.replace("_", "-"), *flag.aliases]
        default = "required" if flag.required else f"default {flag.default!r}" if flag.default not in (None, ()) \
            else ""
        help_text = f"{flag.help} ({default})" if default else flag.help
        if flag.type is bool:
            p.add_argument(*names, dest=name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{flag.help} (default {flag.default})")
        elif isinstance(flag.default, tuple):
            p.add_argument(*names, dest=name, action="append", default=None, help=help_text)
        else:
            p.add_argument(*names, dest=name, type=_flag_type(flag.type), default=None,
                           choices=flag.choices or None, metavar=flag.metavar, help=help_text)


def _add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run directories written by `bebop rl`, or TRL output directories")
    p.add_argument("--out", help="output directory for report.md and the PNG plots (default for one run: RUN/report)")
    p.add_argument("--overwrite", action="store_true",
                   help="if OUT exists and is not empty, move it aside to NAME.old-<timestamp> first")
    p.add_argument("--eval", action="append", metavar="JSON",
                   help="`bebop eval-mtp --json` result for the head-evaluation section (repeatable)")


class _SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: a flag it does not know is refused here, with this subcommand's usage
    (argparse would hand it to the top-level parser, whose usage names no flag of the subcommand)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    """The ``bebop`` parser. No parser takes an abbreviated flag (``allow_abbrev=False``): ``--max-new-tok``
    would otherwise be taken as ``--max-new-tokens``, and a flag added later could change what it means."""
    parser = argparse.ArgumentParser(
        prog="bebop", description="Faster RL rollouts for LLMs, exactly: MTP drafts verified by rejection sampling.",
        allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"bebop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help, allow_abbrev=False)
        if name == "report":
            _add_report_args(p)
        if command.config_file:
            p.add_argument("--config", help="TOML/YAML file of this command's settings, the keys of its flags "
                                            "(e.g. model = \"./my-model\"); flags override it")
        _add_flags(p, _settings(command))
        p.set_defaults(func=command.func)
    return parser


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """The command's settings from defaults < its --config file < its flags, every value checked.

    Option classes are resolved and checked here (``bebop.config.resolve``): each flat key, and each
    embedded group whole (``generate``'s ``sampling`` and ``spec``); a library config's keys
    (``TrainMtpConfig``, ``RLConfig``) keep only what the file or a flag gave (None otherwise): the
    command resolves them, so a resumed run can tell a given value from a default.
    """
    command = COMMANDS[args.command]
    flags = _settings(command)
    given = merge_sources(getattr(args, "config", None), {name: getattr(args, name) for name in flags}, list(flags))
    values = {name: given.get(name) for name in flags}
    for cls in (*command.options, ProcessOptions):
        resolved = resolve(cls, None, {name: given.get(name) for name in flat_keys(cls)})
        flat = flatten(resolved)
        values.update({name: flat[name] for name in flags_of(cls, skip=command.skip)})
        values.update({f.name: getattr(resolved, f.name) for f in dataclasses.fields(cls) if f.name not in flat})
    inputs = {**_paths(values, flags, "input"), **({"--config input": args.config} if getattr(args, "config", None)
                                                   else {})}
    outputs = _paths(values, flags, "output_file")
    for what, path in outputs.items():  # NOTE: output directories are checked by each command (resume, overwrite)
        check_output_file(path, what, {**inputs, **{k: v for k, v in outputs.items() if k != what}})
    return argparse.Namespace(**{**vars(args), **values, "inputs": tuple(inputs.values())})


def _paths(values: dict, flags: dict[str, Flag], role: str) -> dict[str, str]:
    """"--flag kind" -> path of every setting given with ``role`` (``bebop.config.PATH_ROLES``)."""
    kind = {"input": "input", "output_file": "file"}[role]
    return {f"--{name.replace('_', '-')} {kind}": values[name] for name, flag in flags.items()
            if flag.role == role and values.get(name)}


def _set_threads(threads: int | None) -> None:
    if threads is None:
        return
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
    return_large_blocks()  # NOTE: before any large tensor; the C allocator's heap otherwise keeps them
    args = build_parser().parse_args(argv)
    if not sys.stderr.isatty():  # NOTE: in a log file, no library's bar either (transformers' "Loading weights")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        args = resolve_args(args)
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

"""The ``bebop`` command: one thin subcommand per step of the recipe.

Every subcommand runs with no model arguments on the embedded default model (trained and cached
on first use). Errors caused by input print one line and exit with status 2. Every flag, file and
output path is checked before any output is created or changed; a non-empty output directory is
written into only with ``--resume`` or ``--overwrite`` (which moves it aside, never deletes it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path

from bebop.architectures import supported_families
from bebop.config import AUTO_EVERY, DEFAULT_DRAFT_LOSS, VERIFY_CHOICES, flags_of, is_auto, seed_value, speculate_k_value
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


def _load(args, need_mtp: bool, mtp_loss: str = DEFAULT_DRAFT_LOSS, split: str | None = None):
    """(model, tokenizer, head or None, sequences or None) from --model/--mtp/--data (``split`` of the
    embedded data when it is given), or the embedded defaults; on --device in --dtype."""
    from bebop import embedded, models
    from bebop.mtp import MtpHead
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    dtype = resolve_dtype(args.dtype, resolve_device(args.device))  # NOTE: before anything loads or pretrains
    # NOTE: the embedded model's cached heads and data are keyed by its float32 weights: they are found
    # (or built) on the float32 model, which is cast to --dtype after.
    model, tok = models.load_model(args.model, device=args.device,
                                   dtype=dtype if args.model else embedded.CACHE_DTYPE)
    path = None
    if need_mtp:
        if getattr(args, "mtp", None):
            path = Path(args.mtp)
        elif args.model is None:
            path = embedded.ensure_embedded_head(mtp_loss, model, tok)
        else:
            raise BebopError("--mtp is required with --model (train one with `bebop train-mtp --model ...`)")
    data = _sequences(args, model, tok, split) if split else None
    model.to(dtype)
    head = None
    if path is not None:
        head = MtpHead.from_pretrained(path, model).eval()
        for p in head.parameters():
            p.requires_grad_(False)
    return model, tok, head, data


def _sequences(args, model, tok, split: str):
    """--data as MTP sequences, or the embedded model's self-generated ``split`` when no --model is given."""
    from bebop import embedded
    from bebop.mtp.data import load_sequences

    if args.data:
        return load_sequences(args.data, tok, vocab_size=model.get_input_embeddings().num_embeddings,
                              max_positions=getattr(model.config.get_text_config(), "max_position_embeddings", None))
    if args.model is None:
        return embedded.embedded_data(split, model, tok, num=args.num_sequences)
    raise BebopError("--data is required with --model (a JSONL of text or prompt/completion rows)")


# ---------------------------------------------------------------------------------------------- pretrain
def cmd_pretrain(args) -> None:
    from bebop import embedded
    from bebop.utils.io import check_output_dir, entry_lock, output_dir

    overrides = {"steps": args.steps, "seed": args.seed, "device": args.device, "eval_problems": args.eval_problems,
                 "dtype": args.dtype}
    cfg = embedded.PretrainConfig(**{k: v for k, v in overrides.items() if v is not None})
    embedded.check_pretrain_config(cfg)
    out = Path(args.out) if args.out else embedded.embedded_model_dir()
    check_output_dir(out, overwrite=args.overwrite, what="model directory")
    # NOTE: the cache's lock, so a command building the cached model meanwhile waits instead of racing
    with entry_lock(out) if out == embedded.embedded_model_dir() else contextlib.nullcontext(), \
            output_dir(out, overwrite=args.overwrite, what="model directory"):
        summary = embedded.pretrain(out, cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))
    print(f"saved to {out}")


# ---------------------------------------------------------------------------------------------- train-mtp
def cmd_train_mtp(args) -> None:
    from bebop import embedded
    from bebop.config import resolve
    from bebop.mtp.train import saved_config, train_mtp
    from bebop.utils.io import check_output_dir

    flags = {name: getattr(args, name) for name in flags_of(TrainMtpConfig)}
    cfg = resolve(TrainMtpConfig, args.config, flags)
    out = Path(args.out) if args.out else embedded.embedded_head_dir(cfg.loss) if args.model is None else None
    if out is None:
        raise BebopError("--out is required with --model")
    if args.resume and not args.config:  # NOTE: a resume keeps the checkpoint's settings unless a flag changes them
        cfg = resolve(TrainMtpConfig, None, {**saved_config(out), **{k: v for k, v in flags.items() if v is not None}})
    check_output_dir(out, resume=args.resume, overwrite=args.overwrite, what="head directory")
    if args.data:
        _check_input_file(args.data, "data file")
    print("resolved config: " + json.dumps(dataclasses.asdict(cfg)), file=sys.stderr)
    # NOTE: with --fsdp the model loads on the CPU; train_mtp moves it to the GPUs shard by shard
    model, tok, _, data = _load(argparse.Namespace(**{**vars(args), "device": "cpu"}) if args.fsdp else args,
                                need_mtp=False, split="train")
    train_mtp(model, data, out, cfg, pad_id=tok.pad_token_id, resume=args.resume, overwrite=args.overwrite,
              model_dir=args.model, fsdp=args.fsdp)
    print(f"saved head to {out}")


# ---------------------------------------------------------------------------------------------- import-mtp / export-mtp
def cmd_import_mtp(args) -> None:
    from bebop import models
    from bebop.mtp.native import import_mtp, native_layout
    from bebop.utils.io import check_output_dir, output_dir
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    resolve_dtype(args.dtype, resolve_device(args.device))
    check_output_dir(args.out, overwrite=args.overwrite, what="head directory", inputs=(args.model,))
    native_layout(args.model)  # NOTE: checked before the (possibly large) model loads
    model, _ = models.load_model(args.model, device=args.device, dtype=args.dtype)
    head = import_mtp(args.model, model)
    with output_dir(args.out, overwrite=args.overwrite, what="head directory", inputs=(args.model,)):
        head.save_pretrained(args.out, extra={"imported_from": str(Path(args.model).resolve())})
    print(f"imported the {head.config.family} MTP layer of {args.model} to {args.out}")


def cmd_export_mtp(args) -> None:
    from bebop import embedded
    from bebop.mtp.native import export_mtp
    from bebop.utils.io import check_output_dir

    out = Path(args.out)
    check_output_dir(out, overwrite=args.overwrite, what="export directory", inputs=(args.model, args.mtp))
    if args.model is None:
        model_dir = embedded.ensure_embedded_model()
        head_dir = args.mtp or embedded.ensure_embedded_head(DEFAULT_DRAFT_LOSS)
    elif args.mtp is None:
        raise BebopError("--mtp is required with --model (a head trained by `bebop train-mtp --model ...`)")
    else:
        model_dir, head_dir = args.model, args.mtp
    export_mtp(model_dir, head_dir, out, fmt=args.format, overwrite=args.overwrite)
    print(f"wrote {out}: serve it with vLLM (speculative method \"mtp\") or SGLang (NEXTN); see the README")


# ---------------------------------------------------------------------------------------------- eval-mtp
def cmd_eval_mtp(args) -> None:
    from bebop.mtp.evaluate import acceptance_table, evaluate_mtp
    from bebop.utils.io import check_output_file, write_json

    if args.json:
        check_output_file(args.json, "--json file")
    if args.data:
        _check_input_file(args.data, "data file")
    model, tok, head, data = _load(args, need_mtp=True, mtp_loss=args.loss, split="eval")
    result = evaluate_mtp(model, head, data, speculate_k=args.speculate_k, temperature=args.temperature,
                          pad_id=tok.pad_token_id, chain_context=args.chain_context)
    print(acceptance_table({args.mtp or args.loss: result}))
    if args.json:  # with the head's own training loss, so `bebop report --eval` can label it
        loss = _head_loss(Path(args.mtp)) if args.mtp else args.loss
        write_json(args.json, {**result, "loss": loss or Path(args.mtp).name, "mtp": _abs(args.mtp)})


# ---------------------------------------------------------------------------------------------- generate
def _auto_profile(args, model, sampling, spec) -> tuple[Path, dict] | None:
    """(path, key) of generate's auto profile (``bebop.speculative.auto.profile``); None for --auto-profile none."""
    from bebop import embedded
    from bebop.speculative.auto import profile as profiles
    from bebop.utils.io import check_output_file

    if args.auto_profile == "none":
        return None
    mtp = args.mtp or (embedded.embedded_head_dir(DEFAULT_DRAFT_LOSS) if args.model is None else None)
    param = next(model.parameters())
    key = profiles.profile_key(args.model or embedded.embedded_model_dir(), mtp, param.device, param.dtype,
                               sampling, spec)
    path = Path(args.auto_profile) if args.auto_profile else profiles.default_path(key)
    check_output_file(path, "--auto-profile file")
    return path, key


def cmd_generate(args) -> None:
    from bebop.rollout.base import backend_class, make_backend
    from bebop.speculative import SamplingParams, SpecConfig
    from bebop.speculative.auto import profile as profiles
    from bebop.speculative.settings import verify_problem
    from bebop.speculative.settings import check_settings
    from bebop.utils.io import atomic_write_text, check_output_file, write_json
    from bebop.utils.tokens import encode_prompt

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              max_new_tokens=args.max_new_tokens, stop=tuple(args.stop or ()))
    check_settings(SpecConfig(mode=args.mode, speculate_k=args.speculate_k), sampling)
    auto = is_auto(args.mode, args.speculate_k)
    if auto and args.backend != "engine":
        raise BebopError("--mode/--speculate-k auto needs --backend engine (it reads the engine's step times)")
    if args.auto_profile and not auto:
        raise BebopError("--auto-profile needs --mode auto or --speculate-k auto")
    if problem := verify_problem(args.mode, args.verify, args.backend):
        raise BebopError(problem)
    check_output_file(args.out, "--out file")
    if args.stats_json:
        check_output_file(args.stats_json, "--stats-json file")
    prompts = _read_prompts(args.prompts, args.num_prompts)
    backend_class(args.backend)  # NOTE: a missing optional package fails here, before the model loads
    model, tok, head, _ = _load(args, need_mtp=args.mode != "none")
    spec = SpecConfig(mode=args.mode, speculate_k=args.speculate_k, filter_drafts=args.filter_drafts,
                      verify=args.verify)
    prompt_ids = [encode_prompt(tok, p) for p in prompts]
    backend = make_backend(args.backend, model, tok, head, seed=args.seed)
    profile = _auto_profile(args, model, sampling, spec) if auto else None
    if profile is not None:
        backend.chooser = profiles.load(*profile)
        print(f"auto: profile {profile[0]}, call {backend.chooser.calls + 1}: " +
              ("probing" if backend.chooser.should_probe(spec) else "keeping the last probe's choice, no probe"))
    try:
        result = backend.rollout(prompt_ids, sampling, spec, seed=args.seed)
    finally:
        backend.close()
    if profile is not None:
        profiles.save(*profile, backend.chooser)
    # NOTE: token_ids is the whole sequence and start its first completion index, so this file is
    # train-mtp/eval-mtp --data as is (the policy's own samples, the recommended training data).
    lines = [json.dumps({"prompt": p, "completion": c, "token_ids": i + t, "start": len(i), "finish_reason": f})
             for p, c, i, t, f in zip(prompts, result.texts, prompt_ids, result.token_ids, result.finish_reasons)]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    stats = result.spec_metrics()
    if result.decision is not None:
        stats.update(result.decision.to_metrics(), **{"auto/measured_tok_s": result.decision.measured_tok_s,
                                                      "auto/predictions": result.decision.predictions})
        d = result.decision
        print(f"auto: chose {d.mode}" + (f" K={d.speculate_k}" if d.speculate_k else "") +
              f" (predicted {d.predicted_tok_s:.0f} tok/s, measured {d.measured_tok_s:.0f} after the probes)")
    if args.stats_json:
        write_json(args.stats_json, stats)
    accept = f"accept length {stats['spec/accept_length']:.3f}, " if args.mode != "none" else ""  # none drafts nothing
    entropy = stats["spec/target_entropy"]
    entropy = f"{entropy:.3f} nats" if entropy is not None else f"not measured by the {args.backend} backend"
    print(f"wrote {len(lines)} completions to {args.out}; {accept}target entropy {entropy}")


def _check_input_file(path: str, what: str) -> None:
    if not Path(path).expanduser().is_file():
        raise BebopError(f"{what} not found: {path}")


def _read_prompts(path: str | None, num: int) -> list:
    """Prompts from a JSONL/parquet file (``{"prompt"}``: a string or chat messages, as ``rl --data``
    reads them) or a text file (one per line), or ``num`` embedded-task prompts."""
    if path is None:
        from bebop.task import arith

        return [p.prompt for p in arith.make_problems(num, seed=12345)]
    from bebop.rl.data import JSONL_SUFFIXES, PARQUET_SUFFIXES, load_prompts

    file = Path(path)
    if not file.is_file():
        raise BebopError(f"prompts file not found: {file}")
    if file.suffix.lower() in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        prompts = [r["prompt"] for r in load_prompts(file)]
    else:
        from bebop.utils.io import read_text

        prompts = [line for line in read_text(file, "prompts file").splitlines() if line.strip()]
    if not prompts:
        raise BebopError(f"prompts file {file} holds no prompt")
    return prompts


# ---------------------------------------------------------------------------------------------- check-lossless
def cmd_check_lossless(args) -> int:
    from bebop.rollout.base import backend_class
    from bebop.speculative.settings import verify_problem
    from bebop.speculative.check.lossless import (
        LOSSLESS_CONFIGS, check_prompt_known, default_prompts, format_lossless_table, lossless_configs,
        run_lossless_checks,
        summarize_checks,
    )
    from bebop.speculative.check.reference import run_reference_checks
    from bebop.utils.tokens import encode_prompt

    if problem := verify_problem("rs", args.verify, args.backend):
        raise BebopError(problem)
    backend_class(args.backend)  # NOTE: a missing optional package fails here, before the model loads
    model, tok, head, _ = _load(args, need_mtp=True)
    texts = _read_prompts(args.prompts, 4) if args.prompts else default_prompts()
    check_prompt_known(tok, texts[0], defaults=not args.prompts)
    print(f"testing {texts[0]!r}, with {len(texts) - 1} other prompt(s) mixed into batches"
          + ("" if args.prompts else " (the embedded task's; --prompts gives your own)"))
    prompts = [encode_prompt(tok, p) for p in texts] if args.prompts else texts
    if args.backend == "engine":
        checks = run_lossless_checks(model, tok, head, num_samples=args.samples, seed=args.seed, prompts=prompts,
                                     alpha=args.alpha, show_progress=True, configs=lossless_configs(args.verify))
        # Plain sampling against the model's own forward pass: catches defects plain and speculative share.
        checks += run_reference_checks(model, tok, prompts, args.samples, args.seed, args.alpha, LOSSLESS_CONFIGS)
    else:
        checks = _check_other_backend(args, model, tok, head, prompts)
    print(format_lossless_table(checks, prompts))
    return 0 if summarize_checks(checks).passed else 1


def _check_other_backend(args, model, tok, head, prompts) -> list:
    """Another engine's speculative sampling against its own plain sampling and against Bebop's engine's."""
    from bebop.rollout.base import make_backend
    from bebop.speculative.check.lossless import BACKEND_LOSSLESS_CONFIGS, run_lossless_checks

    backend = make_backend(args.backend, model, tok, head, seed=args.seed)
    references = {f"{args.backend} plain": backend, "Bebop plain": make_backend("engine", model, tok, head)}
    try:
        return run_lossless_checks(model, tok, head, num_samples=args.samples, seed=args.seed, prompts=prompts,
                                   alpha=args.alpha, configs=BACKEND_LOSSLESS_CONFIGS, show_progress=True,
                                   backend=backend, references=references)
    finally:
        backend.close()


# ---------------------------------------------------------------------------------------------- rl
def cmd_rl(args) -> None:
    from bebop.rl import resolve_rl_config, train_rl
    from bebop.rollout.base import backend_class
    from bebop.rl.prompts import task_reward
    from bebop.utils.io import check_output_dir
    from bebop.utils.torch_utils import dtype_name

    run_dir = Path(args.resume or args.out or "")
    if not args.resume and not args.out:
        raise BebopError("give --out RUN_DIR (or --resume RUN_DIR)")
    if args.resume and args.out and Path(args.out) != run_dir:
        raise BebopError("--resume RUN_DIR names the run directory; give no other --out")
    overrides = {name: getattr(args, name, None) for name in config_fields()}
    file = args.config
    if args.resume:
        saved = _saved_run(run_dir, args)
        if not file:
            overrides = {**{k: v for k, v in saved.items() if k in config_fields()},
                         **{k: v for k, v in overrides.items() if v is not None}}
        overrides["reward"] = _resume_reward(args, saved, run_dir)  # NOTE: before any reward is imported
    elif args.mtp and overrides.get("mtp_loss") is None:
        overrides["mtp_loss"] = _head_loss(Path(args.mtp))  # label runs by the head's own training loss
    cfg = resolve_rl_config(file, overrides)
    task_reward(cfg)  # a bad reward spec fails here, before any model loads
    backend_class(cfg.backend)  # and so does a missing optional package
    check_output_dir(run_dir, resume=bool(args.resume), overwrite=args.overwrite, what="run directory")
    if cfg.task == "math":
        _check_input_file(cfg.data, "prompt file")
    need_head = cfg.mode != "none" or cfg.mtp.mtp_update == "online"
    if args.resume and args.dtype == "auto":  # NOTE: a resumed run keeps its dtype (float32 before --dtype existed)
        args.dtype = saved.get("dtype", "float32")
    model, tok, head, _ = _load(args, need_mtp=need_head, mtp_loss=cfg.mtp_loss)
    run_info = {key: _abs(getattr(args, key, None)) for key in RUN_PATHS}
    if dtype_name(model.dtype) != "float32":  # recorded, so a resume in another dtype is refused (float32 runs: none)
        run_info["dtype"] = dtype_name(model.dtype)
    train_rl(model, tok, head, cfg, run_dir, resume=bool(args.resume), overwrite=args.overwrite, run_info=run_info)
    print(f"run written to {run_dir}")


RUN_PATHS = ("model", "mtp")  # what a run directory records besides its config, so --resume needs nothing else


def _abs(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def _saved_run(run_dir: Path, args) -> dict:
    """The saved config of the run to resume; fills --model/--mtp from it, refuses different ones."""
    from bebop.utils.io import read_json

    if not (run_dir / "config.json").is_file():
        raise BebopError(f"nothing to resume: {run_dir} holds no run (no config.json); start one with --out")
    saved = read_json(run_dir / "config.json", what="run config")
    for key in RUN_PATHS:
        given, recorded = _abs(getattr(args, key, None)), saved.get(key)
        if given is None:
            setattr(args, key, recorded)
        elif given != recorded:
            was = recorded or "the embedded default"
            raise BebopError(f"cannot resume {run_dir} with --{key} {given}: the run used {was} (start a new run "
                             "with --out to change it)")
    return saved


def _resume_reward(args, saved: dict, run_dir: Path) -> str:
    """The reward a resumed run loads: its own when built in, else only one this command names again
    (--reward, or the reward of its --config file; ``bebop.rl.rewards.resume_reward``)."""
    from bebop.config import load_config_file
    from bebop.rl.rewards import resume_reward

    given = args.reward if args.reward is not None or not args.config else load_config_file(args.config).get("reward")
    try:
        return resume_reward(saved.get("reward", ""), given, str(run_dir))
    except ValueError as e:
        raise BebopError(str(e)) from None


def _head_loss(path: Path) -> str | None:
    """The loss a head was trained with, from its mtp_config.json (None when it does not say)."""
    try:
        return json.loads((path / "mtp_config.json").read_text()).get("train", {}).get("loss")
    except (OSError, ValueError, AttributeError):
        return None


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


# ---------------------------------------------------------------------------------------------- report / demo
def cmd_report(args) -> None:
    from bebop.analysis.report import REPORT_FILE, write_report
    from bebop.analysis.runs import load_run
    from bebop.utils.io import atomic_dir, check_output_dir, output_dir, read_json

    check_output_dir(args.out, overwrite=args.overwrite, what="report directory", inputs=tuple(args.runs))
    runs = [load_run(run) for run in args.runs]  # NOTE: a run that cannot be read fails before --out is created
    head_evals = []
    for file in args.eval or []:
        result = read_json(file, what="eval-mtp JSON")
        if not isinstance(result, dict) or "alpha_rs" not in result:
            raise BebopError(f"{file} is not a `bebop eval-mtp --json` result (no alpha_rs)")
        head_evals.append(result)
    with output_dir(args.out, overwrite=args.overwrite, what="report directory", inputs=tuple(args.runs)), \
            atomic_dir(args.out) as tmp:  # NOTE: a sibling of --out, so the runs' relative links hold
        write_report(runs, tmp, head_evals=head_evals)
    print(f"report written to {Path(args.out) / REPORT_FILE}")


def cmd_demo(args) -> None:
    from bebop.demo import quick_or_default, run_demo
    from bebop.utils.io import output_dir
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    cfg = quick_or_default(args.quick, args.out, args.device, args.dtype)
    resolve_dtype(cfg.dtype, resolve_device(cfg.device))  # NOTE: a bad --device/--dtype fails before any output
    with output_dir(cfg.out, resume=not args.overwrite, overwrite=args.overwrite, what="demo directory"):
        report = run_demo(cfg)
    print(f"demo report: {report}")


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
    parser = argparse.ArgumentParser(prog="bebop", description=__doc__.splitlines()[0])
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
    p.add_argument("runs", nargs="+", help="run directories written by `bebop rl`")
    p.add_argument("--out", required=True, help="output directory for report.md and the PNG plots")
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

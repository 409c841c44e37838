"""What each ``bebop`` subcommand does once its flags are parsed: build configs, call the library.

One function per subcommand (``cmd_*``, set as the parser's ``func`` in ``bebop.cli``) and a
run directory's saved paths; what they read before working (the model and head, prompt and
sequence files, memory preflights) is ``bebop.command_inputs``. Heavy imports (torch, transformers) happen inside the functions, so
``bebop --help`` stays light.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

from bebop import command_inputs as inputs
from bebop.config import DEFAULT_DRAFT_LOSS, flags_of, is_auto
from bebop.mtp.config import TrainMtpConfig
from bebop.rl.config import config_fields
from bebop.utils.errors import BebopError
from bebop.utils.files import check_input_file


# ---------------------------------------------------------------------------------------------- pretrain
def cmd_pretrain(args) -> None:
    from bebop import embedded
    from bebop.utils.locks import entry_lock
    from bebop.utils.outputs import check_output_dir, output_dir

    overrides = {"steps": args.steps, "seed": args.seed, "device": args.device, "eval_problems": args.eval_problems,
                 "dtype": args.dtype}
    cfg = embedded.PretrainConfig(**{k: v for k, v in overrides.items() if v is not None})
    embedded.check_pretrain_config(cfg)
    out = Path(args.out) if args.out else embedded.embedded_model_dir()
    check_output_dir(out, overwrite=args.overwrite, what="model directory", inputs=args.inputs)
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
    from bebop.utils.outputs import check_output_dir

    given = {name: getattr(args, name) for name in flags_of(TrainMtpConfig)}  # NOTE: None where not given
    cfg = resolve(TrainMtpConfig, None, given)
    out = Path(args.out) if args.out else embedded.embedded_head_dir(cfg.loss) if args.model is None else None
    if out is None:
        raise BebopError("--out is required with --model")
    if args.resume:  # NOTE: a resume keeps the checkpoint's settings but those the flags or --config file give
        cfg = resolve(TrainMtpConfig, None, {**saved_config(out), **{k: v for k, v in given.items() if v is not None}})
    check_output_dir(out, resume=args.resume, overwrite=args.overwrite, what="head directory", inputs=args.inputs)
    if args.data:
        check_input_file(args.data, "data file")
    print("resolved config: " + json.dumps(dataclasses.asdict(cfg)), file=sys.stderr)
    # NOTE: with --fsdp the model loads on the CPU; train_mtp moves it to the GPUs shard by shard
    model, tok, _, data = inputs.load_inputs(argparse.Namespace(**{**vars(args), "device": "cpu"}) if args.fsdp
                                             else args, need_mtp=False, split="train")
    inputs.check_batch_memory(model, data, cfg.batch_size)
    train_mtp(model, data, out, cfg, pad_id=tok.pad_token_id, resume=args.resume, overwrite=args.overwrite,
              model_dir=args.model, fsdp=args.fsdp)
    print(f"saved head to {out}")


# ---------------------------------------------------------------------------------------------- import-mtp / export-mtp
def cmd_import_mtp(args) -> None:
    from bebop import models
    from bebop.mtp.native import import_mtp, native_layout
    from bebop.utils.outputs import check_output_dir, output_dir
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    resolve_dtype(args.dtype, resolve_device(args.device))
    check_output_dir(args.out, overwrite=args.overwrite, what="head directory", inputs=args.inputs)
    native_layout(args.model)  # NOTE: checked before the (possibly large) model loads
    model, _ = models.load_model(args.model, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer)
    head = import_mtp(args.model, model)
    with output_dir(args.out, overwrite=args.overwrite, what="head directory", inputs=args.inputs):
        head.save_pretrained(args.out, extra={"imported_from": str(Path(args.model).resolve())})
    print(f"imported the {head.config.family} MTP layer of {args.model} to {args.out}")


def cmd_export_mtp(args) -> None:
    from bebop import embedded
    from bebop.mtp.native import export_mtp
    from bebop.utils.outputs import check_output_dir

    out = Path(args.out)
    check_output_dir(out, overwrite=args.overwrite, what="export directory", inputs=args.inputs)
    if args.model is None:
        if args.tokenizer:
            raise BebopError("--tokenizer needs --model: the embedded model has its own tokenizer")
        model_dir = embedded.ensure_embedded_model()
        head_dir = args.mtp or embedded.ensure_embedded_head(DEFAULT_DRAFT_LOSS)
    elif args.mtp is None:
        raise BebopError("--mtp is required with --model (a head trained by `bebop train-mtp --model ...`)")
    else:
        model_dir, head_dir = args.model, args.mtp
    export_mtp(model_dir, head_dir, out, fmt=args.format, overwrite=args.overwrite, tokenizer_dir=args.tokenizer)
    print(f"wrote {out}: serve it with vLLM (speculative method \"mtp\") or SGLang (NEXTN); see the README")


# ---------------------------------------------------------------------------------------------- eval-mtp
def cmd_eval_mtp(args) -> None:
    from bebop.mtp.evaluate import acceptance_table, evaluate_mtp
    from bebop.utils.files import write_json

    if args.data:
        check_input_file(args.data, "data file")
    model, tok, head, data = inputs.load_inputs(args, need_mtp=True, mtp_loss=args.loss, split="eval")
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
    from bebop.utils.outputs import check_output_file

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
    from bebop.rollout.base import backend_class, backend_problem, make_backend
    from bebop.speculative.auto import profile as profiles
    from bebop.speculative.settings import needs_head, num_drafts_problem, verify_problem
    from bebop.utils.files import atomic_write_text, write_json

    sampling, spec = args.sampling, args.spec  # resolved and checked (bebop.cli.resolve_args)
    auto = is_auto(spec.mode, spec.speculate_k)
    if problem := backend_problem(args.backend, spec.mode, spec.speculate_k) or \
            verify_problem(spec.mode, spec.verify, args.backend) or num_drafts_problem(spec, args.backend):
        raise BebopError(problem)
    if args.auto_profile and not auto:
        raise BebopError("--auto-profile needs --mode auto or --speculate-k auto")
    prompts = inputs.read_prompts(args.prompts) if args.prompts else None
    backend_class(args.backend)  # NOTE: a missing optional package fails here, before the model loads
    model, tok, head, _ = inputs.load_inputs(args, need_mtp=needs_head(spec.mode))
    if args.backend == "engine":  # NOTE: before the embedded task's prompts are made
        inputs.check_rollout_memory(model, len(prompts) if prompts else args.num_prompts,
                                    inputs.longest_prompt_tokens(tok, [p for _, p in prompts or []]),
                                    sampling.max_new_tokens, f"{len(prompts) if prompts else args.num_prompts} prompts",
                                    "give fewer prompts (--num-prompts, --prompts) or lower --max-new-tokens")
    prompts = prompts or inputs.embedded_prompts(args.num_prompts)
    prompt_ids = [inputs.encode(tok, prompt, where) for where, prompt in prompts]
    backend = make_backend(args.backend, model, tok, head, seed=args.seed)
    profile = _auto_profile(args, model, sampling, spec) if auto else None
    if profile is not None:
        backend.chooser = profiles.load(*profile)
        print(f"auto: profile {profile[0]}, call {backend.chooser.calls + 1}: " +
              ("probing" if backend.chooser.should_probe(spec) else "keeping the last probe's choice, no probe"))
    start = time.perf_counter()
    try:
        result = backend.rollout(prompt_ids, sampling, spec, seed=args.seed)
    finally:
        backend.close()
    seconds = time.perf_counter() - start  # NOTE: the tokens are on the host by now, so the device is done
    if profile is not None:
        profiles.save(*profile, backend.chooser)
    # NOTE: token_ids is the whole sequence and start its first completion index, so this file is
    # train-mtp/eval-mtp --data as is (the policy's own samples, the recommended training data).
    lines = [json.dumps({"prompt": p, "completion": c, "token_ids": i + t, "start": len(i), "finish_reason": f})
             for (_, p), c, i, t, f in zip(prompts, result.texts, prompt_ids, result.token_ids, result.finish_reasons)]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    stats = {**result.spec_metrics(), **generate_timing(result.token_ids, seconds)}
    if result.decision is not None:
        stats.update(result.decision.to_metrics(), **{"auto/measured_tok_s": result.decision.measured_tok_s,
                                                      "auto/predictions": result.decision.predictions})
        d = result.decision
        print(f"auto: chose {d.mode}" + (f" K={d.speculate_k}" if d.speculate_k else "") +
              f" (predicted {d.predicted_tok_s:.0f} tok/s, measured {d.measured_tok_s:.0f} after the probes)")
    if args.stats_json:
        write_json(args.stats_json, stats)
    accept = f"accept length {stats['spec/accept_length']:.3f}, " if spec.mode != "none" else ""  # none drafts nothing
    entropy = stats["spec/target_entropy"]
    entropy = f"{entropy:.3f} nats" if entropy is not None else f"not measured by the {args.backend} backend"
    print(f"wrote {len(lines)} completions to {args.out}: {sum(map(len, result.token_ids))} tokens in "
          f"{seconds:.2f} s ({stats['generate/tok_s']:.1f} tok/s, model loading left out); {accept}target entropy "
          f"{entropy}")


def generate_timing(completions: list[list[int]], seconds: float) -> dict[str, float]:
    """``generate``'s speed: the generation's wall time and its completion tokens per second (the tokens are
    ``spec/num_generated_tokens``).

    Example: generate_timing([[5, 6], [7]], 0.5) -> {"generate/seconds": 0.5, "generate/tok_s": 6.0}
    """
    num_tokens = sum(len(c) for c in completions)
    return {"generate/seconds": seconds, "generate/tok_s": num_tokens / seconds if seconds > 0 else 0.0}


# ---------------------------------------------------------------------------------------------- check-lossless
def cmd_check_lossless(args) -> int:
    from bebop.check.lossless import (
        LOSSLESS_CONFIGS, VERDICT_EXIT_CODES, check_prompt_known, default_prompts, format_lossless_table,
        lossless_configs, run_lossless_checks, summarize_checks,
    )
    from bebop.check.reference import run_reference_checks
    from bebop.rollout.base import backend_class
    from bebop.speculative.settings import SpecConfig, num_drafts_problem, verify_problem
    from bebop.utils.progress import say, stage

    if problem := verify_problem("rs", args.verify, args.backend) or num_drafts_problem(
            SpecConfig("rs", verify=args.verify, num_drafts=args.num_drafts), args.backend):
        raise BebopError(problem)
    backend_class(args.backend)  # NOTE: a missing optional package fails here, before the model loads
    model, tok, head, _ = inputs.load_inputs(args, need_mtp=True)
    texts = inputs.read_prompts(args.prompts) if args.prompts else [(f"task prompt {i + 1}", p)
                                                              for i, p in enumerate(default_prompts())]
    num_tested = min(args.tested_prompts, len(texts))
    prompts = [inputs.encode(tok, p, where) for where, p in texts] if args.prompts else [p for _, p in texts]
    for _, text in texts[:num_tested]:
        check_prompt_known(tok, text, defaults=not args.prompts)
    say(f"check-lossless: testing {num_tested} prompt(s), with {len(texts) - num_tested} other(s) only mixed into "
        "batches" + ("" if args.prompts else " (the embedded task's; --prompts gives your own)"))
    if args.backend == "engine":
        checks = run_lossless_checks(model, tok, head, num_samples=args.samples, seed=args.seed, prompts=prompts,
                                     alpha=args.alpha, show_progress=True,
                                     configs=lossless_configs(args.verify, args.num_drafts),
                                     num_tested_prompts=num_tested)
        # Plain sampling against the model's own forward pass: catches defects plain and speculative share.
        with stage("check-lossless: plain sampling against the model's own forward pass"):
            checks += run_reference_checks(model, tok, prompts, args.samples, args.seed, args.alpha, LOSSLESS_CONFIGS)
    else:
        checks = _check_other_backend(args, model, tok, head, prompts, num_tested)
    print(format_lossless_table(checks, prompts, num_tested, seed=args.seed))
    return VERDICT_EXIT_CODES[summarize_checks(checks).verdict]


def _check_other_backend(args, model, tok, head, prompts, num_tested: int) -> list:
    """Another engine's speculative sampling against its own plain sampling and against Bebop's engine's."""
    from bebop.check.lossless import BACKEND_LOSSLESS_CONFIGS, run_lossless_checks
    from bebop.rollout.base import make_backend

    backend = make_backend(args.backend, model, tok, head, seed=args.seed)
    references = {f"{args.backend} plain": backend, "Bebop plain": make_backend("engine", model, tok, head)}
    try:
        return run_lossless_checks(model, tok, head, num_samples=args.samples, seed=args.seed, prompts=prompts,
                                   alpha=args.alpha, configs=BACKEND_LOSSLESS_CONFIGS, show_progress=True,
                                   backend=backend, references=references, num_tested_prompts=num_tested)
    finally:
        backend.close()


# ---------------------------------------------------------------------------------------------- rl
def cmd_rl(args) -> None:
    from bebop.rl import resolve_rl_config, train_rl
    from bebop.rl.config import max_speculate_k
    from bebop.rl.prompts import task_reward
    from bebop.rollout.base import backend_class
    from bebop.speculative.settings import needs_head
    from bebop.utils.outputs import check_output_dir
    from bebop.utils.torch_utils import dtype_name

    run_dir = Path(args.resume or args.out or "")
    if not args.resume and not args.out:
        raise BebopError("give --out RUN_DIR (or --resume RUN_DIR)")
    if args.resume and args.out and Path(args.out) != run_dir:
        raise BebopError("--resume RUN_DIR names the run directory; give no other --out")
    given = {name: getattr(args, name) for name in config_fields()}  # NOTE: None where not given (flag or file)
    overrides = dict(given)
    if args.resume:  # NOTE: a resume keeps the run's settings but those the flags or --config file give
        saved = _saved_run(run_dir, args)
        overrides = {**{k: v for k, v in saved.items() if k in config_fields()},
                     **{k: v for k, v in given.items() if v is not None}}
        overrides["reward"] = _resume_reward(given["reward"], saved, run_dir)  # NOTE: before any reward is imported
    elif args.mtp and overrides.get("mtp_loss") is None:
        overrides["mtp_loss"] = _head_loss(Path(args.mtp))  # label runs by the head's own training loss
    cfg = resolve_rl_config(None, overrides)
    task_reward(cfg)  # a bad reward spec fails here, before any model loads
    backend_class(cfg.backend)  # and so does a missing optional package
    check_output_dir(run_dir, resume=bool(args.resume), overwrite=args.overwrite, what="run directory",
                     inputs=args.inputs)
    if cfg.task == "math":
        check_input_file(cfg.data, "prompt file")
    if args.resume and args.dtype == "auto":  # NOTE: a resumed run keeps its dtype (float32 before --dtype existed)
        args.dtype = saved.get("dtype", "float32")
    model, tok, head, _ = inputs.load_inputs(args, need_mtp=needs_head(cfg.spec.mode, cfg.mtp.mtp_update),
                                             mtp_loss=cfg.mtp_loss)
    if cfg.backend == "engine":  # NOTE: a typed or received size is refused before the first rollout allocates it
        rows, k = cfg.prompts_per_step * cfg.group_size, max_speculate_k(cfg)
        fix = "lower --prompts-per-step, --group-size or --max-new-tokens" + (" or --speculate-k" if
                                                                             k > cfg.sampling.max_new_tokens else "")
        if args.resume:  # NOTE: a resumed run keeps these sizes: no flag can lower them
            fix = (f"they are the run's own (prompts_per_step={cfg.prompts_per_step}, group_size={cfg.group_size}, "
                   f"max_new_tokens={cfg.sampling.max_new_tokens}, speculate_k={k} in {run_dir / 'config.json'}), "
                   "which --resume keeps: start a new run with --out")
        inputs.check_rollout_memory(model, rows, inputs.longest_prompt_tokens(tok, _rl_prompts(cfg)),
                                    cfg.sampling.max_new_tokens + k,
                                    f"prompts_per_step x group_size = {rows} rollout rows", fix)
    run_info = {key: _abs(getattr(args, key, None)) for key in RUN_PATHS}
    if dtype_name(model.dtype) != "float32":  # recorded, so a resume in another dtype is refused (float32 runs: none)
        run_info["dtype"] = dtype_name(model.dtype)
    train_rl(model, tok, head, cfg, run_dir, resume=bool(args.resume), overwrite=args.overwrite, run_info=run_info)
    print(f"run written to {run_dir}")


def _rl_prompts(cfg) -> list:
    """The prompts of an rl run's data file (none for the embedded task, whose prompts are made per step)."""
    from bebop.rl.data import load_prompt_rows

    if cfg.task != "math":
        return []
    try:
        return [row["prompt"] for _, row in load_prompt_rows(cfg.data)]
    except (ValueError, ImportError) as e:  # NOTE: as the run itself reports them (bebop.rl.prompts)
        raise BebopError(str(e)) from None


RUN_PATHS = ("model", "mtp", "tokenizer")  # what a run directory records besides its config: --resume needs no more


def _abs(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def _saved_run(run_dir: Path, args) -> dict:
    """The saved config of the run to resume; fills --model/--mtp from it, refuses different ones."""
    from bebop.utils.files import read_json
    from bebop.utils.run_files import CONFIG_FILE

    if not (run_dir / CONFIG_FILE).is_file():
        raise BebopError(f"nothing to resume: {run_dir} holds no run (no {CONFIG_FILE}); start one with --out")
    saved = read_json(run_dir / CONFIG_FILE, what="run config")
    if not isinstance(saved, dict) or any(not isinstance(saved.get(key), (str, type(None))) for key in RUN_PATHS):
        raise BebopError(f"run config {run_dir / CONFIG_FILE} is not a run's config (a table with the paths "
                         f"{', '.join(RUN_PATHS)})")
    for key in RUN_PATHS:
        given, recorded = _abs(getattr(args, key, None)), saved.get(key)
        if given is None:
            setattr(args, key, recorded)
        elif given != recorded:
            was = recorded or "the embedded default"
            raise BebopError(f"cannot resume {run_dir} with --{key} {given}: the run used {was} (start a new run "
                             "with --out to change it)")
    return saved


def _resume_reward(given: str | None, saved: dict, run_dir: Path) -> str:
    """The reward a resumed run loads: its own when built in, else only one this command names again
    (``given``: --reward, or the reward of its --config file; ``bebop.rl.rewards.resume_reward``)."""
    from bebop.rl.rewards import resume_reward

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


# ---------------------------------------------------------------------------------------------- report / demo
def cmd_report(args) -> None:
    from bebop.analysis.report import REPORT_FILE, write_report
    from bebop.analysis.runs import load_run, run_inputs
    from bebop.utils.files import atomic_dir, read_json
    from bebop.utils.outputs import check_output_dir, output_dir
    from bebop.utils.run_files import REPORT_DIR

    if args.out is None and len(args.runs) > 1:
        raise BebopError(f"{len(args.runs)} runs: give --out (only one run's report has a default place, "
                         f"RUN/{REPORT_DIR})")
    out = Path(args.out) if args.out is not None else Path(args.runs[0]) / REPORT_DIR
    check_output_dir(out, overwrite=args.overwrite, what="report directory")
    runs = [load_run(run) for run in args.runs]  # NOTE: a run that cannot be read fails before --out is created
    head_evals = []
    for file in args.eval or []:
        result = read_json(file, what="eval-mtp JSON")
        if not isinstance(result, dict) or "alpha_rs" not in result:
            raise BebopError(f"{file} is not a `bebop eval-mtp --json` result (no alpha_rs)")
        head_evals.append(result)
    inputs = (*(path for run in runs for path in run_inputs(run)), *(args.eval or ()))  # NOTE: not RUN/report
    with output_dir(out, overwrite=args.overwrite, what="report directory", inputs=inputs), \
            atomic_dir(out) as tmp:  # NOTE: a sibling of --out, so the runs' relative links hold
        write_report(runs, tmp, head_evals=head_evals)
    print(f"report written to {out / REPORT_FILE}")


def cmd_demo(args) -> None:
    from bebop.demo import quick_or_default, run_demo
    from bebop.utils.outputs import output_dir
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    cfg = quick_or_default(args.quick, args.out, args.device, args.dtype)
    resolve_dtype(cfg.dtype, resolve_device(cfg.device))  # NOTE: a bad --device/--dtype fails before any output
    with output_dir(cfg.out, resume=not args.overwrite, overwrite=args.overwrite, what="demo directory"):
        report = run_demo(cfg)
    print(f"demo report: {report}")

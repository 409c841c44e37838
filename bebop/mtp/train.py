"""``train_mtp``: train an MTP head on a frozen backbone with a chosen draft objective.

The backbone never changes (its parameters have requires_grad=False and are only read under
no_grad). Each step unrolls K (``speculate_k``) head steps with teacher forcing on the data tokens,
in the engine's attention context by default (``chain_context``, see ``bebop.mtp.chains``); the
target p at step j is the backbone's own distribution on the same sequence (paper §6.1: 5 steps,
backbone frozen, e2e-TV). AdamW with linear warmup then a constant rate (the paper's schedule).

Resuming (``resume=True``) continues from ``out_dir/checkpoint`` on the same backbone (its weights'
SHA-256 is recorded). Of the settings, only ``RESUME_MAY_CHANGE`` may differ from the checkpoint's:
more steps extend the run exactly as if it had been started with them; a changed learning rate,
batch size, loss... would make the result a run nobody asked for, so it is refused. Each resume
is recorded (``resumes`` in the checkpoint config and the saved head's ``mtp_config.json``).

Under torchrun (``bebop.utils.distributed``) ``batch_size`` is the global batch: each of W ranks
trains on a contiguous 1/W of the rows one process would take at that step, the loss is each
rank's share of the global mean and the head's gradients are summed over ranks, so the head equals
a one-process run's up to float rounding; a checkpoint can be resumed with any W. Rank 0 alone
writes the output directory. With ``fsdp`` (FSDP2) each decoder layer of the backbone and each part
of the head is sharded over the ranks instead of held whole by each (``_fsdp_shard``); checkpoints
are gathered in full, so they load with or without FSDP and at any W.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from bebop.config import BASELINE_DRAFT_LOSS, field_problems
from bebop.mtp.chains import check_head_context
from bebop.mtp.config import TrainMtpConfig
from bebop.mtp.data import Sequences, check_chain_args
from bebop.mtp.head import MtpHead
from bebop.mtp.loss import chain_loss, chain_loss_count, fused_loss_blocker
from bebop.speculative.target import decoder_of
from bebop.utils import distributed
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir, read_json, save_torch, write_json
from bebop.utils.metric_log import JsonlLogger, NullLogger, log_rows_until
from bebop.utils.optim import make_adamw, master_state_dict
from bebop.utils.outputs import check_output_dir, output_dir
from bebop.utils.progress import progress, say, step_line
from bebop.utils.torch_utils import state_sha256

CHECKPOINT_DIR = "checkpoint"  # inside the output dir: head, optimizer, step, config
METRICS_FILE = "metrics.jsonl"  # one row per step
RESUME_MAY_CHANGE = ("steps", "save_every", "log_every")  # settings a resumed run may change (and records)
OLD_CHECKPOINT_SETTINGS = {"chain_context": "unrolled"}  # what checkpoints written before a field existed ran with
NEEDS_CE_START = ("tv", "e2e_tv")  # losses whose q-weighted gradient is slow far from p: they fine-tune a CE-trained head


def _check(cfg: TrainMtpConfig) -> None:
    """Each field's own check (``bebop.config.field_problems``), then the one rule that relates two of them."""
    if problems := field_problems(cfg):
        raise BebopError("; ".join(problems))
    if cfg.ce_warmup > cfg.steps:
        raise BebopError(f"ce_warmup must be -1 (auto) or 0..steps={cfg.steps}, got {cfg.ce_warmup}")


def ce_warmup_steps(cfg: TrainMtpConfig, origin: str) -> int:
    """CE steps that precede ``cfg.loss``: ``cfg.ce_warmup``, or when -1, half of ``cfg.steps`` for a
    tv/e2e_tv head that starts from the backbone's layer (``origin`` "backbone"), 0 otherwise.

    The paper fine-tunes a CE-trained native head with e2e-TV (§6.1); started from a copy of the
    last attention layer, TV's gradient (proportional to q) moves a far-off draft slowly.
    """
    if cfg.ce_warmup >= 0:
        return cfg.ce_warmup
    return cfg.steps // 2 if cfg.loss in NEEDS_CE_START and origin == "backbone" else 0


def _batch_index(num: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The rows of step ``step``: a function of (seed, step) only, so a resumed run sees the same batches."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, num, (batch_size,), generator=gen).tolist()


def _global_share(loss: torch.Tensor, loss_name: str, mask: torch.Tensor) -> torch.Tensor:
    """This rank's part of the global batch's mean loss: ``loss`` x local count / global count.

    Summed over ranks (``distributed.sum_gradients``) these parts give the global mean's gradient even
    when ranks hold different numbers of chains. With one rank it is ``loss`` itself.
    """
    if distributed.world_size() == 1:
        return loss
    count = chain_loss_count(loss_name, mask).to(loss.dtype)  # () sync-free
    return loss * count / distributed.sum_tensor(count).clamp_min(1)


def train_mtp(
    backbone,
    data: Sequences,
    out_dir: str | os.PathLike,
    cfg: TrainMtpConfig = TrainMtpConfig(),
    pad_id: int = 0,
    resume: bool = False,
    show_progress: bool = True,
    overwrite: bool = False,
    model_dir: str | os.PathLike | None = None,
    fsdp: bool = False,
) -> MtpHead:
    """Trains a head and saves it to ``out_dir`` (``mtp_config.json``, ``model.safetensors``).

    Writes ``metrics.jsonl`` (one row per step) and a checkpoint every ``cfg.save_every`` steps.
    Settings, the starting head and the checkpoint are all checked before ``out_dir`` changes.

    Args:
        backbone: the frozen HF causal LM.
        data: training sequences.
        out_dir: output directory; a non-empty one needs ``resume`` or ``overwrite``.
        cfg: training settings.
        pad_id: padding token id.
        resume: continue from ``out_dir/checkpoint`` (see the module docstring for changed settings).
        show_progress: show a progress bar.
        overwrite: move a non-empty ``out_dir`` aside to ``NAME.old-<timestamp>`` first.
        model_dir: the backbone's checkpoint directory, read for its native MTP layer (``cfg.init``).
        fsdp: under torchrun, shard the backbone's decoder layers and the head over the ranks (FSDP2); the
            backbone stays sharded afterwards.

    Returns:
        The trained head.
    """
    _check(cfg)
    check_chain_args(data, cfg.speculate_k, cfg.temperature)
    out_dir = Path(out_dir)
    inputs = (model_dir, cfg.init_from or None)  # NOTE: the head directory never is, holds or lies in one
    check_output_dir(out_dir, resume=resume, overwrite=overwrite, what="head directory", inputs=inputs)
    if len(data) == 0:
        raise BebopError("no training sequences")
    distributed.shard_range(cfg.batch_size)  # NOTE: checks the batch splits over the ranks, before anything loads
    device = next(backbone.parameters()).device
    for p in backbone.parameters():
        p.requires_grad_(False)
    model_sha256 = state_sha256(backbone)
    torch.manual_seed(cfg.seed)
    head, origin = initial_head(backbone, cfg, model_dir)
    distributed.broadcast_module(head)
    check_head_context(head, cfg.chain_context)
    ce_steps = ce_warmup_steps(cfg, origin)
    opt = make_adamw(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # bf16: float32 master weights
    start_step, resumes = _maybe_resume(out_dir, head, opt, cfg, model_sha256) if resume else (0, [])
    if start_step:  # NOTE: a resumed run keeps the CE/loss boundary it started with, even with more steps
        ce_steps = read_json(out_dir / CHECKPOINT_DIR / "config.json", what="checkpoint config").get("ce_steps", ce_steps)
    if fsdp:
        opt, device = _fsdp_shard(backbone, head, opt, cfg)
    kept = log_rows_until(out_dir / METRICS_FILE, start_step, what="metrics") if resume else []
    distributed.barrier()  # NOTE: every rank has read the checkpoint before rank 0 writes
    main = distributed.is_main()
    with contextlib.ExitStack() as held:
        if main:  # NOTE: the first write to out_dir, locked until the head is saved; a new one without a checkpoint
            # is removed if the run fails (its log rows are of steps no checkpoint holds)
            held.enter_context(output_dir(out_dir, resume=resume, overwrite=overwrite, what="head directory",
                                          inputs=inputs, announce=say,
                                          worth_keeping=lambda d: (d / CHECKPOINT_DIR).is_dir()))
        logger = held.enter_context(contextlib.closing(JsonlLogger(out_dir / METRICS_FILE, kept) if main
                                                       else NullLogger()))
        meta = {"model_sha256": model_sha256, "resumes": resumes, "ce_steps": ce_steps}
        _train_steps(backbone, head, opt, data, out_dir, cfg, pad_id, meta, logger, start_step, fsdp, device,
                     show_progress)
        _save_head(out_dir, head, opt, cfg, meta, fsdp)
    return head


def _train_steps(backbone, head: MtpHead, opt, data: Sequences, out_dir: Path, cfg: TrainMtpConfig, pad_id: int,
                 meta: dict, logger, start_step: int, fsdp: bool, device: torch.device, show_progress: bool) -> None:
    """Steps ``start_step``..``cfg.steps`` of ``train_mtp``: one row of ``logger`` per step, checkpoints on the way.

    Stops with BebopError before an update whose loss or gradient is NaN or inf: the head on disk
    (the last checkpoint) stays finite.
    """
    first, last = distributed.shard_range(cfg.batch_size)  # this rank's rows of each step's global batch
    ce_steps = meta["ce_steps"]
    say(f"train-mtp: loss={cfg.loss} K={cfg.speculate_k} steps={cfg.steps} sequences={len(data)} from step {start_step}")
    if ce_steps:
        say(f"train-mtp: the first {ce_steps} steps train with CE (a CE-trained start for {cfg.loss}; --ce-warmup 0 skips it)")
    if fused_loss_blocker(backbone):
        say(f"train-mtp: plain draft loss on (N, K, V) logits, not the fused one: {fused_loss_blocker(backbone)}")
    t0 = time.time()
    for step in progress(range(start_step, cfg.steps), total=cfg.steps - start_step, desc=f"train-mtp {cfg.loss}",
                         enabled=show_progress):
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
        for group in opt.param_groups:
            group["lr"] = lr
        index = _batch_index(len(data), cfg.batch_size, cfg.seed, step)[first:last]
        ids, lengths, starts = data.batch(index, pad_id, device)
        loss_name = BASELINE_DRAFT_LOSS if step < ce_steps else cfg.loss
        try:
            loss, alpha_rs, mask = chain_loss(backbone, head, ids, lengths, starts, cfg.speculate_k,
                                              cfg.chain_context, loss_name, cfg.temperature)
        except (BebopError, ValueError) as e:  # NOTE: the losses' own checks, e.g. NaN or inf draft states
            raise BebopError(_stopped(step + 1, str(e), out_dir)) from None
        loss = _global_share(loss, loss_name, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        distributed.sum_gradients(head.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        # NOTE: the step's two host syncs (loss, gradient norm) come before the update, so a NaN never reaches it
        loss_value = distributed.sum_floats({"loss": loss.item()})["loss"]  # the global batch's loss
        _check_finite_step(step + 1, loss_value, float(grad_norm), out_dir)
        opt.step()
        with torch.no_grad():
            sums = distributed.sum_tensor(torch.stack([(alpha_rs * mask).sum(0), mask.sum(0)]))  # (2, K)
            per_step = (sums[0] / sums[1].clamp_min(1)).tolist()
        row = {"step": step + 1, "loss": loss_value, "loss_name": loss_name, "lr": lr, "grad_norm": float(grad_norm),
               "alpha_rs": per_step, "seconds": time.time() - t0}
        logger.log(row)
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            say(step_line("train-mtp", step + 1, cfg.steps,
                          {"loss": row["loss"], "alpha1": per_step[0], "lr": lr}))
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            _save_checkpoint(out_dir, *_states(head, opt, fsdp), step + 1, cfg, meta)


def _check_finite_step(step: int, loss: float, grad_norm: float, out_dir: Path) -> None:
    """Raises BebopError (one line) when a step's loss or gradient norm is NaN or inf (every rank sees the same)."""
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise BebopError(_stopped(step, f"a non-finite loss ({loss}) or gradient norm ({grad_norm})", out_dir))


def _stopped(step: int, why: str, out_dir: Path) -> str:
    return (f"train-mtp: step {step} has {why}; stopped before the update (the last checkpoint in "
            f"{out_dir / CHECKPOINT_DIR} is kept): check the data and the backbone's logits, or lower --lr")


def initial_head(backbone, cfg: TrainMtpConfig, model_dir: str | os.PathLike | None) -> tuple[MtpHead, str]:
    """(head, origin): the head training starts from, and where it came from: "init_from" (``cfg.init_from``),
    "native" (the checkpoint's own MTP layer) or "backbone" (a copy of its last attention layer)."""
    from bebop.mtp.native import NoNativeTensors, import_mtp, native_layer_count, read_config

    if cfg.init_from:
        return MtpHead.from_pretrained(cfg.init_from, backbone), "init_from"
    has_native = model_dir is not None and native_layer_count(read_config(model_dir)) > 0
    if cfg.init == "native" or (cfg.init == "auto" and has_native):
        if model_dir is None:
            raise BebopError("init=native needs the model's checkpoint directory (--model DIR with its own MTP layer)")
        try:
            head = import_mtp(model_dir, backbone)
            say(f"train-mtp: starting from the native MTP layer of {model_dir}")
            return head, "native"
        except NoNativeTensors:
            if cfg.init == "native":
                raise
            say(f"train-mtp: note: the config of {model_dir} declares an MTP layer but its checkpoint holds none of "
                "its tensors; starting from a copy of the backbone's last attention layer (--init backbone)")
    return MtpHead(backbone, num_layers=cfg.num_layers).to(next(backbone.parameters()).device), "backbone"


def _save_head(out_dir: Path, head: MtpHead, opt, cfg: TrainMtpConfig, meta: dict, fsdp: bool) -> None:
    """Writes the trained head into ``out_dir`` and the final checkpoint (rank 0; every rank gathers with fsdp)."""
    head_state, opt_state = _states(head, opt, fsdp)
    if distributed.is_main():
        # NOTE: head and checkpoint are both written before the head is installed (renames only), so a
        # failure (a full device) leaves the previous head and checkpoint as they were.
        try:
            head.save_pretrained(out_dir / "head.tmp", extra={"train": asdict(cfg), **meta}, state=head_state)
            _save_checkpoint(out_dir, head_state, opt_state, cfg.steps, cfg, meta)
        except BaseException:
            shutil.rmtree(out_dir / "head.tmp", ignore_errors=True)
            raise
        _install_head(out_dir)
    distributed.barrier()  # NOTE: no rank returns before the head is on disk


def _install_head(out_dir: Path) -> None:
    """Moves the freshly saved head files from ``head.tmp`` into ``out_dir`` (each by rename)."""
    tmp = out_dir / "head.tmp"
    for f in tmp.iterdir():
        os.replace(f, out_dir / f.name)
    tmp.rmdir()


def _fsdp_shard(backbone, head: MtpHead, opt, cfg: TrainMtpConfig):
    """FSDP2: shards each decoder layer of the backbone and each part of each head layer over the ranks; returns
    the head's optimizer rebuilt on the shards with ``opt``'s state (a resumed run's), and the device they are on.

    The backbone's embedding, lm_head and final norm stay whole on every rank (the head calls them directly).
    The backbone's shards are frozen: no gradient, no optimizer state. A backbone loaded on the CPU moves to
    this rank's device (its GPU under nccl) shard by shard, so no device ever holds all of it.
    """
    state = opt.state_dict()
    device = distributed.comm_device()
    mesh = distributed.fsdp_mesh(device)
    decoder = decoder_of(backbone)
    layers, decoder.layers = decoder.layers, torch.nn.ModuleList()
    backbone.to(device)  # NOTE: all but the decoder layers, which fully_shard moves one shard at a time
    decoder.layers = layers
    head.to(device)
    for layer in layers:
        distributed.shard(layer, mesh)
    for layer in head.layers:
        for part in layer.children():  # NOTE: the head calls each part, not the layer (MtpHead.forward_step)
            distributed.shard(part, mesh)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    distributed.load_full_optimizer_state(head, opt, state)
    return opt, device


def _states(head: MtpHead, opt, fsdp: bool) -> tuple[dict, dict]:
    """(head, optimizer) state dicts to save: a bfloat16 head's float32 master weights (``master_state_dict``);
    with ``fsdp`` gathered in full on rank 0 (a collective)."""
    return distributed.full_state_dicts(head, opt) if fsdp else (master_state_dict(head, opt), opt.state_dict())


def _save_checkpoint(out_dir: Path, head_state: dict, opt_state: dict, step: int, cfg: TrainMtpConfig,
                     meta: dict) -> None:
    """Writes the checkpoint (rank 0 only; the others return)."""
    if not distributed.is_main():
        return
    with atomic_dir(out_dir / CHECKPOINT_DIR) as tmp:
        save_torch({"head": head_state, "optimizer": opt_state, "step": step}, tmp / "state.pt")
        write_json(tmp / "config.json", {**asdict(cfg), **meta})


def saved_config(out_dir: str | os.PathLike) -> dict:
    """The ``TrainMtpConfig`` fields of ``out_dir``'s checkpoint ({} when it has none): a resume's defaults."""
    path = Path(out_dir) / CHECKPOINT_DIR / "config.json"
    if not path.is_file():
        return {}
    saved = {**OLD_CHECKPOINT_SETTINGS, **read_json(path, what="checkpoint config")}
    return {k: v for k, v in saved.items() if k in TrainMtpConfig.__dataclass_fields__}


def _maybe_resume(out_dir: Path, head: MtpHead, opt, cfg: TrainMtpConfig, model_sha256: str) -> tuple[int, list]:
    """(step, resume history) after loading ``out_dir/checkpoint`` into ``head`` and ``opt``; (0, []) if none.

    Raises BebopError when the checkpoint belongs to another backbone or a setting outside
    ``RESUME_MAY_CHANGE`` changed (one line naming each, old -> new).
    """
    ckpt = out_dir / CHECKPOINT_DIR
    if not (ckpt / "state.pt").is_file():
        say(f"train-mtp: no checkpoint in {ckpt}; starting from step 0")
        return 0, []
    saved = {**OLD_CHECKPOINT_SETTINGS, **read_json(ckpt / "config.json", what="checkpoint config")}
    if saved.get("model_sha256", model_sha256) != model_sha256:
        raise BebopError(f"cannot resume {out_dir}: its checkpoint was trained on another model "
                         f"(weights sha256 {saved['model_sha256'][:12]}, this model {model_sha256[:12]})")
    new = asdict(cfg)
    changed = {k: [saved.get(k), v] for k, v in new.items() if saved.get(k, v) != v}
    refused = {k: c for k, c in changed.items() if k not in RESUME_MAY_CHANGE}
    if refused:
        details = ", ".join(f"{k} {old!r} -> {v!r}" for k, (old, v) in refused.items())
        raise BebopError(f"cannot resume {out_dir} with changed settings ({details}); only "
                         f"{', '.join(RESUME_MAY_CHANGE)} may change (for a new head: --overwrite or another --out)")
    try:
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is a corrupt checkpoint
        raise BebopError(f"corrupt checkpoint {ckpt / 'state.pt'}: {str(e).splitlines()[0]}") from None
    step = int(state["step"])
    if cfg.steps < step:
        raise BebopError(f"cannot resume {out_dir} with steps={cfg.steps}: its checkpoint is at step {step}")
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optimizer"])
    if changed:
        say(f"train-mtp: resuming at step {step} with " + ", ".join(f"{k} {o} -> {v}" for k, (o, v) in changed.items()))
    return step, [*saved.get("resumes", []), {"at_step": step, "changed": changed}]

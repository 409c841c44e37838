"""``train_mtp``: train an MTP head on a frozen backbone with a chosen draft objective.

The backbone never changes (its parameters have requires_grad=False and are only read under
no_grad). Each step unrolls K_train head steps with teacher forcing on the data tokens; the
target p at step j is the backbone's own distribution on the same sequence (paper §6.1: 5 steps,
backbone frozen, e2e-TV). AdamW with linear warmup then a constant rate (the paper's schedule).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bebop.losses import DRAFT_LOSSES, acceptance_stats, draft_loss
from bebop.mtp.data import Sequences, chain_tensors, check_chain_args
from bebop.mtp.head import MtpHead
from bebop.utils.io import BebopError, JsonlLogger, atomic_dir, read_json, write_json
from bebop.utils.progress import progress, say, step_line

CHECKPOINT_DIR = "checkpoint"  # inside the output dir: head, optimizer, step, config


@dataclass(frozen=True)
class TrainMtpConfig:
    """How a head is trained."""

    loss: str = "e2e_tv"  # draft objective: ce | fkl | rkl | tv | e2e_tv
    speculate_k: int = 5  # K_train, head steps unrolled per position
    steps: int = 300  # optimizer steps
    batch_size: int = 32  # sequences per step
    lr: float = 1e-3  # peak AdamW learning rate
    warmup_steps: int = 10  # linear warmup, then constant
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    temperature: float = 1.0  # softmax temperature of p and q in the loss
    num_layers: int = 1  # physical MTP layers
    init_from: str = ""  # head directory to start from ("" = a copy of the backbone's last layer)
    seed: int = 0  # head init order and batch sampling
    save_every: int = 100  # checkpoint interval in steps (0 = only at the end)
    log_every: int = 25  # one fixed-format line every this many steps


def _check(cfg: TrainMtpConfig) -> None:
    if cfg.loss not in DRAFT_LOSSES:
        raise BebopError(f"unknown loss {cfg.loss!r}; choose one of {', '.join(DRAFT_LOSSES)}")
    if cfg.speculate_k < 1 or cfg.steps < 1 or cfg.batch_size < 1:
        raise BebopError("speculate_k, steps and batch_size must be >= 1")


def _batch_index(num: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The rows of step ``step``: a function of (seed, step) only, so a resumed run sees the same batches."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, num, (batch_size,), generator=gen).tolist()


def train_mtp(
    backbone,
    data: Sequences,
    out_dir: str | os.PathLike,
    cfg: TrainMtpConfig = TrainMtpConfig(),
    pad_id: int = 0,
    resume: bool = False,
    show_progress: bool = True,
) -> MtpHead:
    """Trains a head and saves it to ``out_dir`` (``mtp_config.json``, ``model.safetensors``).

    Writes ``metrics.jsonl`` (one row per step) and a checkpoint every ``cfg.save_every`` steps;
    with ``resume`` it continues from ``out_dir/checkpoint``.
    """
    _check(cfg)
    check_chain_args(data, cfg.speculate_k, cfg.temperature)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = next(backbone.parameters()).device
    for p in backbone.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    if cfg.init_from:
        head = MtpHead.from_pretrained(cfg.init_from, backbone)
    else:
        head = MtpHead(backbone, num_layers=cfg.num_layers).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start_step = _maybe_resume(out_dir, head, opt, cfg) if resume else 0
    logger = JsonlLogger(out_dir / "metrics.jsonl", truncate_after_step=start_step)
    say(f"train-mtp: loss={cfg.loss} K={cfg.speculate_k} steps={cfg.steps} sequences={len(data)} from step {start_step}")
    t0 = time.time()
    for step in progress(range(start_step, cfg.steps), total=cfg.steps - start_step, desc=f"train-mtp {cfg.loss}",
                         enabled=show_progress):
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, lengths, starts = data.batch(_batch_index(len(data), cfg.batch_size, cfg.seed, step), pad_id, device)
        draft, target, mask = chain_tensors(backbone, head, ids, lengths, starts, cfg.speculate_k)
        loss = draft_loss(cfg.loss, draft, target, mask=mask, temperature=cfg.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        with torch.no_grad():
            alpha_rs, _, _ = acceptance_stats(draft.detach(), target, temperature=cfg.temperature)
            per_step = ((alpha_rs * mask).sum(0) / mask.sum(0).clamp_min(1)).tolist()
        row = {"step": step + 1, "loss": loss.item(), "lr": lr, "grad_norm": float(grad_norm),
               "alpha_rs": per_step, "seconds": time.time() - t0}
        logger.log(row)
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            say(step_line("train-mtp", step + 1, cfg.steps,
                          {"loss": row["loss"], "alpha1": per_step[0], "lr": lr}))
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            _save_checkpoint(out_dir, head, opt, step + 1, cfg)
    logger.close()
    head.save_pretrained(out_dir / "head.tmp", extra={"train": asdict(cfg)})
    _install_head(out_dir)
    _save_checkpoint(out_dir, head, opt, cfg.steps, cfg)
    return head


def _install_head(out_dir: Path) -> None:
    """Moves the freshly saved head files from ``head.tmp`` into ``out_dir`` (each by rename)."""
    tmp = out_dir / "head.tmp"
    for f in tmp.iterdir():
        os.replace(f, out_dir / f.name)
    tmp.rmdir()


def _save_checkpoint(out_dir: Path, head: MtpHead, opt, step: int, cfg: TrainMtpConfig) -> None:
    with atomic_dir(out_dir / CHECKPOINT_DIR) as tmp:
        torch.save({"head": head.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp / "state.pt")
        write_json(tmp / "config.json", asdict(cfg))


def _maybe_resume(out_dir: Path, head: MtpHead, opt, cfg: TrainMtpConfig) -> int:
    ckpt = out_dir / CHECKPOINT_DIR
    if not (ckpt / "state.pt").is_file():
        say(f"train-mtp: no checkpoint in {ckpt}; starting from step 0")
        return 0
    saved = read_json(ckpt / "config.json", what="checkpoint config")
    if saved.get("loss") != cfg.loss or saved.get("speculate_k") != cfg.speculate_k:
        raise BebopError(f"checkpoint in {ckpt} was trained with loss={saved.get('loss')} K={saved.get('speculate_k')}")
    try:
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is a corrupt checkpoint
        raise BebopError(f"corrupt checkpoint {ckpt / 'state.pt'}: {str(e).splitlines()[0]}") from None
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])

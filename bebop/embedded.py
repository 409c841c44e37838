"""The embedded default: a tiny Qwen3.5 model trained by the package on the embedded task, cached.

Every command uses it when no ``--model`` is given. It is a text-only ``Qwen3_5ForCausalLM`` (the
paper's model family) with full-attention layers, a dense MLP and head_dim 32, so vLLM's CPU build
serves it with an exported MTP head. ``PretrainConfig(full_attention_interval=4)`` builds the family's
own shape instead, three Gated DeltaNet (linear-attention, recurrent state) layers to every
full-attention layer; docs/results.md measures it and says why it is not the default. It is built from
a config (no download), pretrained by ``bebop pretrain`` in a few CPU minutes, and cached under ``$BEBOP_CACHE_DIR``
(default ``~/.cache/bebop``). Heads trained on it are cached beside it, one per loss.

Cache entries derived from the model (heads, self-generated data) record the SHA-256 of its
weights and are rebuilt when the model changes. Each entry is built under a lock file
(``.NAME.lock`` beside it), so processes sharing a cache build it once and never see half of it.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerFast, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from bebop.config import BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS
from bebop.pretrained import load_pretrained
from bebop.task import arith
from bebop.utils.cache import cache_dir
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir, read_json, write_json
from bebop.utils.locks import entry_lock
from bebop.utils.optim import make_adamw, master_state_dict
from bebop.utils.progress import progress, say, step_line
from bebop.utils.torch_utils import resolve_device, resolve_dtype, seed_everything, state_sha256

if TYPE_CHECKING:
    from bebop.mtp.data import Sequences

EMBEDDED_VERSION = "v3"  # bump when the task, tokenizer or model changes, so stale caches are not reused
CACHE_DTYPE = torch.float32  # NOTE: cached heads and data are built on, and keyed by, the float32 weights
LINEAR_CONV_KERNEL = 4  # the Gated DeltaNet layers' short convolution, Qwen3.5's
PRETRAIN_THREADS = 1  # NOTE: CPU reductions depend on the thread count: one thread makes pretraining bit-reproducible


@dataclass(frozen=True)
class PretrainConfig:
    """How the embedded model is built and trained."""

    steps: int = 1200  # optimizer steps
    batch_size: int = 32  # sequences per step, drawn fresh each step
    lr: float = 3e-3  # peak AdamW learning rate
    guess_share: float = 0.5  # share of training completions written by the careless solver (arith.make_guess)
    warmup_steps: int = 60  # linear warmup, then cosine decay to 10%
    weight_decay: float = 0.01  # AdamW weight decay
    seed: int = 0  # weight init and data
    hidden_size: int = 64  # model width D
    num_layers: int = 8  # enough that one MTP layer costs about 1/8 of a backbone forward
    full_attention_interval: int = 1  # every Nth layer full attention, the others Gated DeltaNet: 1 = all full
    #   attention (the default), 4 = Qwen3.5's 3:1 hybrid
    num_heads: int = 2  # attention heads
    num_kv_heads: int = 1  # grouped-query KV heads
    head_dim: int = 32  # per-head width; vLLM's CPU attention needs >= 32
    linear_head_dim: int = 64  # Gated DeltaNet key and value head width (one head each: the model's width);
    #   vLLM's CPU kernels for these layers take 64 or 128 only
    intermediate_size: int = 192  # MLP width
    eval_problems: int = 256  # held-out problems for accuracy/entropy after training
    device: str = "auto"  # cpu, cuda or auto
    dtype: str = "float32"  # weights: float32 (the cached model's, bit-reproducible on CPU) or bfloat16 / auto
    #   (bf16 on CUDA), trained through float32 master weights and saved in float32 either way


def embedded_model_dir() -> Path:
    return cache_dir() / f"embedded-{EMBEDDED_VERSION}" / "model"


def embedded_head_dir(loss: str) -> Path:
    return cache_dir() / f"embedded-{EMBEDDED_VERSION}" / "heads" / loss


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded task's tokenizer, wrapped in the HF fast-tokenizer class (saved in the HF format)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=arith.build_tokenizer(), pad_token=arith.PAD, eos_token=arith.EOS, unk_token=arith.UNK
    )


def build_model(cfg: PretrainConfig, vocab_size: int, pad_id: int, eos_id: int) -> Qwen3_5ForCausalLM:
    """A randomly initialised text-only Qwen3.5: a full-attention layer (gated, q/k-normed, partial rotary as in
    the family) every ``full_attention_interval`` layers (every layer by default) and Gated DeltaNet layers
    between them, dense MLP, tied embeddings. Each Gated DeltaNet layer has ``hidden_size // linear_head_dim``
    key and value heads of ``linear_head_dim`` (one each by default: as wide as the model, as the attention's
    queries are) and the family's convolution kernel of 4."""
    layer_types = ["full_attention" if (i + 1) % cfg.full_attention_interval == 0 else "linear_attention"
                   for i in range(cfg.num_layers)]
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        layer_types=layer_types,
        linear_num_value_heads=cfg.hidden_size // cfg.linear_head_dim,
        linear_num_key_heads=cfg.hidden_size // cfg.linear_head_dim,
        linear_key_head_dim=cfg.linear_head_dim,
        linear_value_head_dim=cfg.linear_head_dim,
        linear_conv_kernel_dim=LINEAR_CONV_KERNEL,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    return Qwen3_5ForCausalLM(config)


def _lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _training_batch(
    rng: random.Random, tok: PreTrainedTokenizerFast, batch_size: int, guess_share: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, loss_mask), both (B, T): prompt + completion + EOS, loss on the completion.

    A completion is careless (``arith.make_guess``) with probability ``guess_share``, else correct.
    """
    rows, masks = [], []
    for _ in range(batch_size):
        problem = arith.make_problem(rng)
        prompt_ids = tok.encode(problem.prompt)
        write = arith.make_guess if rng.random() < guess_share else arith.make_solution
        completion_ids = tok.encode(write(rng, problem)) + [tok.eos_token_id]
        rows.append(prompt_ids + completion_ids)
        masks.append([0] * len(prompt_ids) + [1] * len(completion_ids))
    width = max(len(r) for r in rows)
    ids = torch.full((batch_size, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((batch_size, width), dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
    return ids, mask


def pretrain(out_dir: str | os.PathLike, cfg: PretrainConfig = PretrainConfig(), show_progress: bool = True) -> dict:
    """Trains the embedded model on the embedded task and saves it (``save_pretrained``) atomically.

    Returns the summary also written to ``pretrain.json``: loss, accuracy and mean completion
    entropy at T=1 on held-out problems, and wall time. On a CPU it runs on PRETRAIN_THREADS
    intra-op threads whatever the machine, so the weights are the same everywhere.
    """
    check_pretrain_config(cfg)
    threads = torch.get_num_threads()
    if resolve_device(cfg.device).type == "cpu":
        torch.set_num_threads(PRETRAIN_THREADS)
    try:
        return _pretrain(out_dir, cfg, show_progress)
    finally:
        torch.set_num_threads(threads)


def _pretrain(out_dir: str | os.PathLike, cfg: PretrainConfig, show_progress: bool) -> dict:
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    tok = build_tokenizer()
    model = build_model(cfg, len(tok), tok.pad_token_id, tok.eos_token_id).to(device, resolve_dtype(cfg.dtype, device))
    opt = make_adamw(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    rng = random.Random(cfg.seed)
    start = time.time()
    loss_ema = float("nan")
    model.train()
    for step in progress(range(cfg.steps), total=cfg.steps, desc="pretrain", enabled=show_progress):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        ids, mask = _training_batch(rng, tok, cfg.batch_size, cfg.guess_share)
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if step == 0 else 0.95 * loss_ema + 0.05 * loss.item()  # sync: once per step
        if show_progress and ((step + 1) % 100 == 0 or step + 1 == cfg.steps):
            say(step_line("pretrain", step + 1, cfg.steps, {"loss": loss_ema, "lr": _lr_at(step, cfg)}))
    model.eval()
    if model.dtype != torch.float32:  # NOTE: the saved (and measured) model is the float32 master weights
        masters = master_state_dict(model, opt)
        model.float().load_state_dict(masters)
    quality = evaluate_task(model, tok, num_problems=cfg.eval_problems, seed=cfg.seed + 1)
    summary = {"loss": loss_ema, **quality, "seconds": time.time() - start, "config": asdict(cfg)}
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(tmp / "pretrain.json", summary)
    return summary


@torch.no_grad()
def evaluate_task(model, tok, num_problems: int = 256, seed: int = 1, temperature: float = 1.0) -> dict:
    """Accuracy and mean next-token entropy (nats, over completion tokens) of T=1 samples."""
    from bebop.speculative.engine import SamplingParams, generate

    problems = arith.make_problems(num_problems, seed=seed)
    result = generate(
        model,
        tok,
        [p.prompt for p in problems],
        sampling=SamplingParams(temperature=temperature, max_new_tokens=64),
        seed=seed,
    )
    rewards = arith.arith_reward([p.prompt for p in problems], result.texts, answer=[p.answer for p in problems])
    return {
        "accuracy": sum(rewards) / len(rewards),
        "guess_rate": sum(arith.is_guess(t) for t in result.texts) / len(result.texts),
        "target_entropy": result.stats.mean_target_entropy,
        "mean_completion_tokens": sum(result.lengths) / len(result.lengths),
    }


def check_pretrain_config(cfg: PretrainConfig) -> None:
    """Raises BebopError (one line) on settings that would give no trained or no measured model."""
    if cfg.steps < 1 or cfg.eval_problems < 1:
        raise BebopError(f"pretrain needs steps >= 1 and eval_problems >= 1, got steps={cfg.steps}, "
                         f"eval_problems={cfg.eval_problems}")
    if not 1 <= cfg.full_attention_interval <= cfg.num_layers:
        raise BebopError(f"pretrain needs 1 <= full_attention_interval <= num_layers (the MTP head is built from a "
                         f"full-attention layer), got {cfg.full_attention_interval} with {cfg.num_layers} layers")
    if cfg.hidden_size % cfg.linear_head_dim:
        raise BebopError(f"pretrain needs linear_head_dim to divide hidden_size, got {cfg.linear_head_dim} and "
                         f"{cfg.hidden_size}")
    if not 0.0 <= cfg.guess_share < 1.0:
        raise BebopError(f"pretrain needs 0 <= guess_share < 1 (some careful answers to learn), got {cfg.guess_share}")
    resolve_dtype(cfg.dtype, resolve_device(cfg.device))


def ensure_embedded_model(show_progress: bool = True) -> Path:
    """The cached embedded model's directory, pretraining it first when it is missing (once across processes)."""
    path = embedded_model_dir()
    with entry_lock(path):
        if not (path / "config.json").is_file():
            say(f"bebop: no cached embedded model at {path}; pretraining it now (a few CPU minutes, once).")
            pretrain(path, show_progress=show_progress)
    return path


def load_embedded_model(device: str = "auto", show_progress: bool = True, dtype: str | torch.dtype = "auto"):
    """The embedded model and tokenizer (``load_pretrained``), pretraining the model first when it is not cached."""
    resolve_dtype(dtype, resolve_device(device))  # NOTE: a bad --device or --dtype fails before any pretraining
    path = ensure_embedded_model(show_progress)
    fix = f"; it is the cached embedded model: delete {path} and it is pretrained again on next use"
    return load_pretrained(path, device, dtype, fix=fix)


SELFGEN_TRAIN = 2048  # self-generated sequences the embedded heads train on
SELFGEN_EVAL = 256  # held-out self-generated sequences for eval-mtp
SELFGEN_SEEDS = {"train": 1000, "eval": 2000}  # problem/sampling seeds of the two splits


def self_generated(model, tokenizer, num: int, seed: int, temperature: float = 1.0, batch_size: int = 64) -> Sequences:
    """The embedded task's completions sampled from the model itself at ``temperature`` (the policy's own data)."""
    from bebop.mtp.data import Sequences
    from bebop.speculative.engine import SamplingParams, generate

    problems = arith.make_problems(num, seed=seed)
    token_ids, starts = [], []
    for i in range(0, num, batch_size):
        chunk = problems[i : i + batch_size]
        result = generate(
            model, tokenizer, [p.prompt for p in chunk], sampling=SamplingParams(temperature=temperature, max_new_tokens=64),
            seed=seed, row_ids=list(range(i, i + len(chunk))),
        )
        for prompt, completion in zip(result.prompt_ids, result.token_ids):
            token_ids.append(prompt + completion)
            starts.append(len(prompt))
    return Sequences(token_ids, starts)


def embedded_data(split: str, model=None, tok=None, num: int | None = None, path: Path | None = None):
    """Self-generated (T=1) embedded-task sequences for ``split`` ("train" or "eval"), cached as JSONL.

    The file is named after the model's weights (``selfgen-<split>-<sha256[:16]>.jsonl``), so a
    changed model gets fresh data. ``num`` (default SELFGEN_TRAIN / SELFGEN_EVAL) applies only
    when the file is being created; ``path`` replaces the cache location (the quick demo keeps its
    own; its stem gets the same suffix).
    """
    from bebop.mtp.data import Sequences
    from bebop.utils.files import atomic_write_text, read_jsonl

    if model is None:
        model, tok = load_embedded_model(dtype=CACHE_DTYPE)
    path = path or cache_dir() / f"embedded-{EMBEDDED_VERSION}" / f"selfgen-{split}.jsonl"
    path = path.with_name(f"{path.stem}-{state_sha256(model)[:16]}{path.suffix}")
    with entry_lock(path):
        if path.is_file():
            rows = read_jsonl(path, what="cached data")
            return Sequences([r["token_ids"] for r in rows], [r["start"] for r in rows])
        num = num or (SELFGEN_TRAIN if split == "train" else SELFGEN_EVAL)
        say(f"bebop: sampling {num} embedded-task completions from the model at T=1 ({split} split, cached after)")
        data = self_generated(model, tok, num, seed=SELFGEN_SEEDS[split])
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in data.to_jsonl_rows()))
    return data


HEAD_WARMUP_STEPS = 150  # CE steps of the shared warm-start head (stands in for a native, CE-pretrained MTP head)
HEAD_STEPS = 150  # steps of each loss's head, starting from the warm-start head (same budget for every loss)
WARMUP_HEAD = "ce-init"  # cache name of the warm-start head


def ensure_embedded_head(loss: str = DEFAULT_DRAFT_LOSS, model=None, tok=None, show_progress: bool = True,
                         root: Path | None = None, warmup_steps: int = HEAD_WARMUP_STEPS,
                         steps: int = HEAD_STEPS, data=None) -> Path:
    """The embedded head trained with ``loss``, training it first when missing (cached under ``root``).

    Protocol (the paper's: every loss fine-tunes the same CE-pretrained MTP head, §6.1): a shared
    head trained with CE for ``warmup_steps``, then ``steps`` more with ``loss`` from it. A head (or
    an unfinished one's checkpoint) trained on other weights than ``model``'s is replaced.
    """
    from bebop.mtp.head import CONFIG_NAME
    from bebop.mtp.train import TrainMtpConfig, train_mtp

    root = root or embedded_head_dir(loss).parent
    path = root / loss
    if model is None:
        model, tok = load_embedded_model(show_progress=show_progress, dtype=CACHE_DTYPE)
    model_sha256 = state_sha256(model)
    with entry_lock(path):
        if (path / CONFIG_NAME).is_file() and _trained_on(path) == model_sha256:
            return path
        data = data if data is not None else embedded_data("train", model, tok)
        warm = root / WARMUP_HEAD
        with entry_lock(warm):
            if not ((warm / CONFIG_NAME).is_file() and _trained_on(warm) == model_sha256):
                _drop_stale(warm, model_sha256)
                say(f"bebop: training the shared CE warm-start head at {warm} (once).")
                train_mtp(model, data, warm, TrainMtpConfig(loss=BASELINE_DRAFT_LOSS, steps=warmup_steps,
                                                            save_every=max(warmup_steps // 3, 1)),
                          pad_id=tok.pad_token_id, resume=True, show_progress=show_progress)
        _drop_stale(path, model_sha256)
        say(f"bebop: no cached {loss} head at {path}; training it now from the warm-start head (once).")
        cfg = TrainMtpConfig(loss=loss, steps=steps, init_from=str(warm), save_every=max(steps // 3, 1))
        train_mtp(model, data, path, cfg, pad_id=tok.pad_token_id, resume=True, show_progress=show_progress)
    return path


def _trained_on(head_dir: Path) -> str | None:
    """The backbone SHA-256 a cached head (or its unfinished checkpoint) records; None if none does."""
    from bebop.mtp.head import CONFIG_NAME

    for file in (head_dir / CONFIG_NAME, head_dir / "checkpoint" / "config.json"):
        if file.is_file():
            try:
                return read_json(file).get("model_sha256")
            except BebopError:
                return None
    return None


def _drop_stale(head_dir: Path, model_sha256: str) -> None:
    """Removes a cached head directory trained on other weights (derived data: it is rebuilt, and said so)."""
    import shutil

    if head_dir.exists() and _trained_on(head_dir) != model_sha256:
        say(f"bebop: the cached head at {head_dir} was not trained on this model's weights; rebuilding it.")
        shutil.rmtree(head_dir)

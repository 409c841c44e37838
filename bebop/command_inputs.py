"""What the subcommands share before their work starts: the model and head from --model/--mtp (or the
embedded defaults), prompt and sequence files read with one-line errors naming file and line, and the
memory preflights that refuse work the device cannot hold. Heavy imports happen inside the functions,
so ``bebop --help`` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from bebop.config import DEFAULT_DRAFT_LOSS
from bebop.utils.errors import BebopError
from bebop.utils.files import check_input_file


def load_inputs(args, need_mtp: bool, mtp_loss: str = DEFAULT_DRAFT_LOSS, split: str | None = None):
    """(model, tokenizer, head or None, sequences or None) from --model/--mtp/--data (``split`` of the
    embedded data when it is given), or the embedded defaults; on --device in --dtype."""
    from bebop import embedded, models
    from bebop.mtp import MtpHead
    from bebop.utils.torch_utils import resolve_device, resolve_dtype

    dtype = resolve_dtype(args.dtype, resolve_device(args.device))  # NOTE: before anything loads or pretrains
    # NOTE: the embedded model's cached heads and data are keyed by its float32 weights: they are found
    # (or built) on the float32 model, which is cast to --dtype after.
    model, tok = models.load_model(args.model, device=args.device,
                                   dtype=dtype if args.model else embedded.CACHE_DTYPE, tokenizer=args.tokenizer)
    path = None
    if need_mtp:
        if getattr(args, "mtp", None):
            path = Path(args.mtp)
        elif args.model is None:
            path = embedded.ensure_embedded_head(mtp_loss, model, tok)
        else:
            raise BebopError("--mtp is required with --model (train one with `bebop train-mtp --model ...`)")
    data = read_sequences(args, model, tok, split) if split else None
    model.to(dtype)
    head = None
    if path is not None:
        head = MtpHead.from_pretrained(path, model).eval()
        for p in head.parameters():
            p.requires_grad_(False)
    return model, tok, head, data


def read_sequences(args, model, tok, split: str):
    """--data as MTP sequences, or the embedded model's self-generated ``split`` when no --model is given."""
    from bebop import embedded
    from bebop.mtp.data import load_sequences

    if args.data:
        return load_sequences(args.data, tok, vocab_size=model.get_input_embeddings().num_embeddings,
                              max_positions=getattr(model.config.get_text_config(), "max_position_embeddings", None))
    if args.model is None:
        return embedded.embedded_data(split, model, tok, num=args.num_sequences)
    raise BebopError("--data is required with --model (a JSONL of text or prompt/completion rows)")


def check_batch_memory(model, data, batch_size: int) -> None:
    """A train-mtp batch of ``batch_size`` rows (this process's share under torchrun) fits the device: the
    backbone's forward pass over the batch, each row at least as long as the shortest sequence."""
    from bebop.utils import distributed
    from bebop.utils.memory import check_memory, forward_bytes

    rows = -(-batch_size // distributed.world_size())
    shortest = min((len(t) for t in data.token_ids), default=1)
    check_memory(forward_bytes(model, rows, shortest), next(model.parameters()).device,
                 f"batch_size={batch_size} rows of at least {shortest} tokens", "lower --batch-size")


def check_rollout_memory(model, num_rows: int, prompt_tokens: int, num_new: int, what: str, fix: str) -> None:
    """A rollout of ``num_rows`` rows fits the model's device (engine backend): the prefill's forward pass
    over ``prompt_tokens`` (a lower bound of the longest prompt) beside the KV cache of the whole rows
    (``num_new`` more positions each)."""
    from bebop.utils.memory import check_memory, forward_bytes, kv_cache_bytes

    needed = kv_cache_bytes(model, num_rows, prompt_tokens + num_new) + forward_bytes(model, num_rows, prompt_tokens)
    check_memory(needed, next(model.parameters()).device, what, fix)


def longest_prompt_tokens(tok, prompts: list) -> int:
    """Tokens of the prompt with the longest text (a lower bound of the longest prompt's tokens, found
    without encoding every prompt); 1 when there are none."""
    from bebop.utils.tokens import encode_prompt

    if not prompts:
        return 1
    try:
        return max(1, len(encode_prompt(tok, max(prompts, key=lambda p: len(json.dumps(p))))))
    except BebopError:
        return 1  # NOTE: the prompt's own error is raised, with its file and line, where prompts are encoded


def encode(tokenizer, prompt, where: str) -> list[int]:
    """``encode_prompt``, with the prompt's file and line in its error."""
    from bebop.utils.tokens import encode_prompt

    try:
        ids = encode_prompt(tokenizer, prompt)
    except BebopError as e:
        raise BebopError(f"{where}: {e}") from None
    if not ids:  # NOTE: nothing predicts the first token of an empty prompt; the engine would refuse it unnamed
        raise BebopError(f"{where}: empty prompt: the tokenizer gives it no tokens (every prompt needs at least one)")
    return ids


def embedded_prompts(num: int) -> list[tuple[str, str]]:
    """(where, prompt) of ``num`` embedded-task prompts."""
    from bebop.task import arith

    return [(f"embedded task prompt {i + 1}", p.prompt) for i, p in enumerate(arith.make_problems(num, seed=12345))]


def read_prompts(path: str) -> list[tuple[str, object]]:
    """(where, prompt) of a JSONL/parquet file (``{"prompt"}``: a string or chat messages, as ``rl --data``
    reads them) or a text file (one per line); ``where`` names the file and line for errors."""
    from bebop.rl.data import JSONL_SUFFIXES, PARQUET_SUFFIXES, load_prompt_rows

    file = check_input_file(path, "prompts file")
    if file.suffix.lower() in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        prompts = [(where, r["prompt"]) for where, r in load_prompt_rows(file)]
    else:
        from bebop.utils.files import read_text

        prompts = [(f"{file}:{n}", line) for n, line in enumerate(read_text(file, "prompts file").splitlines(), 1)
                   if line.strip()]
    if not prompts:
        raise BebopError(f"prompts file {file} holds no prompt")
    return prompts

"""Training and evaluation data for MTP heads: token sequences with the index where drafting starts.

Drafting happens only inside completions, so a chain may start at position t >= start - 1, where
``start`` is the first completion token (the head's first draft after a prompt reads the target's
state at the prompt's last position). Plain texts have start = 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from bebop.config import short_repr, speculate_k_problem, temperature_problem
from bebop.mtp.chains import CHAIN_UNROLLS
from bebop.speculative.target import decoder_states
from bebop.speculative.attention import final_logits
from bebop.utils.errors import BebopError
from bebop.utils.files import read_jsonl
from bebop.utils.tokens import encode_completion, encode_prompt


@dataclass
class Sequences:
    """Token sequences and, per sequence, the index of its first completion token."""

    token_ids: list[list[int]]
    starts: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)

    def batch(self, index: list[int], pad_id: int, device: torch.device):
        """Right-padded (ids (B, T), lengths (B,), starts (B,)) for the rows in ``index``."""
        rows = [self.token_ids[i] for i in index]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows])
        starts = torch.tensor([self.starts[i] for i in index])
        return ids.to(device), lengths.to(device), starts.to(device)

    def to_jsonl_rows(self) -> list[dict]:
        return [{"token_ids": t, "start": s} for t, s in zip(self.token_ids, self.starts)]


def load_sequences(path: str | os.PathLike, tokenizer, max_len: int | None = None,
                   vocab_size: int | None = None, max_positions: int | None = None) -> Sequences:
    """Reads a JSONL file of ``{"text"}``, ``{"prompt", "completion"}`` or ``{"token_ids", "start"}`` rows.

    ``token_ids`` is the whole sequence and ``start`` its first completion index (``bebop generate``
    writes such rows); a prompt (text or chat messages) and its completion are tokenized as generation
    sees them (``bebop.utils.tokens``: one BOS, EOS at the end of the completion); a text is encoded as is.
    With ``vocab_size``, a token id outside [0, vocab_size) is an error naming the file and line; with
    ``max_positions`` (the model's max_position_embeddings), so is a row longer than that.
    """
    rows = read_jsonl(path, what="data file")
    if not rows:
        raise BebopError(f"data file {path} is empty")
    token_ids, starts = [], []
    for i, row in enumerate(rows, start=1):
        try:
            ids, start = _row_tokens(row, tokenizer)
        except BebopError as e:
            raise BebopError(f"data file {path} line {i}: {e}") from None
        if vocab_size is not None and any(not 0 <= t < vocab_size for t in ids):
            bad = next(t for t in ids if not 0 <= t < vocab_size)
            raise BebopError(f"data file {path} line {i}: token id {bad} is outside the model's vocabulary "
                             f"[0, {vocab_size})")
        if max_len is not None:
            ids = ids[:max_len]
        if max_positions is not None and len(ids) > max_positions:
            raise BebopError(f"data file {path} line {i}: {len(ids)} tokens exceed the model's "
                             f"max_position_embeddings={max_positions}; shorten the row")
        if len(ids) >= start + 2:  # at least one chain with one verified step
            token_ids.append(ids)
            starts.append(start)
    if not token_ids:
        raise BebopError(f"data file {path} has no sequence long enough to train or evaluate a draft on")
    return Sequences(token_ids, starts)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _row_tokens(row: dict, tokenizer) -> tuple[list[int], int]:
    """(token ids, start) of one data row; BebopError (without the file and line) when it is malformed."""
    if "token_ids" in row:
        ids, start = row["token_ids"], row.get("start", 1)
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise BebopError(f"'token_ids' must be a list of integers, got {short_repr(ids)}")
        if not _is_int(start) or start < 0:
            raise BebopError(f"'start' must be an integer >= 0, got {short_repr(start)}")
        return ids, start
    if "prompt" in row and "completion" in row:
        prompt = encode_prompt(tokenizer, row["prompt"])
        return prompt + encode_completion(tokenizer, row["completion"]), max(1, len(prompt))
    if "text" in row:
        if not isinstance(row["text"], str):
            raise BebopError(f"'text' must be a string, got {type(row['text']).__name__} {short_repr(row['text'])}")
        return encode_prompt(tokenizer, row["text"]), 1
    raise BebopError("needs 'text', 'prompt'+'completion' or 'token_ids'")


def check_chain_args(data: Sequences, speculate_k: int, temperature: float) -> None:
    """Raises BebopError (one line) unless 1 <= K <= the deepest chain the data holds and 0 < temperature < inf.

    A chain starting at t >= max(start, 1) - 1 has all K steps when t + K + 1 < len, so the data allows
    K <= max over sequences of len - 1 - max(start, 1).

    Example: one sequence of 8 tokens with start 2 allows K <= 5.
    """
    for problem in (speculate_k_problem(speculate_k, auto_ok=False), temperature_problem(temperature, greedy_ok=False)):
        if problem:
            raise BebopError(problem)
    if len(data) == 0:
        raise BebopError("no sequences to train or evaluate a draft on")
    deepest = max(len(t) - 1 - max(s, 1) for t, s in zip(data.token_ids, data.starts))
    if speculate_k > deepest:
        fix = f"give --speculate-k {deepest} or less" if deepest >= 1 else "give data with longer completions"
        raise BebopError(f"speculate_k={speculate_k} is deeper than the data allows: its longest completion has "
                         f"{deepest + 1} tokens, room for chains of {deepest} drafts; {fix} (train-mtp drafts 5 "
                         "deep by default, generate and rl 3)")


def chain_tensors(backbone, head, ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, k: int,
                  chain_context: str = "unrolled"):
    """Teacher-forced draft and target logits along every chain of a padded batch.

    Chain n starts at position t (of row b) with t >= start_b - 1; its step j (1-based) is the
    head's depth-j prediction at t and the backbone's prediction at t + j, both for token x_{t+j+1}.

    Args:
        ids: (B, T) right-padded sequences; lengths: (B,); starts: (B,) first completion index.
        k: draft depths per chain (K).
        chain_context: the attention context of depths >= 2 (``bebop.mtp.chains``): "unrolled" or
            "served" (the engine's).

    Returns:
        draft_logits (N, K, V) (with grad through the head), target_logits (N, K, V) (no grad),
        mask (N, K) bool: step j exists (x_{t+j+1} is inside the sequence).
    """
    with torch.no_grad():
        out, state = decoder_states(backbone, head.config.target_prenorm, input_ids=ids)  # (B, T, D) each
        # NOTE: the target's logits as the engine computes them (Gemma's soft-capping included).
        logits = backbone.get_output_embeddings()(out.last_hidden_state)
        target_all = final_logits(backbone.config.get_text_config(), logits)  # (B, T, V)
    drafts = CHAIN_UNROLLS[chain_context](head, state, ids, k)  # K x (B, T, V)
    return _gather_chains(drafts, target_all, ids, lengths, starts, k)


def chain_states(backbone, head, ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, k: int,
                 chain_context: str = "unrolled"):
    """``chain_tensors`` one step before the lm_head: the draft's and the target's lm_head inputs.

    Returns:
        draft_states (N, K, D) (``MtpHead.lm_head_input``, with grad through the head), target_states
        (N, K, D) (the backbone's final normed hidden states, no grad), mask (N, K) bool. The logits
        of ``chain_tensors`` are lm_head(draft_states) and final_logits(lm_head(target_states)).
    """
    with torch.no_grad():
        out, state = decoder_states(backbone, head.config.target_prenorm, input_ids=ids)  # (B, T, D) each
    drafts = CHAIN_UNROLLS[chain_context](head, state, ids, k, lm_head_inputs=True)  # K x (B, T, D)
    return _gather_chains(drafts, out.last_hidden_state, ids, lengths, starts, k)


def _gather_chains(drafts: list[torch.Tensor], target_all: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor,
                   starts: torch.Tensor, k: int):
    """(draft (N, K, X), target (N, K, X), mask (N, K)) at every chain start from K per-depth draft tensors
    (B, T, X) and the target's (B, T, X) (X = V or D)."""
    b_idx, t_idx = chain_starts(ids.shape[1], lengths, starts)
    steps = torch.arange(1, k + 1, device=ids.device)
    mask = (t_idx[:, None] + steps[None, :] + 1) < lengths[b_idx][:, None]  # (N, K)
    target_pos = (t_idx[:, None] + steps[None, :]).clamp_max(ids.shape[1] - 1)
    target = target_all[b_idx[:, None], target_pos]  # (N, K, X)
    draft = torch.stack([d[b_idx, t_idx] for d in drafts], dim=1)  # (N, K, X)
    return draft, target, mask


def chain_starts(width: int, lengths: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row (N,), position (N,)) of every chain of a padded batch of ``width`` columns, row by row: the chain
    order of ``chain_tensors`` and ``chain_states``.

    Example: lengths [5], starts [2] -> rows [0, 0], positions [1, 2] (chains with one verified step or more).
    """
    t = torch.arange(width, device=lengths.device)
    is_start = (t[None, :] >= (starts[:, None] - 1).clamp_min(0)) & (t[None, :] + 2 < lengths[:, None])
    return is_start.nonzero(as_tuple=True)  # (N,), (N,)

"""The teacher-forced chains computed the quadratic way, as a reference for ``bebop.mtp.chain_attention``:
every depth's keys concatenated and a materialised (T, j*T) additive mask, run through the family's own
attention function (SDPA or eager)."""

from __future__ import annotations

import torch


class ConcatCache:
    """``update`` keeps each depth's keys/values (B, Hkv, T, d) and returns all so far: (B, Hkv, depth*T, d)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys.append(key_states)
        self.values.append(value_states)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 1


def served_bias(length: int, depth: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, T, depth*T) additive mask: key block 0 (depth 1) causal, block i >= 1 (depth i+1) only key t.

    Example: length 2, depth 2 -> visible [[1, 0, 1, 0], [1, 1, 0, 1]].
    """
    query = torch.arange(length)[:, None]
    key = torch.arange(length)[None, :]
    visible = torch.cat([key <= query] + [key == query] * (depth - 1), dim=1)
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def unroll_masked(head, hidden: torch.Tensor, input_ids: torch.Tensor, k: int, context: str) -> list[torch.Tensor]:
    """K draft logits (B, T, V) of ``unroll_served`` ("served") or ``MtpHead.unroll`` ("unrolled"), with masks."""
    b, t = input_ids.shape
    positions = torch.arange(t).expand(b, t)
    cache, out, g = ConcatCache() if context == "served" else None, [], hidden
    for j in range(1, k + 1):
        tokens = torch.nn.functional.pad(input_ids[:, j:], (0, min(j, t)), value=0)
        bias = served_bias(t, j if cache else 1, hidden.dtype)
        g = head.forward_step(g, tokens, positions + (j - 1), step=j - 1, attention_bias=bias, cache=cache)
        out.append(head.logits(g, step=j - 1))
    return out

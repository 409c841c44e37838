"""The head's attention along teacher-forced chains, in memory linear in the sequence length.

Training and evaluation run depth j of every chain start t at once (``MtpHead.unroll``,
``bebop.mtp.chains.unroll_served``). Depth j's query at t attends to

* a causal base: the keys of positions 0..t of one depth (depth j's own in the unrolled context,
  the committed depth-1 entries in the served one), and
* in the served context only, its own chain's entries of depths 2..j, all at position t.

``attend`` takes the softmax over the union of both key sets exactly, without a (T, j*T) mask, in
one of two ways:

* ``_sdpa_attend`` (no score soft-capping, no dropout): the causal base is one causal
  ``scaled_dot_product_attention`` (flash kernels, no mask), and the chain's entries join it through
  one extra key: its score at row t is the log-sum-exp c_t of row t's chain scores (carried by an
  extra query coordinate) and its value a unit coordinate, so the output's last coordinate is the
  chain's share of the softmax mass and the rest is the base's output scaled by the remainder; adding
  that share times the chain's own softmax average merges the two exactly (log-sum-exp merge);
* ``_blocked_attend`` (Gemma 2's soft-capped scores, dropout): the queries a block of rows at a time,
  each block's scores (B, H, n, <= T) recomputed in backward (``torch.utils.checkpoint``) instead of
  kept, so memory grows as T too.

Both compute what transformers' eager attention computes (scaling, soft-capping, a float32 softmax,
dropout) up to float rounding, for every family, so they stand in for its attention function.

``chain_attention`` switches the head's attention layers to ``attend`` for the length of one step;
the engine's drafting, which passes real masks, never goes through it.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface, PreTrainedConfig

ATTENTION_NAME = "bebop_chains"  # the name transformers' AttentionInterface finds ``attend`` under
SCORE_BLOCK_ELEMENTS = 2**22  # scores per query block (B * H * rows * keys): 16 MB of float32 at any length


@dataclass
class ChainMask:
    """What ``MtpHead.forward_step`` passes as the attention mask of a teacher-forced chain step: one object
    for all K steps of a served chain (it keeps the depths' keys), a fresh one per step when unrolled."""

    served: bool = False  # the served context: depth 1's keys are every later depth's causal base
    depths: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # served: (keys, values) so far


@contextmanager
def chain_attention(head: nn.Module):
    """Within the block, the attention layers of ``head`` run ``attend`` (their configs are restored after)."""
    AttentionInterface.register(ATTENTION_NAME, attend)
    configs = {id(m.config): m.config for m in head.modules() if isinstance(getattr(m, "config", None),
                                                                           PreTrainedConfig)}
    before = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


def attend(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, T, d)
    key: torch.Tensor,  # (B, Hkv, T, d) this depth's keys (MLA: expanded from the latents)
    value: torch.Tensor,  # (B, Hkv, T, dv)
    attention_mask: ChainMask,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns the attention output (B, T, H, dv) and None."""
    if not isinstance(attention_mask, ChainMask):
        raise TypeError(f"{ATTENTION_NAME} attention runs teacher-forced chains only, got a "
                        f"{type(attention_mask).__name__} mask")
    depths = attention_mask.depths if attention_mask.served else []
    depths.append((key, value))
    (base_k, base_v), chain_k, chain_v = depths[0], [k for k, _ in depths[1:]], [v for _, v in depths[1:]]
    groups = query.shape[1] // base_k.shape[1]  # grouped-query attention: each key head serves `groups` queries

    def expand(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(groups, dim=1) if groups > 1 else x

    base_k, base_v = expand(base_k), expand(base_v)
    chain = [expand(x) for x in (*chain_k, *chain_v)]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    dropout = dropout if module.training else 0.0
    if softcap is None and not dropout:
        out = _sdpa_attend(query, base_k, base_v, chain[:len(chain_k)], chain[len(chain_k):], scaling)
    else:
        out = _blocked_attend(query, base_k, base_v, chain, len(chain_k), scaling, softcap, dropout)
    return out.transpose(1, 2).contiguous(), None


def _sdpa_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, chain_k: list[torch.Tensor],
                 chain_v: list[torch.Tensor], scaling: float) -> torch.Tensor:
    """Causal attention of query (B, H, T, d) over key/value (B, H, T, d|dv), each row also over its chain entries
    chain_k/chain_v (each (B, H, T, d|dv)), merged through one extra key (module docstring); returns (B, H, T, dv).

    Example: no chain entries -> ``scaled_dot_product_attention(query, key, value, is_causal=True)`` (d = dv).
    """
    b, h, t, d = query.shape
    dv, pad = value.shape[-1], nn.functional.pad
    if not chain_k:  # NOTE: q, k and v padded to one head size (MLA's differ): flash kernels need it
        width = _head_size(max(d, dv))
        out = nn.functional.scaled_dot_product_attention(pad(query, (0, width - d)), pad(key, (0, width - d)),
                                                         pad(value, (0, width - dv)), is_causal=True, scale=scaling)
        return out[..., :dv]
    own = torch.stack([(query * k).sum(-1) for k in chain_k], dim=-1) * scaling  # (B, H, T, c) chain scores
    share = own.softmax(-1)
    chain_out = sum(share[..., i, None] * v for i, v in enumerate(chain_v))  # (B, H, T, dv)
    width = _head_size(max(d, dv) + 1)  # one head size for q, k and v; the last coordinate is the sink's
    lse = own.logsumexp(-1, keepdim=True) / scaling  # (B, H, T, 1): the sink's score at row t is scaling * lse
    sink = query.new_zeros(b, h, 1, width)
    sink[..., -1] = 1.0
    # NOTE: a leading all-zero query row aligns the causal mask: row t + 1 sees the sink and keys 0..t.
    q = torch.cat([query.new_zeros(b, h, 1, width), torch.cat([pad(query, (0, width - 1 - d)), lse], -1)], 2)
    k = torch.cat([sink, pad(key, (0, width - d))], 2)
    v = torch.cat([sink, pad(value, (0, width - dv))], 2)
    out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)[:, :, 1:]
    return out[..., :dv] + out[..., -1:] * chain_out  # (1 - w) base output + w chain output, w the chain's share


def _head_size(size: int) -> int:
    """``size`` rounded up to a multiple of 8, the head sizes CUDA's flash and memory-efficient kernels take
    (zero coordinates change no score).

    Example: 129 -> 136; 128 -> 128.
    """
    return -(-size // 8) * 8


def _blocked_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, chain: list[torch.Tensor],
                    num_chain: int, scaling: float, softcap: float | None, dropout: float) -> torch.Tensor:
    """``attend``'s output (B, H, T, dv), ``SCORE_BLOCK_ELEMENTS`` scores at a time (module docstring)."""
    b, h, t, _ = query.shape
    rows = max(1, SCORE_BLOCK_ELEMENTS // (b * h * t))
    block = functools.partial(_attend_block, num_chain=num_chain, scaling=scaling, softcap=softcap, dropout=dropout)
    outs = []
    for start in range(0, t, rows):
        stop = min(start + rows, t)
        args = (query[:, :, start:stop], key[:, :, :stop], value[:, :, :stop], *(x[:, :, start:stop] for x in chain))
        if torch.is_grad_enabled() and any(x.requires_grad for x in args):
            outs.append(checkpoint(block, *args, use_reentrant=False))  # NOTE: keeps the RNG state for dropout
        else:
            outs.append(block(*args))
    return torch.cat(outs, dim=2)


def _attend_block(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *chain: torch.Tensor, num_chain: int,
                  scaling: float, softcap: float | None, dropout: float) -> torch.Tensor:
    """Attention output (B, H, n, dv) of the query rows n of one block, the last of which is row ``stop - 1``.

    Args:
        query: (B, H, n, d) rows stop - n .. stop - 1.
        key, value: (B, H, stop, d) and (B, H, stop, dv): the causal base of every row up to ``stop``.
        chain: ``num_chain`` chain keys (B, H, n, d), then as many chain values (B, H, n, dv), row by row.

    Example: rows 2..3 of a base of 4 keys: row 2 sees base keys 0..2 and its chain entries, row 3 all four.
    """
    n, stop = query.shape[2], key.shape[2]
    scores = torch.matmul(query, key.transpose(2, 3))  # (B, H, n, stop)
    if num_chain:
        own = torch.stack([(query * k).sum(-1) for k in chain[:num_chain]], dim=-1)  # (B, H, n, num_chain)
        scores = torch.cat([scores, own], dim=-1)
    scores = scores * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    rows = torch.arange(stop - n, stop, device=query.device)
    future = torch.arange(stop, device=query.device)[None, :] > rows[:, None]  # (n, stop)
    future = nn.functional.pad(future, (0, num_chain), value=False)
    # NOTE: every row sees at least its own base key, so -inf never meets a fully masked row.
    probs = scores.masked_fill(future, float("-inf")).softmax(-1, dtype=torch.float32).to(query.dtype)
    if dropout:
        probs = nn.functional.dropout(probs, p=dropout)
    out = torch.matmul(probs[..., :stop], value)
    for i in range(num_chain):
        out = out + probs[..., stop + i, None] * chain[num_chain + i]
    return out

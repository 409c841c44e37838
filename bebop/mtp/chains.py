"""Teacher-forced draft chains in either attention context: ``unrolled`` (training's classic one) or
``served`` (the engine's).

At chain start t, draft depth j (1-based) reads token x_{t+j} at rotary position t + j - 1 and
predicts x_{t+j+1}. The two contexts differ only in which keys depth j >= 2 attends to:

* ``unrolled`` (``MtpHead.unroll``): depth j runs over the whole sequence, so its query attends
  to the depth-j keys of positions <= t (entries the engine never computes);
* ``served``: the keys the engine's draft sees (``bebop.speculative.drafter.Drafter.draft``, as in vLLM
  and SGLang): the committed depth-1 entries of positions 0..t, then the chain's own entries of
  depths 2..j. Depth 1 is the same in both.

Both run every position of a batch at once, through ``bebop.mtp.chain_attention`` (no (T, j*T) mask:
memory grows as T*K). ``served`` keeps every depth's keys and values in its ``ChainMask``: depth j's
query at t reads depth 1's keys 0..t and its own chain's entries of depths 2..j.
"""

from __future__ import annotations

import torch

from bebop.mtp.chain_attention import ChainMask
from bebop.mtp.config import CHAIN_CONTEXTS
from bebop.utils.errors import BebopError


def unroll_served(head, hidden: torch.Tensor, input_ids: torch.Tensor, k: int,
                  lm_head_inputs: bool = False) -> list[torch.Tensor]:
    """``MtpHead.unroll`` with the engine's attention context (see the module docstring).

    Args:
        head: an ``MtpHead`` with one physical layer.
        hidden: (B, T, D) backbone states the head reads.
        input_ids: (B, T) the sequence.
        k: depths to unroll (K).
        lm_head_inputs: return the lm_head's inputs (B, T, D) (``MtpHead.lm_head_input``) instead of logits.

    Returns:
        K tensors (B, T, V): draft logits of depth 1..K at each chain start t (inputs past the end
        are padding; their outputs must be masked by the caller); (B, T, D) with lm_head_inputs.
    """
    check_head_context(head, "served")
    b, t = input_ids.shape
    positions = torch.arange(t, device=input_ids.device).expand(b, t)
    mask, out, g = ChainMask(served=True), [], hidden  # NOTE: one mask for the K steps: it keeps their keys
    for j in range(1, k + 1):
        tokens = torch.nn.functional.pad(input_ids[:, j:], (0, min(j, t)), value=0)  # x_{t+j}
        g = head.forward_step(g, tokens, positions + (j - 1), step=j - 1, attention_bias=mask)
        out.append(head.lm_head_input(g, step=j - 1) if lm_head_inputs else head.logits(g, step=j - 1))
    return out


CHAIN_UNROLLS = {  # chain context -> (head, hidden, input_ids, K, lm_head_inputs=False) -> K draft logits (B, T, V)
    "unrolled": lambda head, hidden, input_ids, k, **kw: head.unroll(hidden, input_ids, k, **kw),
    "served": unroll_served,
}


def check_head_context(head, chain_context: str) -> None:
    """Raises BebopError (one line) when ``head`` cannot run chains in ``chain_context``."""
    if chain_context == "served" and len(head.layers) != 1:
        # NOTE: the engine's layers i > 0 hold no committed entries of their own, so there is no served context to copy.
        raise BebopError(f"chain context 'served' needs a head with one MTP layer, this one has {len(head.layers)}; "
                         "use chain context unrolled (--chain-context unrolled)")


def check_chain_context(chain_context: str) -> None:
    """Raises BebopError (one line) unless ``chain_context`` is one of ``CHAIN_CONTEXTS``."""
    if chain_context not in CHAIN_UNROLLS:
        raise BebopError(f"unknown chain context {chain_context!r}; choose one of {', '.join(CHAIN_CONTEXTS)}")

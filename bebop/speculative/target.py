"""The target model inside the engine: one forward per call over a ragged cache, the prefill in chunks.

``Target`` runs an HF causal LM's decoder over ``TargetCache``: per-row KV entries for its attention
layers (``RaggedKVCache``) and per-row conv and recurrent state for its recurrent layers
(``RowStates``: Gated DeltaNet, Mamba2), with the masks of ``bebop.speculative.attention``. A
forward over S > 1 new tokens after the prefill is a verify pass: the recurrent layers keep the
state after each of its positions, and the cache's ``commit`` gives each row the one at its kept
length, or (replay) keep their inputs, and the commit runs each row's kept prefix again from its
state before the pass (``bebop.speculative.state_cache``, ``bebop.speculative.replay``).

The prefill (``Target.prefill``) takes rows ordered longest prompt first, so the rows still inside
their prompts at any position are a prefix of the batch, and runs positions in chunks
(``prefill_chunks``) such that:

1) no attention mask holds more than MASK_BUDGET elements (rows x chunk x keys), and no chunk more
   than PREFILL_TOKENS tokens, whatever the prompts' lengths;
2) with recurrent layers, each row's prompt ends at a chunk's end: no chunk holds padding, which
   would move a recurrent state (a zero input still decays it), and each row's state after its
   prompt is the layer's own final state. Attention-only models pad within a chunk instead, hidden
   by the mask, so a batch of different prompt lengths costs one chunk where it fits.

The lm_head runs only where logits are read: each row's last prompt position in the prefill.
``decoder_states`` (the decoder's output and the state an MTP head reads) lives here because the
engine owns the target's forward; the MTP head's training reads the same states through it.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch import nn

from bebop.speculative import attention
from bebop.speculative.kv_cache import RaggedKVCache
from bebop.speculative.replay import layer_replays, recording
from bebop.speculative.state_cache import RowStates, check_state_protocol
from bebop.utils.errors import BebopError
from bebop.utils.torch_utils import cache_kwargs

MASK_BUDGET = 2**24  # elements of one prefill chunk's mask (R x S x L): 64 MB in float32, at any prompt length
PREFILL_TOKENS = 8192  # tokens of one prefill chunk (R x S): bounds its activations (B x S x hidden widths)


def decoder_of(backbone: nn.Module) -> nn.Module:
    """The decoder (``.layers`` and a final norm) of an HF causal LM; BebopError (one line) when it has none."""
    decoder = backbone.get_decoder() if hasattr(backbone, "get_decoder") else backbone.model
    if not hasattr(decoder, "layers") or final_norm(decoder) is None:
        raise BebopError(f"{type(backbone).__name__} has no decoder with .layers and a final norm")
    return decoder


def final_norm(decoder: nn.Module) -> nn.Module | None:
    """The decoder's final norm: ``norm`` (most families) or ``norm_f`` (NemotronH); None when it has neither."""
    return getattr(decoder, "norm", None) or getattr(decoder, "norm_f", None)


def decoder_states(backbone: nn.Module, target_prenorm: bool = False, **decoder_kwargs):
    """Runs the backbone's decoder; returns (its output, the state an MTP head reads (B, T, D)).

    The state is the final normed hidden state, or with ``target_prenorm`` (MiMo) the input of
    the decoder's final norm, captured by a hook.
    """
    decoder = decoder_of(backbone)
    captured: list[torch.Tensor] = []
    hook = final_norm(decoder).register_forward_pre_hook(lambda _m, args: captured.append(args[0])) \
        if target_prenorm else None
    try:
        out = decoder(**decoder_kwargs)
    finally:
        if hook is not None:
            hook.remove()
    return out, captured[-1] if target_prenorm else out.last_hidden_state


class TargetCache(RaggedKVCache):
    """The target's cache: ``RaggedKVCache`` for its attention layers, ``RowStates`` for its recurrent ones.

    ``begin(num_new, num_rows, record)``: ``record`` marks a verify pass, after which ``commit``
    gives each row the recurrent state at its kept length. ``commit``, ``shift_all`` and
    ``select_rows`` move both parts together.
    """

    def __init__(self, num_layers: int, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype,
                 row_states: RowStates | None = None):
        super().__init__(num_layers, batch_size, max_len, device, dtype)
        self.row_states = row_states or RowStates(batch_size, device)

    def begin(self, num_new: int, num_rows: int | None = None, record: bool = False) -> torch.Tensor:
        positions = super().begin(num_new, num_rows)
        self.row_states.begin(num_new, self._rows, record)
        return positions

    def commit(self, num_kept: list[int]) -> None:
        self.row_states.commit(num_kept[: self._rows])
        super().commit(num_kept)

    def shift_all(self, num: int) -> None:
        self.row_states.commit([num] * self._rows)
        super().shift_all(num)

    def select_rows(self, rows: list[int]) -> None:
        super().select_rows(rows)
        self.row_states.select_rows(rows)

    # transformers' recurrent layers call these (see ``RowStates``)
    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self.row_states.get_conv_state(layer_idx, state_idx)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs):
        return self.row_states.update_conv_state(conv_states, layer_idx, state_idx, **kwargs)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self.row_states.get_recurrent_state(layer_idx, state_idx)

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs):
        return self.row_states.update_recurrent_state(recurrent_states, layer_idx, state_idx)

    def is_recording_past(self, layer_idx: int) -> bool:
        return self.row_states.is_recording_past(layer_idx)

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        return self.row_states.get_recurrent_states_to_keep(layer_idx)

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        self.row_states.increase_count(layer_idx, state_idx)


class Target:
    """The target model's decoder, lm_head and a ``TargetCache``; one decoder forward per call.

    Args:
        model: an HF causal LM (eval mode).
        batch_size, max_len: rows and positions per row of the cache.
        head_reads_prenorm: the MTP head reads the state before the final norm (MiMo).
        recurrent_rollback: how recurrent layers roll back a verify pass: snapshot | replay | auto
            (``bebop.speculative.state_cache``).
    """

    def __init__(self, model, batch_size: int, max_len: int, head_reads_prenorm: bool = False,
                 recurrent_rollback: str = "auto"):
        self.model = model
        self.head_reads_prenorm = head_reads_prenorm
        self.lm_head = model.get_output_embeddings()
        self.config = model.config.get_text_config()
        self.windows = attention.layer_windows(self.config)  # raises on layers it cannot run exactly
        self.recurrent = attention.has_recurrent_layers(self.config)
        if self.recurrent:
            check_state_protocol()
        self.type_windows = attention.layer_type_windows(self.config)
        attention.check_logits(self.config)
        param = next(model.parameters())
        row_states = RowStates(batch_size, param.device, *_rollback(model, self.config, recurrent_rollback))
        self.cache = TargetCache(self.config.num_hidden_layers, batch_size, max_len, param.device, param.dtype,
                                 row_states)

    def forward(self, input_ids: torch.Tensor):
        """A decode step (S = 1) or a verify pass (S > 1) of every row: input_ids (R, S) -> logits (R, S, V),
        the MTP head's input state (R, S, D). The caller commits the cache."""
        out, state = self.run(input_ids, record=input_ids.shape[1] > 1)
        return self.logits(out), state

    def run(self, input_ids: torch.Tensor, valid: torch.Tensor | None = None, num_rows: int | None = None,
            record: bool = False):
        """input_ids (R, S) of rows [0, R) -> final hidden states (R, S, D), the head's input state (R, S, D).

        ``valid`` (R, S) marks real (unpadded) positions (None: all are); ``record``: a verify pass.
        """
        positions = self.cache.begin(input_ids.shape[1], num_rows, record)
        # NOTE: every HF decoder's mask builder returns a 4-D mask unchanged, to every layer (sliding
        # ones included); so one pattern -> one 4-D mask (Llama, Mistral, Phi-3 accept nothing else),
        # mixed patterns or recurrent layers -> the {layer_type: mask} dict that exactly those decoders
        # (layer_types) accept; recurrent and token-wise layers get None (they never see padding).
        if len(set(self.windows)) == 1 and not self.recurrent:
            mask = self.cache.attention_bias(valid, window=self.windows[0])
        else:
            mask = {kind: self.cache.attention_bias(valid, window=w) if kind in attention.ATTENTION else None
                    for kind, w in self.type_windows.items()}
        row_states = self.cache.row_states
        with recording(row_states.replays) if row_states.replaying else nullcontext():
            out, state = decoder_states(
                self.model, self.head_reads_prenorm,
                input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=True,
                **cache_kwargs(self.model.get_decoder(), self.cache),
            )
        return out.last_hidden_state, state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits (..., V) from final hidden states (..., D) (soft-capped where the model caps)."""
        return attention.final_logits(self.config, self.lm_head(hidden))

    def prefill(self, ids: torch.Tensor, lengths: list[int], each_chunk=None):
        """Runs the prompts through the model in ``prefill_chunks`` and commits them to the cache.

        Args:
            ids: (B, W) right-padded prompts, rows ordered longest first.
            lengths: the prompts' lengths (host ints, non-increasing).
            each_chunk: called as ``each_chunk(start, state)`` after each chunk, state (R, S, D) the
                head's input state at positions start .. start + S - 1 of rows [0, R).

        Returns:
            logits (B, V) and the head's input state (B, D) at each row's last prompt position.
        """
        if lengths != sorted(lengths, reverse=True):
            raise ValueError("prefill rows must be ordered longest prompt first")
        device, batch = ids.device, len(lengths)
        last_out = last_state = None
        for start, end, num_rows in prefill_chunks(lengths, self.recurrent, MASK_BUDGET, PREFILL_TOKENS):
            valid = None
            if lengths[num_rows - 1] < end:  # some rows end inside the chunk (attention-only models)
                positions = torch.arange(start, end, device=device)
                valid = positions[None, :] < torch.tensor(lengths[:num_rows], device=device)[:, None]
            out, state = self.run(ids[:num_rows, start:end], valid, num_rows)
            self.cache.commit([min(n, end) - start if b < num_rows else 0 for b, n in enumerate(lengths)])
            if last_out is None:
                last_out, last_state = out.new_empty(batch, out.shape[-1]), state.new_empty(batch, state.shape[-1])
            ending = [b for b in range(num_rows) if lengths[b] <= end]
            if ending:
                rows = torch.tensor(ending, device=device)
                cols = torch.tensor([lengths[b] - 1 - start for b in ending], device=device)
                last_out[rows], last_state[rows] = out[rows, cols], state[rows, cols]
            if each_chunk is not None:
                each_chunk(start, state)
        return self.logits(last_out), last_state


def _rollback(model, config, rollback: str):
    """(rollback, replays) of the model's ``RowStates``: replay needs a ``LayerReplay`` for every recurrent layer;
    without one, auto rolls back by snapshots and a forced replay is refused in one line."""
    recurrent = {i for i, kind in enumerate(getattr(config, "layer_types", None) or []) if kind == attention.RECURRENT}
    replays = layer_replays(model) if recurrent else {}
    if set(replays) != recurrent:
        if rollback == "replay":
            raise BebopError(f"recurrent_rollback replay: Bebop cannot replay the recurrent layers of "
                             f"{config.model_type}; use snapshot")
        rollback, replays = "snapshot", {}
    return rollback, replays


def prefill_chunks(lengths: list[int], cut_at_ends: bool, mask_budget: int,
                   token_budget: int) -> list[tuple[int, int, int]]:
    """(start, end, rows) of each prefill chunk over prompts of ``lengths`` (non-increasing).

    A chunk's rows are the first ``rows``, those whose prompts go past its start. It ends at the
    longest prompt's end, at any prompt's end when ``cut_at_ends``, or where its mask
    (rows x S x (start + S) elements) would exceed ``mask_budget`` or its rows x S tokens
    ``token_budget``; it holds at least one position.

    Example: lengths [5, 3, 3], cut_at_ends, large budgets -> [(0, 3, 3), (3, 5, 1)];
    without cut_at_ends -> [(0, 5, 3)].
    """
    ends = sorted(set(lengths)) if cut_at_ends else [lengths[0]]
    chunks, start = [], 0
    while start < lengths[0]:
        rows = sum(n > start for n in lengths)
        stop = next(e for e in ends if e > start)
        # The largest S with rows * S * (start + S) <= mask_budget.
        span = (math.isqrt(start * start + 4 * (mask_budget // rows)) - start) // 2
        size = max(1, min(stop - start, token_budget // rows, span))
        chunks.append((start, start + size, rows))
        start += size
    return chunks

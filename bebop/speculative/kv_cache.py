"""A ragged KV cache: every row keeps its own length, so rows can roll back independently.

Speculative decoding writes K+1 positions per row per verify step, then keeps a different
number of them in each row. ``RaggedKVCache`` stores fixed buffers of shape (B, H, T_max, d)
per layer and a length per row; a rollback is just a smaller length (no copy, no leak: the
stale entries are overwritten by the next write and hidden by the attention mask meanwhile).
Dropping finished rows moves the rows from the batch's end into their places and keeps the rest
where it is (``fill_order``, ``select_rows``): a copy of the few rows that move, not of the batch.
A forward may cover only the first R rows (``begin(num_new, num_rows=R)``: the engine's prefill,
whose rows are ordered longest prompt first); the others are neither read nor written.
It implements the one method HF attention layers call, ``update(key, value, layer_idx)``.
"""

from __future__ import annotations

import torch


class RaggedKVCache:
    """Per-layer KV buffers with per-row lengths.

    Args:
        num_layers: attention layers that call ``update`` (their ``layer_idx`` must be < num_layers).
        batch_size: rows B.
        max_len: capacity per row in positions.
        device, dtype: of the buffers (allocated lazily on first write, when head counts are known).
    """

    def __init__(self, num_layers: int, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype):
        self.num_layers = num_layers
        self.max_len = max_len
        self.device = device
        self.dtype = dtype
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (B, H, max_len, d), from its first write
        self.values: dict[int, torch.Tensor] = {}
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,) committed positions
        self.host_lengths = [0] * batch_size  # the same on the host, so no forward needs a sync
        self._write_index: torch.Tensor | None = None  # (R, S) positions the pending forward writes
        self._read_len = 0  # keys returned to attention: max over its rows of length + S
        self._rows = batch_size  # R: the pending forward runs rows [0, R)

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def begin(self, num_new: int, num_rows: int | None = None) -> torch.Tensor:
        """Prepares a forward that appends ``num_new`` positions to each of the first ``num_rows`` rows.

        Args:
            num_new: S, positions written per row by the coming forward (padded rows included).
            num_rows: R, the forward's rows are [0, R) (default: all B).

        Returns:
            position_ids (R, S): each row's new positions, ``lengths[b] + arange(S)``.
        """
        self._rows = self.batch_size if num_rows is None else num_rows
        max_length = max(self.host_lengths[: self._rows], default=0)
        if max_length + num_new > self.max_len:
            raise ValueError(f"KV cache full: {max_length} + {num_new} > capacity {self.max_len}")
        offsets = torch.arange(num_new, device=self.device)
        self._write_index = self.lengths[: self._rows, None] + offsets[None, :]  # (R, S)
        self._read_len = max_length + num_new
        return self._write_index

    def attention_bias(self, valid_new: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
        """Additive attention mask (R, 1, S, L) for the pending forward (0 = attend, large negative = not).

        Query s of row b sees cached keys < lengths[b] and new keys at offsets <= s. ``valid_new``
        (R, S) bool marks real (non-padded) new positions; padded keys are hidden from everyone.
        ``window`` w (a sliding-window layer) further limits a query at position t to keys > t - w,
        as HF's ``create_sliding_window_causal_mask`` does; None = full causal attention.
        """
        assert self._write_index is not None, "call begin() first"
        key_pos = torch.arange(self._read_len, device=self.device)  # (L,)
        query_pos = self._write_index  # (R, S)
        visible = key_pos[None, None, :] <= query_pos[:, :, None]  # (R, S, L) causal within the row
        if window is not None:
            # NOTE: a row's key slot is its absolute position (no left padding), so the window is positional.
            visible &= key_pos[None, None, :] > query_pos[:, :, None] - window
        if valid_new is not None:
            # Hide padded new keys: a key at position p >= lengths[b] is new; it is valid iff its slot is.
            new_slot = key_pos[None, :] - self.lengths[: self._rows, None]  # (R, L)
            in_new = (new_slot >= 0) & (new_slot < valid_new.shape[1])
            slot_valid = torch.gather(valid_new, 1, new_slot.clamp(0, valid_new.shape[1] - 1))
            visible &= ~(in_new & ~slot_valid)[:, None, :]
        # NOTE: finite (finfo.min), not -inf, so a padded query whose keys are all hidden gives no NaN.
        bias = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        bias.masked_fill_(~visible, torch.finfo(self.dtype).min)
        return bias[:, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Writes the new keys/values (R, H, S, d) at each row's positions; returns (R, H, L, d) for attention.

        Keys and values may differ in heads and width (MLA: DeepSeek-V3), so each gets its own buffer.
        """
        if layer_idx not in self.keys:
            self.keys[layer_idx] = self._buffer(key_states)
            self.values[layer_idx] = self._buffer(value_states)
        rows = self._rows
        for buf, new in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            buf[:rows].scatter_(2, self._write_index[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3]), new)
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        return k_buf[:rows, :, : self._read_len], v_buf[:rows, :, : self._read_len]

    def _buffer(self, states: torch.Tensor) -> torch.Tensor:  # (B, H, max_len, d) zeros like ``states``' heads
        _, h, _, d = states.shape
        return torch.zeros(self.batch_size, h, self.max_len, d, device=self.device, dtype=states.dtype)

    def commit(self, num_kept: list[int]) -> None:
        """Keeps the first ``num_kept[b]`` of the positions just written in each row (host ints)."""
        self.host_lengths = [a + b for a, b in zip(self.host_lengths, num_kept, strict=True)]
        self.lengths = torch.tensor(self.host_lengths, dtype=torch.long, device=self.device)
        self._write_index = None

    def shift_all(self, num: int) -> None:
        """Adds ``num`` (may be negative: a rollback) to every row's length, without a host-to-device copy."""
        self.host_lengths = [a + num for a in self.host_lengths]
        self.lengths = self.lengths + num
        self._write_index = None

    def rollback(self, num: int) -> None:
        """Forgets the last ``num`` committed positions of every row (speculative draft entries)."""
        self.shift_all(-num)

    def select_rows(self, rows: list[int]) -> None:
        """Keeps only ``rows`` of the batch, in that order (finished rows stop costing compute).

        When every row that moves comes from past the new batch size (``fill_order``'s order), the
        buffers are compacted in place: only the moved rows are copied (``take_rows``).
        """
        self.host_lengths = [self.host_lengths[r] for r in rows]
        self.lengths = self.lengths[torch.tensor(rows, dtype=torch.long, device=self.device)]
        self._rows = len(rows)
        take_rows(self.keys, rows)
        take_rows(self.values, rows)

    # The few Cache methods HF code may query.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.host_lengths, default=0)

    def __len__(self) -> int:
        return self.num_layers


def fill_order(keep: list[int]) -> list[int]:
    """The rows ``keep`` (increasing) ordered so that a kept row below len(keep) stays where it is and
    the rows from past it fill the holes: ``RaggedKVCache.select_rows`` then copies only those.

    Example: fill_order([0, 2, 3, 5]) -> [0, 5, 2, 3] (row 5 moves into row 1's place).
    """
    num = len(keep)
    stay = {r for r in keep if r < num}
    order = list(range(num))
    holes = (p for p in range(num) if p not in stay)
    for hole, row in zip(holes, (r for r in keep if r >= num)):
        order[hole] = row
    return order


def take_rows(buffers: dict, rows: list[int]) -> None:
    """Replaces every tensor (B, ...) of ``buffers`` by its ``rows``, in that order.

    When every row that moves comes from past len(rows) (``fill_order``'s order), only the moved
    rows are copied and the first len(rows) rows of the old tensor are kept as a view; any other
    order copies every kept row.
    """
    if not buffers:
        return
    device = next(iter(buffers.values())).device
    moved = [(p, r) for p, r in enumerate(rows) if p != r]
    if not all(r >= len(rows) for _, r in moved):
        index = torch.tensor(rows, dtype=torch.long, device=device)
        for key, buf in buffers.items():
            buffers[key] = buf[index]
        return
    target = torch.tensor([p for p, _ in moved], dtype=torch.long, device=device)
    source = torch.tensor([r for _, r in moved], dtype=torch.long, device=device)
    for key, buf in buffers.items():
        if moved:
            buf.index_copy_(0, target, buf.index_select(0, source))
        buffers[key] = buf[: len(rows)]

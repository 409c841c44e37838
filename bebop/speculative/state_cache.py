"""Per-row state of a model's recurrent layers (Gated DeltaNet, Mamba2, ...), rolled back exactly after a verify pass.

A recurrent layer keeps, per row, a convolution window (the last ``kernel`` inputs of its short
causal convolution) and a recurrent state (Gated DeltaNet's (H, d_k, d_v) matrices, Mamba2's
(H, d_head, N) SSM state). Unlike KV entries, a state cannot be shortened: a row that keeps n of
the K+1 tokens of a verify pass needs the state after its n-th token, which the pass computed on
its way to the end. ``RowStates`` keeps it by snapshots:

* prefill chunk or plain step: the layer computes its final state, which replaces the row's;
* verify pass (``begin(num_new, record=True)``): the layer runs its S = K+1 positions with its
  sequential recurrence and hands over the state after every position (transformers'
  ``get_recurrent_states_to_keep`` protocol), and the window is kept with all S new inputs
  appended; ``commit(kept)`` then gives row b snapshot kept[b] - 1 and the ``kernel`` inputs that
  end at its kept[b]-th token. Nothing is recomputed and no row waits for another.

Cost per row and recurrent layer: a verify pass holds S recurrent states (S - 1 more than a plain
step) and S more window columns until its commit; the commit copies one state per row.

Or by replay (``bebop.speculative.replay``): the verify pass runs the layer's chunked form, keeps no
per-position state (the committed state stays as each row's checkpoint) and holds the conv inputs and
the recurrence's other per-position inputs; ``commit(kept)`` runs each layer's recurrence once over
all rows from their checkpoints, the positions past a row's kept length made identity steps.
``rollback`` auto picks replay for a pass whose snapshots would pass SNAPSHOT_BUDGET.

It implements the cache methods transformers' recurrent layers call (``get_conv_state``,
``update_conv_state``, ``get_recurrent_state``, ``update_recurrent_state``, ``is_recording_past``,
``get_recurrent_states_to_keep``, ``increase_count``), keyed by (layer, state index), so every layer
kind written against that interface (a short convolution alone, several convolutions per layer)
runs here unchanged. A forward may cover only the first R rows of the batch (``num_rows``): the
engine's prefill orders rows longest prompt first, so the rows still inside their prompts are a prefix.
"""

from __future__ import annotations

import torch

from bebop.speculative.kv_cache import take_rows
from bebop.speculative.replay import LayerReplay
from bebop.utils.errors import BebopError

Key = tuple[int, int]  # (layer index, state index within the layer)
SNAPSHOT_BUDGET = 256 * 2**20  # bytes: auto replays a pass whose snapshots would hold more (less memory, slower on CPU)


def check_state_protocol() -> None:
    """Refuses, in one line, a transformers whose recurrent layers cannot hand over every position's state.

    Those layers ask the cache ``get_recurrent_states_to_keep`` before a pass of several tokens (transformers
    5.25 does; 5.19, the newest vLLM's CPU build 0.32 allows, does not): without the states there is no exact
    rollback after a verify pass.
    """
    import transformers
    from transformers import cache_utils

    if not hasattr(cache_utils.Cache, "get_recurrent_states_to_keep"):
        raise BebopError(f"Bebop's engine runs recurrent (linear-attention, Mamba) layers exactly only with a "
                         f"transformers whose caches keep per-position recurrent states (5.25 does), and this "
                         f"environment has {transformers.__version__}: upgrade transformers, or serve this model "
                         f"with --backend vllm")


class RowStates:
    """Each row's conv windows and recurrent states, for every recurrent layer that writes one.

    Args:
        batch_size: rows B.
        device: of the buffers (allocated on a layer's first write, when their shapes are known).
        rollback: snapshot | replay | auto (``choose_rollback``, per verify pass).
        replays: layer index -> its ``LayerReplay`` (every recurrent layer's, for replay).
    """

    def __init__(self, batch_size: int, device: torch.device, rollback: str = "snapshot",
                 replays: dict[int, LayerReplay] | None = None):
        self.batch_size = batch_size
        self.device = device
        self.rollback = rollback
        self.replays = replays or {}
        self.replaying = False  # the pending forward is a verify pass rolled back by replay
        self.windows: dict[Key, torch.Tensor] = {}  # (B, C, kernel) each: the last ``kernel`` conv inputs
        self.states: dict[Key, torch.Tensor] = {}  # (B, ...) each: the recurrent state
        self._rows = batch_size  # R: the pending forward runs rows [0, R)
        self._record = 0  # S when the pending forward is a verify pass, else 0
        self._inputs: dict[Key, torch.Tensor] = {}  # verify pass: (R, C, kernel + S) window and new inputs
        self._snapshots: dict[Key, list[torch.Tensor]] = {}  # verify pass: S states (R, ...), one per position

    def begin(self, num_new: int, num_rows: int, record: bool) -> None:
        """Prepares a forward of ``num_new`` positions over rows [0, num_rows); ``record``: a verify pass."""
        self._rows, self._record = num_rows, num_new if record else 0
        self._inputs, self._snapshots = {}, {}
        self.replaying = bool(record) and self.choose_rollback(num_new, num_rows) == "replay"

    def choose_rollback(self, num_new: int, num_rows: int) -> str:
        """How a verify pass of ``num_new`` positions over ``num_rows`` rows is rolled back (``rollback``, or for
        auto: replay when its snapshots, num_new states per row and layer, would pass SNAPSHOT_BUDGET)."""
        if self.rollback != "auto":
            return self.rollback
        state_bytes = sum(t[0].numel() * t.element_size() for t in self.states.values())
        return "replay" if num_new * num_rows * state_bytes > SNAPSHOT_BUDGET else "snapshot"

    # ------------------------------------------------------------------ transformers' interface
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        window = self.windows.get((layer_idx, state_idx))
        return None if window is None else window[: self._rows]

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                          conv_kernel_size: int | None = None, **kwargs) -> torch.Tensor:
        """Takes the new conv inputs (R, C, S); returns the rows' windows followed by them (R, C, kernel + S).

        The layer convolves the returned inputs and keeps the last S outputs, so every new position
        sees its row's previous inputs (zeros before the first, as a causal convolution's padding).
        """
        key = (layer_idx, state_idx)
        if conv_kernel_size is None:
            raise ValueError(f"layer {layer_idx} writes its conv state without a kernel size; Bebop's engine "
                             "keeps windows only for layers that pass conv_kernel_size")
        if key not in self.windows:
            self.windows[key] = conv_states.new_zeros(self.batch_size, conv_states.shape[1], conv_kernel_size)
        window = self.windows[key]
        inputs = torch.cat([window[: self._rows], conv_states.to(window.dtype)], dim=-1)
        if self._record:
            self._inputs[key] = inputs
        else:
            window[: self._rows] = inputs[..., -window.shape[-1]:]
        return inputs

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        state = self.states.get((layer_idx, state_idx))
        return None if state is None else state[: self._rows]

    def update_recurrent_state(self, recurrent_states: torch.Tensor | list[torch.Tensor], layer_idx: int,
                               state_idx: int = 0, **kwargs) -> torch.Tensor:
        """Takes the state after the forward (R, ...), or (verify pass) the states after each of its S positions.

        A verify pass rolled back by replay hands over its last state only, which is not kept: the committed
        state stays as the rows' checkpoint.
        """
        key = (layer_idx, state_idx)
        snapshots = [recurrent_states] if isinstance(recurrent_states, torch.Tensor) else list(recurrent_states)
        if self.replaying:
            if key not in self.states:  # the layer started from zeros: so does the replay
                self.states[key] = snapshots[-1].new_zeros(self.batch_size, *snapshots[-1].shape[1:])
            return snapshots[-1]
        if self._record:
            if len(snapshots) != self._record:  # NOTE: without every position's state there is no exact rollback
                raise ValueError(f"layer {layer_idx} returned {len(snapshots)} states for a verify pass of "
                                 f"{self._record} positions")
            self._snapshots[key] = snapshots
            return snapshots[-1]
        last = snapshots[-1]
        if key not in self.states:
            self.states[key] = last.new_zeros(self.batch_size, *last.shape[1:])
        self.states[key][: self._rows] = last
        return self.states[key][: self._rows]

    def is_recording_past(self, layer_idx: int) -> bool:
        """Always True: every conv input then goes through ``update_conv_state``, never into the window in place."""
        return True

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        """S in a verify pass rolled back by snapshots (the layer returns the state after every position), else 0
        (the last state only: the layer runs its chunked form)."""
        return 0 if self.replaying else self._record

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        """Positions are counted by the KV cache's lengths; nothing to do."""

    # ------------------------------------------------------------------ the engine's interface
    def commit(self, num_kept: list[int]) -> None:
        """After a verify pass, row b (of the R run) keeps its state after its first ``num_kept[b]`` positions.

        A no-op after any other forward (its states are already final).
        """
        if not self._record:
            return
        if len(num_kept) != self._rows or not all(1 <= n <= self._record for n in num_kept):
            raise ValueError(f"cannot keep {num_kept} of {self._record} positions in {self._rows} rows")
        kept = torch.tensor(num_kept, device=self.device)
        for key, inputs in self._inputs.items():
            window = self.windows[key]
            width = window.shape[-1]
            # Row b's window: its inputs kept[b] .. kept[b] + kernel - 1 of [old window, S new inputs].
            index = kept[:, None] + torch.arange(width, device=self.device)  # (R, kernel)
            window[: self._rows] = inputs.gather(2, index[:, None, :].expand(-1, inputs.shape[1], -1))
        if self.replaying:
            self._replay(kept)
        groups = {n: torch.tensor([b for b, m in enumerate(num_kept) if m == n], device=self.device)
                  for n in set(num_kept)}  # rows by kept length: one copy per group and layer
        for key, snapshots in self._snapshots.items():
            state = self.states[key]
            for n, rows in groups.items():
                state.index_copy_(0, rows, snapshots[n - 1].index_select(0, rows).to(state.dtype))
        self._record, self.replaying = 0, False
        self._inputs, self._snapshots = {}, {}

    def _replay(self, kept: torch.Tensor) -> None:
        """Each layer's state after its rows' kept positions, run from the checkpoints: one call per layer."""
        keep = torch.arange(self._record, device=self.device)[None, :] < kept[:, None]  # (R, S)
        for (layer_idx, state_idx), inputs in self._inputs.items():
            state = self.states[(layer_idx, state_idx)]
            replay = self.replays[layer_idx]
            state[: self._rows] = replay.replay(state[: self._rows], inputs, keep).to(state.dtype)
            replay.recorded = {}

    def select_rows(self, rows: list[int]) -> None:
        """Keeps only ``rows`` of the batch, in that order (as ``RaggedKVCache.select_rows``)."""
        self.batch_size = self._rows = len(rows)
        take_rows(self.windows, rows)
        take_rows(self.states, rows)

    def nbytes(self) -> int:
        """Bytes held by the committed windows and states (the pending verify pass's snapshots not included)."""
        return sum(t.numel() * t.element_size() for d in (self.windows, self.states) for t in d.values())

    def pending_nbytes(self) -> int:
        """Bytes a verify pass holds until its commit: the windows with its inputs, and every position's state
        (snapshots) or the recurrence's recorded inputs (replay)."""
        tensors = [t for snaps in self._snapshots.values() for t in snaps] + list(self._inputs.values())
        recorded = sum(r.nbytes() for r in self.replays.values()) if self.replaying else 0
        return recorded + sum(t.numel() * t.element_size() for t in tensors)

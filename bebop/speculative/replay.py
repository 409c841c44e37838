"""Replay rollback of recurrent layers: after a verify pass, each row's kept prefix is run again from its checkpoint.

Terms: a row's **checkpoint** is its recurrent state and conv window before the verify pass (the
committed ones, which the pass leaves in place); the recurrence's **inputs** are what the layer
feeds its recurrence at each of the pass's S = K+1 positions. A verify pass in replay mode runs the
layer's chunked form over its S positions and keeps no per-position state; ``RowStates`` keeps
the conv inputs (they reach the cache anyway), and the ``LayerReplay`` of the layer records the rest
(small projections, captured by forward hooks on the layer's own linear maps during the pass).
``commit(kept)`` then runs, per layer, one chunked call of the layer's own recurrence over all rows,
in which the positions past a row's kept length are identity steps:

* Gated DeltaNet (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): S <- exp(g) S + k (beta (v - exp(g) S^T k))^T;
  with g = 0 (log space) and beta = 0 this is S. Recorded: the projections a and b (R, S, H) from
  which g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) follow.
* Mamba2 (Nemotron-H): S <- exp(A dt) S + dt x B^T; with dt = 0 (after softplus and clamp) this is S.
  Recorded: the raw dt (R, S, H), the last H columns of ``in_proj``.

The conv inputs with the checkpoint's window give the conv outputs (q, k, v / x, B, C) again. Per row
and layer a pass holds S x (conv channels + 2H or H) values instead of S states: Qwen3.5's Gated
DeltaNet holds 8,256 values per position against a 2 MiB state.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


class LayerReplay:
    """One recurrent layer's replay: what its verify pass records, and its kept prefix run again.

    Args:
        layer: the layer module (its ``layer_idx``, conv and parameters are read).
    """

    def __init__(self, layer: nn.Module):
        self.layer = layer
        self.family = sys.modules[type(layer).__module__]  # the layer's modeling module: its own recurrence
        self.recorded: dict[str, torch.Tensor] = {}  # name -> (R, S, ...) of the pending verify pass

    def hooks(self) -> list[tuple[nn.Module, str]]:
        """(linear map, name): the map's output is recorded under the name during a verify pass."""
        raise NotImplementedError

    def record(self, name: str, output: torch.Tensor) -> None:
        self.recorded[name] = output

    def conv(self, inputs: torch.Tensor, num_new: int) -> torch.Tensor:
        """The layer's conv outputs (R, S, C) at the pass's S positions, from its inputs (R, C, kernel + S)."""
        conv1d = self.layer.conv1d
        out = self.family.causal_conv1d_fn(inputs, conv1d.weight.squeeze(1), conv1d.bias,
                                           activation=self.layer.activation)
        return out[..., -num_new:].transpose(1, 2)

    def replay(self, state: torch.Tensor, inputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The state after each row's kept positions.

        Args:
            state: the checkpoint (R, ...), as the layer keeps it.
            inputs: conv inputs (R, C, kernel + S): the checkpoint's window, then the pass's S inputs.
            keep: (R, S) bool, True at each row's kept positions (a prefix of each row).

        Returns:
            (R, ...) float32: the state plain steps over the kept positions would hold.
        """
        raise NotImplementedError

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.recorded.values())


class GatedDeltaNetReplay(LayerReplay):
    """Gated DeltaNet (Qwen3.5 and Qwen3.5-MoE: ``in_proj_a``/``in_proj_b``; Qwen3-Next: ``in_proj_ba``)."""

    def hooks(self):
        layer = self.layer
        if hasattr(layer, "in_proj_ba"):
            return [(layer.in_proj_ba, "ba")]
        return [(layer.in_proj_a, "a"), (layer.in_proj_b, "b")]

    def _a_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        if "ba" not in self.recorded:
            return self.recorded["a"], self.recorded["b"]
        ba = self.recorded["ba"]  # per key head: its value heads' b, then their a (Qwen3-Next's ordering)
        layer = self.layer
        per_head = layer.num_v_heads // layer.num_k_heads
        b, a = ba.view(*ba.shape[:2], layer.num_k_heads, 2 * per_head).split([per_head, per_head], dim=-1)
        return a.reshape(*ba.shape[:2], -1), b.reshape(*ba.shape[:2], -1)

    def replay(self, state, inputs, keep):
        layer, (rows, num_new) = self.layer, keep.shape
        query, key, value = self.conv(inputs, num_new).split([layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
        a, b = self._a_b()
        g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
        zero = torch.zeros((), device=g.device)
        _, final = self.family.torch_chunk_gated_delta_rule(
            query.reshape(rows, num_new, -1, layer.head_k_dim), key.reshape(rows, num_new, -1, layer.head_k_dim),
            value.reshape(rows, num_new, -1, layer.head_v_dim),
            g=torch.where(keep[..., None], g, zero), beta=torch.where(keep[..., None], b.sigmoid(), zero.to(b.dtype)),
            chunk_size=num_new, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
        )
        return final


class Mamba2Replay(LayerReplay):
    """Mamba2 (Nemotron-H's mixer)."""

    def hooks(self):
        return [(self.layer.in_proj, "dt")]

    def record(self, name, output):
        self.recorded[name] = output[..., -self.layer.num_heads:].clone()  # dt only, not the gate nor x, B, C

    def replay(self, state, inputs, keep):
        layer, (rows, num_new) = self.layer, keep.shape
        group = layer.n_groups * layer.ssm_state_size
        x, b, c = self.conv(inputs, num_new).split([layer.intermediate_size, group, group], dim=-1)
        dt = self.recorded["dt"]
        dt = F.softplus(dt + layer.dt_bias.to(dt.dtype)).clamp(*layer.time_step_limit)
        _, final = self.family.mamba2_chunk_scan(
            x.reshape(rows, num_new, layer.num_heads, layer.head_dim),
            torch.where(keep[..., None], dt, torch.zeros((), device=dt.device, dtype=dt.dtype)),
            -torch.exp(layer.A_log.float()),
            b.reshape(rows, num_new, layer.n_groups, layer.ssm_state_size),
            c.reshape(rows, num_new, layer.n_groups, layer.ssm_state_size),
            chunk_size=num_new, initial_states=state, return_final_states=True,
        )
        return final


REPLAYS = {"GatedDeltaNet": GatedDeltaNetReplay, "Mamba2Mixer": Mamba2Replay}  # layer class name suffix -> replay


def layer_replays(model: nn.Module) -> dict[int, LayerReplay]:
    """layer index -> the ``LayerReplay`` of each recurrent layer of ``model`` whose kind has one."""
    replays = {}
    for module in model.modules():
        kind = next((cls for suffix, cls in REPLAYS.items() if type(module).__name__.endswith(suffix)), None)
        if kind is not None:
            replays[module.layer_idx] = kind(module)
    return replays


@contextmanager
def recording(replays: dict[int, LayerReplay]):
    """Within: every replay records its layer's projections (forward hooks, removed on exit)."""
    handles = []
    try:
        for replay in replays.values():
            replay.recorded = {}
            for module, name in replay.hooks():
                handles.append(module.register_forward_hook(
                    lambda _m, _args, out, replay=replay, name=name: replay.record(name, out)))
        yield
    finally:
        for handle in handles:
            handle.remove()

"""What each layer of a target model sees, so the engine masks it exactly as the model does.

Bebop's engine builds its own attention masks (a ragged cache needs per-row masks), so it must
reproduce every layer's attention pattern, or the sampled distribution is not the model's. The
patterns it reproduces exactly are the ones Hugging Face decoders build with ``create_causal_mask``
and ``create_sliding_window_causal_mask``:

* ``full_attention``: query t sees keys 0..t;
* ``sliding_attention`` with window w: query t sees keys t-w+1..t (w keys, itself included).

Two more layer kinds need no mask: ``linear_attention`` layers are recurrent (Gated DeltaNet in
Qwen3.5 and Qwen3-Next, Mamba2 in NemotronH): they carry a per-row state instead of keys
(``bebop.speculative.state_cache``) and see no padding, because the engine never feeds them any;
NemotronH's ``mlp`` and ``moe`` blocks mix no tokens. Recurrent layers are run only for the families
in ``RECURRENT_MODEL_TYPES``, whose layers keep their state through transformers' cache interface
(tested on a tiny model of each).

Which layer has which kind comes from the config, as the HF decoders read it: ``layer_types``
when the config has it (Qwen2/3, Qwen3.5, Gemma 2/3, NemotronH's ``layers_block_type``), otherwise
every layer is sliding when ``sliding_window`` is set (Mistral, Mixtral, Phi-3) and full when not
(Llama). Anything else (chunked attention, bidirectional attention, recurrent layers of other
families) is refused with one line, never approximated.

The target's logits are ``lm_head(hidden)``, followed by Gemma's final logit soft-capping when the
config sets it; configs that scale logits in other ways are refused.
"""

from __future__ import annotations

import torch

from bebop.utils.errors import BebopError

FULL = "full_attention"
SLIDING = "sliding_attention"
ATTENTION = (FULL, SLIDING)
RECURRENT = "linear_attention"  # a layer with per-row conv and recurrent state (Gated DeltaNet, Mamba2)
TOKEN_WISE = ("mlp", "moe")  # NemotronH blocks without token mixing
RECURRENT_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "nemotron_h")  # see the docstring
UNSUPPORTED_LOGIT_SCALES = ("logit_scale", "logits_scaling")  # Cohere, Granite: not reproduced by the engine


def layer_windows(config) -> list[int | None]:
    """Each decoder layer's attention window: w for a sliding window; None for full causal attention
    and for layers without attention (recurrent, token-wise).

    Args:
        config: the model's (text) config.

    Returns:
        One entry per layer (``num_hidden_layers``).

    Raises:
        BebopError: a layer kind the engine cannot run exactly (one line naming it).

    Example: a Gemma 3 config with sliding_window=4 and layer_types
    ["sliding_attention", "full_attention"] -> [4, None].
    """
    window = getattr(config, "sliding_window", None) or None
    return [window if kind == SLIDING else None for kind in layer_kinds(config)]


def layer_kinds(config) -> list[str]:
    """Each decoder layer's kind: FULL, SLIDING, RECURRENT or one of TOKEN_WISE; raises BebopError
    (one line) on a kind the engine cannot run exactly.

    Example: a tiny Qwen3.5 text config of 4 layers (default layer_types) ->
    ["linear_attention", "linear_attention", "linear_attention", "full_attention"].
    """
    name = getattr(config, "model_type", type(config).__name__)
    if getattr(config, "use_bidirectional_attention", False):
        raise BebopError(f"{name} uses bidirectional attention; Bebop's engine runs causal decoders only")
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    if not types:
        return [SLIDING if window else FULL] * config.num_hidden_layers
    for i, kind in enumerate(types[: config.num_hidden_layers]):
        runs = (kind == FULL or kind in TOKEN_WISE or (kind == SLIDING and window)
                or (kind == RECURRENT and name in RECURRENT_MODEL_TYPES))
        if not runs:
            raise BebopError(
                f"{name} layer {i} is {kind!r}: Bebop's engine runs full and sliding-window attention layers, and the "
                f"recurrent layers of {', '.join(RECURRENT_MODEL_TYPES)}, exactly, so it refuses this model"
            )
    return list(types[: config.num_hidden_layers])


def layer_type_windows(config) -> dict[str, int | None]:
    """{layer type: window} for the layer types the config uses ({} when it has no ``layer_types``)."""
    types = getattr(config, "layer_types", None) or []
    windows = layer_windows(config)
    return dict(zip(types, windows))


def has_recurrent_layers(config) -> bool:
    """Whether any decoder layer is recurrent (``RECURRENT``)."""
    return RECURRENT in layer_kinds(config)


def check_logits(config) -> None:
    """Refuses configs whose logits are not ``lm_head(hidden)`` up to soft-capping (one line)."""
    for key in UNSUPPORTED_LOGIT_SCALES:
        if getattr(config, key, None) not in (None, 1, 1.0):
            raise BebopError(
                f"{getattr(config, 'model_type', '')} scales its logits ({key}={getattr(config, key)}), which "
                f"Bebop's engine does not reproduce; it refuses this model"
            )


def final_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """Applies the model's final logit soft-capping (Gemma 2/3) to ``lm_head`` outputs (..., V), if any."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap

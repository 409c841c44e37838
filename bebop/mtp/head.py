"""The MTP draft head: DeepSeek-V3 / Qwen3.5-style multi-token prediction on a frozen HF causal LM.

One step of the head at position t::

    x = block(fc(cat[norm_e(emb(x_{t+1})), norm_h(h_t)]))     # h_t: the backbone's final hidden state
    logits = lm_head(norm_out(x))

and step j+1 feeds step j's output in place of h_t, with the next token's embedding. One physical
layer (by default) is applied recurrently for K steps (step j uses layer j % num_layers). The
embedding and lm_head are the backbone's own, shared and frozen; the block is the backbone's own
decoder-layer class. Each layer holds transformers' ``MtpLayer`` modules (enorm, hnorm, eh_proj,
mtp_block, post_norm), so weights follow the DeepSeek naming; ``bebop.mtp.native`` maps them to
and from each family's checkpoint names.

Conventions (vLLM's, so a head trained here behaves the same when exported):
1) h_t is the backbone's *final normed* hidden state (the tensor its lm_head reads), except for
   MiMo, whose head reads the state before the final norm (``bebop.speculative.target.decoder_states``
   gives either);
2) the step that consumes (h_t, x_{t+1}) runs at rotary position t, and chained step j at t + j - 1;
3) per family (``MtpConventions``, chosen from the backbone's family when the head is built):
   the order of the projection input (MiMo puts the hidden state first), whether the embedding at
   position 0 is zeroed (DeepSeek-V3, GLM-4.5, MiMo), and whether the next step receives the normed
   output or the block's pre-norm output. The default (Qwen3.5 / Qwen3-Next, and every backbone
   without a native MTP family) is: embedding first, nothing zeroed, the normed output chained.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_layers import MtpLayer

from bebop.architectures import check_architecture
from bebop.mtp.chain_attention import ChainMask, chain_attention
from bebop.mtp.families import FAMILIES, MtpConventions, detect_family
from bebop.speculative import attention
from bebop.speculative.target import decoder_of, final_norm
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir
from bebop.utils.torch_utils import cache_kwargs

CONFIG_NAME = "mtp_config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class MtpConfig:
    """What a saved head needs to be rebuilt on a backbone."""

    num_layers: int = 1  # physical MTP layers; draft step j uses layer j % num_layers
    hidden_size: int = 0  # D of the backbone it was built for
    vocab_size: int = 0  # V of the backbone it was built for
    backbone_type: str = ""  # e.g. "qwen3_5_text", informative
    decoder_layer: str = ""  # class name of the block, e.g. "Qwen3_5DecoderLayer"
    family: str = ""  # native MTP family whose layout and conventions the head follows ("" = none)
    hidden_first: bool = False  # see MtpConventions
    zero_first_embedding: bool = False  # see MtpConventions
    chain_prenorm: bool = False  # see MtpConventions
    target_prenorm: bool = False  # see MtpConventions

    @property
    def conventions(self) -> MtpConventions:
        return MtpConventions(self.hidden_first, self.zero_first_embedding, self.chain_prenorm, self.target_prenorm)


class MtpHead(nn.Module):
    """A recurrent MTP draft head attached to a frozen backbone.

    Only the MTP layers are parameters of this module (``state_dict`` holds nothing of the
    backbone); the embedding, lm_head and rotary embedding are read from the backbone.

    Args:
        backbone: an HF causal LM (``get_decoder()`` with ``.layers``, ``.norm``, ``.rotary_emb``).
        num_layers: physical MTP layers (1 in DeepSeek-V3/Qwen3.5).
        family: native MTP family whose conventions the head follows; None = the backbone's own
            (``bebop.mtp.families.detect_family``), "" = none (the default conventions).
        warm_start: start each block from the backbone's last attention layer (False when weights are
            loaded right after).

    The head is put on the backbone's device, in its dtype: the engine drafts in the dtype it
    verifies in. A head trained in bfloat16 keeps float32 master weights in its optimizer and is
    saved from them (``bebop.utils.optim``); loading casts the saved weights to the backbone's dtype.
    """

    def __init__(self, backbone: nn.Module, num_layers: int = 1, family: str | None = None, warm_start: bool = True):
        super().__init__()
        check_architecture(backbone)
        decoder = decoder_of(backbone)
        source = _warm_start_layer(backbone)
        layer_cls = type(decoder.layers[source])
        norm_cls = type(final_norm(decoder))
        config = copy.deepcopy(backbone.config.get_text_config())
        # NOTE: the head's layers are full-attention layers (no sliding window, no recurrence), in training and
        # in the engine alike; flash-attention kernels read the window from the config, so it is cleared too.
        if getattr(config, "layer_types", None):
            config.layer_types = [attention.FULL] * max(len(config.layer_types), num_layers)
        if not hasattr(config, "rms_norm_eps"):
            config.rms_norm_eps = config.layer_norm_epsilon  # NOTE: MtpLayer's norms read it (NemotronH names it so)
        if hasattr(config, "first_k_dense_replace"):
            config.first_k_dense_replace = 0  # NOTE: native MTP layers of DeepSeek-V3/GLM-4.5 are MoE layers
        family = detect_family(backbone.config) if family is None else family
        conventions = FAMILIES[family].conventions if family else MtpConventions()
        if getattr(config, "sliding_window", None) is not None:
            config.sliding_window = None
        # NOTE: block i gets layer_idx i: its index in the head's own KV cache, not the backbone's.
        self.layers = nn.ModuleList(
            [MtpLayer(config, layer_cls, norm_cls, i, use_post_norm=True) for i in range(num_layers)]
        )
        self.config = MtpConfig(
            num_layers=num_layers,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            backbone_type=getattr(config, "model_type", ""),
            decoder_layer=layer_cls.__name__,
            family=family,
            **asdict(conventions),
        )
        if warm_start:
            self._init_from_backbone(decoder.layers[source])
        param = next(backbone.parameters())
        rotary = getattr(decoder, "rotary_emb", None)
        # NOTE: decided once here, not per draft step (inspect is slow on the hot path).
        self._rotary_takes_layer_type = rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters
        if self._rotary_takes_layer_type and attention.FULL not in getattr(rotary, "layer_types", [attention.FULL]):
            # A backbone without full-attention layers (Gemma 3, every layer sliding) has no full-attention rotary:
            # the head's full-attention blocks take one built from the config's full-attention parameters.
            rotary = type(rotary)(config=config).to(param.device)
        # Shared, frozen modules held outside the module tree so they are neither saved nor trained here.
        self._shared = {
            "embed": backbone.get_input_embeddings(),
            "lm_head": backbone.get_output_embeddings(),
            "rotary": rotary,
        }
        self.to(device=param.device, dtype=param.dtype)

    @torch.no_grad()
    def _init_from_backbone(self, source_layer: nn.Module) -> None:
        """Starts each block from the backbone's last attention layer (a common MTP warm start)."""
        source = source_layer.state_dict()
        for layer in self.layers:
            try:
                layer.mtp_block.load_state_dict(source)
            except RuntimeError:
                raise BebopError(
                    f"cannot warm-start the MTP block from the backbone's last attention layer "
                    f"({type(source_layer).__name__}): its weights do not fit an MTP layer of this family; use a "
                    "native MTP head (--init native)"
                ) from None
            eye = torch.eye(self.config.hidden_size)
            layer.eh_proj.weight.copy_(torch.cat([eye, eye], dim=1) * 0.5)

    def forward_step(
        self,
        hidden: torch.Tensor,  # (B, S, D) previous hidden state: backbone h_t or the last step's output
        input_ids: torch.Tensor,  # (B, S) the next tokens x_{t+1}
        position_ids: torch.Tensor,  # (B, S)
        step: int = 0,
        attention_bias: torch.Tensor | ChainMask | None = None,  # (B, 1, S, L) additive; None = causal over S
        cache=None,  # a RaggedKVCache with num_layers entries, or None
    ) -> torch.Tensor:
        """One draft step; returns the state (B, S, D) that the next step receives (give it to ``logits``).

        A ``ChainMask`` (None is ``ChainMask()``, causal over S) runs the attention through
        ``bebop.mtp.chain_attention`` (memory linear in S); the engine passes its own masks.
        """
        layer = self.layers[step % len(self.layers)]
        embeds = self._shared["embed"](input_ids)
        if self.config.zero_first_embedding:
            embeds = embeds.masked_fill((position_ids == 0)[..., None], 0.0)
        attention_bias = ChainMask() if attention_bias is None else attention_bias
        pos_emb = self._rotary(embeds, position_ids)
        pair = [layer.enorm(embeds), layer.hnorm(hidden)]
        x = layer.eh_proj(torch.cat(pair[::-1] if self.config.hidden_first else pair, dim=-1))
        with chain_attention(self) if isinstance(attention_bias, ChainMask) else contextlib.nullcontext():
            x = layer.mtp_block(
                x, attention_mask=attention_bias, position_embeddings=pos_emb, position_ids=position_ids,
                **cache_kwargs(layer.mtp_block, cache),
            )
        return x if self.config.chain_prenorm else layer.post_norm(x)

    def _rotary(self, embeds: torch.Tensor, position_ids: torch.Tensor):
        """The backbone's rotary (cos, sin) at ``position_ids``, for a full-attention layer (Gemma 3's
        rotary takes the layer type: its sliding and full layers use different bases)."""
        rotary = self._shared["rotary"]
        if rotary is None:
            return None
        if self._rotary_takes_layer_type:
            return rotary(embeds, position_ids, layer_type="full_attention")
        return rotary(embeds, position_ids)

    def lm_head_input(self, state: torch.Tensor, step: int = 0) -> torch.Tensor:
        """The lm_head's input (..., D) for the state (..., D) that step ``step`` returned: the state after
        the shared output norm (``logits`` is the lm_head of it; the fused draft loss takes it)."""
        if self.config.chain_prenorm:
            state = self.layers[step % len(self.layers)].post_norm(state)
        return state

    def logits(self, state: torch.Tensor, step: int = 0) -> torch.Tensor:
        """Draft logits (..., V) from the state (..., D) that step ``step`` returned."""
        return self._shared["lm_head"](self.lm_head_input(state, step))

    def unroll(self, hidden: torch.Tensor, input_ids: torch.Tensor, k: int,
               lm_head_inputs: bool = False) -> list[torch.Tensor]:
        """Teacher-forced draft logits for every position and depth (training and exact evaluation).

        Depth j (1-based) at position t reads token x_{t+j} and predicts x_{t+j+1}, the token the
        backbone predicts at position t+j. Inputs past the end are padding; their outputs are
        garbage and must be masked by the caller. Depth j attends causally to its own keys
        (``bebop.mtp.chain_attention``: memory linear in T).

        Args:
            hidden: (B, T, D) backbone final hidden states.
            input_ids: (B, T) the sequence.
            k: depths to unroll (K).
            lm_head_inputs: return the lm_head's inputs (B, T, D) (``lm_head_input``) instead of logits.

        Returns:
            K tensors (B, T, V): draft logits of depth 1..K at each position t ((B, T, D) with lm_head_inputs).
        """
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        out, g = [], hidden
        for j in range(1, k + 1):
            tokens = torch.nn.functional.pad(input_ids[:, j:], (0, min(j, t)), value=0)  # x_{t+j}
            g = self.forward_step(g, tokens, positions + (j - 1), step=j - 1)
            out.append(self.lm_head_input(g, step=j - 1) if lm_head_inputs else self.logits(g, step=j - 1))
        return out

    def save_pretrained(self, directory: str | os.PathLike, extra: dict | None = None,
                        state: dict[str, torch.Tensor] | None = None) -> None:
        """Writes ``mtp_config.json`` and ``model.safetensors`` (the head's own weights) atomically.

        ``state`` replaces ``self.state_dict()``: training passes the float32 master weights of a
        bfloat16 head (``bebop.utils.optim.master_state_dict``), or the full weights of a head
        sharded over processes. Raises BebopError, writing nothing, when a weight holds NaN or inf.
        """
        state = {k: v.detach().contiguous().cpu() for k, v in (state or self.state_dict()).items()}
        check_finite_weights(state, f"MTP head for {directory}")  # NOTE: a NaN head is never written
        with atomic_dir(directory) as tmp:
            save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
            (tmp / CONFIG_NAME).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, backbone: nn.Module) -> MtpHead:
        """Loads a head saved by ``save_pretrained`` onto ``backbone``.

        Raises BebopError (one line) when files are missing or corrupt or when the head's shapes do
        not fit the backbone (the message names both shapes).
        """
        directory = Path(directory)
        cfg, state = read_head_files(directory)
        text_cfg = backbone.config.get_text_config()
        if (cfg.hidden_size, cfg.vocab_size) != (text_cfg.hidden_size, text_cfg.vocab_size):
            raise BebopError(
                f"MTP head in {directory} has hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size} but the "
                f"backbone has hidden_size={text_cfg.hidden_size}, vocab_size={text_cfg.vocab_size}"
            )
        if cfg.family and cfg.family not in FAMILIES:
            raise BebopError(f"MTP head in {directory} names an unknown family {cfg.family!r}")
        layer_name = type(decoder_of(backbone).layers[_warm_start_layer(backbone)]).__name__
        if cfg.decoder_layer and cfg.decoder_layer != layer_name:
            raise BebopError(
                f"MTP head in {directory} was built for {cfg.decoder_layer} blocks but the backbone's layers are "
                f"{layer_name}"
            )
        head = cls(backbone, num_layers=cfg.num_layers, family=cfg.family, warm_start=False)
        head.config = cfg
        expected = head.state_dict()
        for name, tensor in state.items():
            if name in expected and expected[name].shape != tensor.shape:
                raise BebopError(
                    f"MTP head weight {name} has shape {tuple(tensor.shape)} but the backbone needs "
                    f"{tuple(expected[name].shape)}"
                )
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise BebopError(f"MTP head in {directory} does not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
        head.load_state_dict(state)
        param = next(backbone.parameters())
        return head.to(device=param.device, dtype=param.dtype)


def _warm_start_layer(backbone: nn.Module) -> int:
    """Index of the backbone's last attention layer, the one the head's block is built from and starts as.

    Raises BebopError (one line) when the backbone has no attention layer: the head's block is one.
    Example: a 4-layer hybrid Qwen3.5 (three Gated DeltaNet layers, then full attention) -> 3.
    """
    config = backbone.config.get_text_config()
    kinds = attention.layer_kinds(config)
    found = [i for i, kind in enumerate(kinds) if kind in attention.ATTENTION]
    if not found:
        raise BebopError(f"{getattr(config, 'model_type', type(backbone).__name__)} has no attention layer; an MTP "
                         "head's block is an attention layer built from the backbone's")
    return found[-1]


def read_head_files(directory: Path) -> tuple[MtpConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of a saved head, read without a backbone; BebopError (one line) when missing or
    corrupt, or when a weight holds NaN or inf (every load and export of a head reads it here)."""
    cfg_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for path in (cfg_path, weights_path):
        if not path.is_file():
            raise BebopError(f"MTP head file not found: {path}")
    try:
        raw = json.loads(cfg_path.read_text())
        state = load_file(str(weights_path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt file
        raise BebopError(f"corrupt MTP head in {directory}: {str(e).splitlines()[0]}") from None
    check_finite_weights(state, f"MTP head in {directory}")
    return _checked_config(raw, state, cfg_path), state


def _checked_config(raw, state: dict[str, torch.Tensor], path: Path) -> MtpConfig:
    """The ``MtpConfig`` a received ``mtp_config.json`` holds, each field of its declared type and
    ``num_layers`` the layers the weights hold (a head is built before its weights load)."""
    if not isinstance(raw, dict):
        raise BebopError(f"corrupt MTP head config {path}: not a JSON object")
    defaults = MtpConfig()
    for name in MtpConfig.__dataclass_fields__:
        value, default = raw.get(name, getattr(defaults, name)), getattr(defaults, name)
        if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, type(default)):
            raise BebopError(f"corrupt MTP head config {path}: {name} should be {type(default).__name__}, "
                             f"got {str(value)[:40]!r}")
    num_layers = len({name.split(".")[1] for name in state if name.startswith("layers.")})
    if raw.get("num_layers", defaults.num_layers) != num_layers:
        raise BebopError(f"corrupt MTP head config {path}: num_layers is {raw.get('num_layers')} but the weights "
                         f"hold {num_layers} layer(s)")
    return MtpConfig(**{k: raw[k] for k in MtpConfig.__dataclass_fields__ if k in raw})


def check_finite_weights(state: dict[str, torch.Tensor], where: str) -> None:
    """Raises BebopError naming the first weight of ``state`` that holds NaN or inf.

    A head with one non-finite weight drafts NaN probabilities, and verification against NaN is no
    longer exact, so such a head is refused wherever one enters or leaves Bebop.
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise BebopError(f"{where}: weight {name} holds NaN or inf; the head cannot draft exactly")


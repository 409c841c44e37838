"""The MTP draft head: DeepSeek-V3 / Qwen3.5-style multi-token prediction on a frozen HF causal LM.

One step of the head at position t::

    g = layer(fc(cat[norm_e(emb(x_{t+1})), norm_h(h_t)]))      # h_t: the backbone's final hidden state
    logits = lm_head(g)                                       # g is already normed by the layer's post-norm

and step j+1 feeds step j's output g in place of h_t, with the next token's embedding. One physical
layer (by default) is applied recurrently for K steps (step j uses layer j % num_layers). The
embedding and lm_head are the backbone's own, shared and frozen; the block is the backbone's own
decoder-layer class. Each layer is transformers' ``MtpLayer`` (enorm, hnorm, eh_proj, mtp_block,
post_norm), so weights follow the DeepSeek naming.

Conventions match vLLM's ``qwen3_next_mtp`` so a head trained here behaves the same when exported:
1) h_t is the backbone's *final normed* hidden state (the tensor its lm_head reads);
2) the step that consumes (h_t, x_{t+1}) runs at rotary position t, and chained step j at t + j - 1;
3) the recurrent hidden state is the layer's normed output, which is also what lm_head reads;
4) unlike vLLM's ``deepseek_mtp``, the embedding at position 0 is not zeroed (the Qwen3-Next rule).
"""

from __future__ import annotations

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
from bebop.utils.io import BebopError, atomic_dir

CONFIG_NAME = "mtp_config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class MtpConfig:
    """What a saved head needs to be rebuilt on a backbone."""

    num_layers: int = 1  # physical MTP layers; draft step j uses layer j % num_layers
    hidden_size: int = 0  # D of the backbone it was built for
    vocab_size: int = 0  # V of the backbone it was built for
    backbone_type: str = ""  # e.g. "qwen3", informative
    decoder_layer: str = ""  # class name of the block, e.g. "Qwen3DecoderLayer"


def _decoder(backbone: nn.Module) -> nn.Module:
    decoder = backbone.get_decoder() if hasattr(backbone, "get_decoder") else backbone.model
    if not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise BebopError(f"{type(backbone).__name__} has no decoder with .layers and .norm; cannot attach an MTP head")
    return decoder


class MtpHead(nn.Module):
    """A recurrent MTP draft head attached to a frozen backbone.

    Only the MTP layers are parameters of this module (``state_dict`` holds nothing of the
    backbone); the embedding, lm_head and rotary embedding are read from the backbone.

    Args:
        backbone: an HF causal LM (``get_decoder()`` with ``.layers``, ``.norm``, ``.rotary_emb``).
        num_layers: physical MTP layers (1 in DeepSeek-V3/Qwen3.5).
    """

    def __init__(self, backbone: nn.Module, num_layers: int = 1):
        super().__init__()
        check_architecture(backbone)
        decoder = _decoder(backbone)
        layer_cls = type(decoder.layers[-1])
        norm_cls = type(decoder.norm)
        config = copy.deepcopy(backbone.config.get_text_config())
        # NOTE: the head's layers are full-attention layers (no sliding window), in training and in the
        # engine alike; flash-attention kernels read the window from the config, so it is cleared too.
        if getattr(config, "layer_types", None):
            config.layer_types = ["full_attention"] * max(len(config.layer_types), num_layers)
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
        )
        self._init_from_backbone(decoder)
        # Shared, frozen modules held outside the module tree so they are neither saved nor trained here.
        self._shared = {
            "embed": backbone.get_input_embeddings(),
            "lm_head": backbone.get_output_embeddings(),
            "rotary": getattr(decoder, "rotary_emb", None),
        }

    @torch.no_grad()
    def _init_from_backbone(self, decoder: nn.Module) -> None:
        """Starts each block from the backbone's last decoder layer (a common MTP warm start)."""
        for layer in self.layers:
            layer.mtp_block.load_state_dict(decoder.layers[-1].state_dict())
            eye = torch.eye(self.config.hidden_size)
            layer.eh_proj.weight.copy_(torch.cat([eye, eye], dim=1) * 0.5)

    def forward_step(
        self,
        hidden: torch.Tensor,  # (B, S, D) previous hidden state: backbone h_t or the last step's output
        input_ids: torch.Tensor,  # (B, S) the next tokens x_{t+1}
        position_ids: torch.Tensor,  # (B, S)
        step: int = 0,
        attention_bias: torch.Tensor | None = None,  # (B, 1, S, L) additive; None = causal over S
        cache=None,  # a RaggedKVCache with num_layers entries, or None
    ) -> torch.Tensor:
        """One draft step; returns the new hidden state (B, S, D) (normed: feed it to ``logits``)."""
        layer = self.layers[step % len(self.layers)]
        embeds = self._shared["embed"](input_ids)
        if attention_bias is None:
            attention_bias = causal_bias(input_ids.shape[1], embeds.dtype, embeds.device)
        pos_emb = self._rotary(embeds, position_ids)
        return layer(
            embeds, hidden, position_embeddings=pos_emb, attention_mask=attention_bias,
            position_ids=position_ids, cache=cache,
        )

    def _rotary(self, embeds: torch.Tensor, position_ids: torch.Tensor):
        """The backbone's rotary (cos, sin) at ``position_ids``, for a full-attention layer (Gemma 3's
        rotary takes the layer type: its sliding and full layers use different bases)."""
        rotary = self._shared["rotary"]
        if rotary is None:
            return None
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            return rotary(embeds, position_ids, layer_type="full_attention")
        return rotary(embeds, position_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., V) from a step's output hidden state (..., D)."""
        return self._shared["lm_head"](hidden)

    def unroll(self, hidden: torch.Tensor, input_ids: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
        """Teacher-forced draft logits for every position and depth (training and exact evaluation).

        Depth j (1-based) at position t reads token x_{t+j} and predicts x_{t+j+1}, the token the
        backbone predicts at position t+j. Inputs past the end are padding; their outputs are
        garbage and must be masked by the caller.

        Args:
            hidden: (B, T, D) backbone final hidden states.
            input_ids: (B, T) the sequence.
            num_steps: K, depths to unroll.

        Returns:
            K tensors (B, T, V): draft logits of depth 1..K at each position t.
        """
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        out, g = [], hidden
        for j in range(1, num_steps + 1):
            tokens = torch.nn.functional.pad(input_ids[:, j:], (0, min(j, t)), value=0)  # x_{t+j}
            g = self.forward_step(g, tokens, positions + (j - 1), step=j - 1)
            out.append(self.logits(g))
        return out

    def save_pretrained(self, directory: str | os.PathLike, extra: dict | None = None) -> None:
        """Writes ``mtp_config.json`` and ``model.safetensors`` (the head's own weights) atomically."""
        with atomic_dir(directory) as tmp:
            state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
            (tmp / CONFIG_NAME).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, backbone: nn.Module) -> MtpHead:
        """Loads a head saved by ``save_pretrained`` onto ``backbone``.

        Raises BebopError (one line) when files are missing or corrupt or when the head's shapes do
        not fit the backbone (the message names both shapes).
        """
        directory = Path(directory)
        cfg_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
        for path in (cfg_path, weights_path):
            if not path.is_file():
                raise BebopError(f"MTP head file not found: {path}")
        try:
            raw = json.loads(cfg_path.read_text())
            state = load_file(str(weights_path))
        except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt file
            raise BebopError(f"corrupt MTP head in {directory}: {str(e).splitlines()[0]}") from None
        fields = {k: raw[k] for k in MtpConfig.__dataclass_fields__ if k in raw}
        cfg = MtpConfig(**fields)
        text_cfg = backbone.config.get_text_config()
        if (cfg.hidden_size, cfg.vocab_size) != (text_cfg.hidden_size, text_cfg.vocab_size):
            raise BebopError(
                f"MTP head in {directory} has hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size} but the "
                f"backbone has hidden_size={text_cfg.hidden_size}, vocab_size={text_cfg.vocab_size}"
            )
        head = cls(backbone, num_layers=cfg.num_layers)
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


def causal_bias(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1, 1, S, S) additive causal mask that works for both eager and SDPA attention."""
    bias = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
    return bias[None, None]

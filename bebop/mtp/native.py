"""Native MTP layers in and out of HF checkpoints.

``import_mtp`` builds an ``MtpHead`` from the MTP layer a checkpoint ships (Qwen3.5, Qwen3-Next,
DeepSeek-V3, GLM-4.5, MiMo, Nemotron-H with a one-attention-block step), reading its tensors straight
from the safetensors shards:
transformers drops them when it loads the model. ``export_mtp`` writes a model directory that
vLLM and SGLang serve as is: the backbone's config with the family's MTP field, copies of its
weight files (copy-on-write where the file system shares blocks), its other regular files
(tokenizer, generation config; symbolic links and folders are skipped and named), and the head's
tensors under the family's names in a shard of their own, listed in the index. Export reads only
config.json and the head (every tensor's name and shape checked against a weightless, meta-device
copy of the backbone): it never loads the backbone's weights, so it works on checkpoints larger
than memory. Heads with NaN or inf weights are refused both ways.

Deviations from a plain copy of the checkpoint:
    1) a backbone shard that holds an old MTP layer is rewritten without it (a shard that holds
       nothing else is dropped), so the engine never sees two versions of one tensor;
    2) Qwen3.5 and Qwen3-Next keep one fc/norm set for the whole MTP stack, so only one-layer
       heads map onto them (the layer is applied recurrently, as vLLM does);
    3) Nemotron-H: vLLM serves one MTP step, so only one-layer heads map onto it, and the export
       declares the step as one attention block (``mtp_layers_block_type`` and
       ``mtp_hybrid_override_pattern``, ``bebop.mtp.families``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bebop.mtp.families import FAMILIES, Family, detect_family
from bebop.mtp.head import MtpConfig, MtpHead, check_finite_weights, read_head_files
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir, read_json, write_json
from bebop.utils.outputs import output_dir
from bebop.utils.progress import say

INDEX_NAME = "model.safetensors.index.json"  # HF's shard index
SINGLE_NAME = "model.safetensors"  # HF's single-file checkpoint
MTP_SHARD = "model-mtp.safetensors"  # the exported head's own shard
FORMATS = ("auto", *FAMILIES)  # choices of `bebop export-mtp --format`
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # files never copied as "other files"


def read_config(model_dir: str | os.PathLike) -> dict:
    """config.json of a model directory as a dict (one clear error line when missing or corrupt)."""
    config = read_json(Path(model_dir) / "config.json", what="model config")
    if not isinstance(config, dict):
        raise BebopError(f"model config {Path(model_dir) / 'config.json'} is not a JSON object")
    return config


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _num_hidden_layers(config: dict) -> int:
    """The backbone's decoder layers: ``num_hidden_layers``, or the length of the block list of a config
    that derives it (Nemotron-H's ``layers_block_type`` or ``hybrid_override_pattern``)."""
    text = _text_config(config)
    if isinstance(text.get("num_hidden_layers"), int):
        return text["num_hidden_layers"]
    blocks = text.get("layers_block_type") or text.get("layer_types") or text.get("hybrid_override_pattern") or ()
    return len(blocks)


def _declared_count(family: Family, config: dict) -> int:
    return int(_text_config(config).get(family.count_field) or config.get(family.count_field) or 0)


def native_layer_count(config: dict) -> int:
    """Number of native MTP layers the config declares that a head maps onto (0 when it declares none, or
    a Nemotron-H step of other blocks than the one a head maps onto: ``declared_step``)."""
    family = detect_family(config)
    if not family:
        return 0
    count = _declared_count(FAMILIES[family], config)
    mapped = not FAMILIES[family].mtp_step or declared_step(_text_config(config)) == FAMILIES[family].mtp_step
    return count if mapped else 0


STEP_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}  # Nemotron-H's
# mtp_hybrid_override_pattern characters -> its block types (mtp_layers_block_type)
DEFAULT_STEP = ("full_attention", "moe")  # transformers' NemotronHConfig default when the config lists none


def declared_step(text: dict) -> tuple[str, ...]:
    """The block types of the Nemotron-H MTP step a (text) config.json declares: ``mtp_layers_block_type``,
    else ``mtp_hybrid_override_pattern``, else transformers' default.

    Example: {"mtp_hybrid_override_pattern": "*E"} -> ("full_attention", "moe").
    """
    listed = text.get("mtp_layers_block_type")
    if isinstance(listed, list):
        return tuple(str(t) for t in listed)
    pattern = text.get("mtp_hybrid_override_pattern")
    if isinstance(pattern, str):
        return tuple(STEP_PATTERN.get(c, c) for c in pattern)
    return DEFAULT_STEP


def weight_map(model_dir: str | os.PathLike) -> dict[str, str]:
    """Tensor name -> file name of a checkpoint (sharded with an index, or one model.safetensors)."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BebopError(f"corrupt checkpoint index {index}: {e}") from None
        for file in sorted(set(mapping.values())):
            if not isinstance(file, str) or Path(file).name != file or file in (".", ".."):
                raise BebopError(f"checkpoint index {index} names {file!r}, which is not a file name in {model_dir}")
            if not (model_dir / file).is_file():
                raise BebopError(f"checkpoint index {index} names {file}, which does not exist")
        return dict(mapping)
    single = model_dir / SINGLE_NAME
    if not single.is_file():
        raise BebopError(f"model directory {model_dir} has neither {SINGLE_NAME} nor {INDEX_NAME}")
    with _open(single) as f:
        return {name: SINGLE_NAME for name in f.keys()}


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # noqa: BLE001 - any header failure is a corrupt file
        raise BebopError(f"corrupt safetensors file {path}: {str(e).splitlines()[0]}") from None


def _native_names(family: Family, num_hidden_layers: int, head_names: list[str]) -> dict[str, str]:
    """Family checkpoint name of every tensor of a head's state dict (``layers.{i}.…`` names)."""
    out = {}
    for name in head_names:
        _, i, rest = name.split(".", 2)
        out[name] = family.tensor_names(num_hidden_layers, int(i), [rest])[rest]
    return out


def _check_layer_count(family: Family, count: int, where: str) -> None:
    if family.shared_projection and count != 1:
        raise BebopError(
            f"{where}: {family.name} keeps one fc/norm set for its MTP stack, so only one MTP layer maps onto it "
            f"(got {count})"
        )
    if family.mtp_step and count != 1:
        raise BebopError(f"{where}: vLLM serves one {family.name} MTP layer, so only a one-layer head maps onto it "
                         f"(got {count})")


def native_layout(model_dir: str | os.PathLike, config: dict | None = None) -> tuple[Family, int]:
    """(family, number of MTP layers) of a checkpoint with a native MTP layer; one clear error line otherwise."""
    config = read_config(model_dir) if config is None else config
    family_name = detect_family(config)
    count = native_layer_count(config)
    family = FAMILIES.get(family_name)
    if family is not None and family.mtp_step and count < 1 and _declared_count(family, config) > 0:
        step = declared_step(_text_config(config))
        raise BebopError(
            f"model {model_dir} has a {family.name} MTP step of {len(step)} blocks ({', '.join(step)}), which a head "
            f"cannot import: a Bebop draft step is one attention block (a step of {', '.join(family.mtp_step)}); "
            "start a head from the backbone instead: bebop train-mtp --init backbone"
        )
    if not family_name or count < 1:
        field = FAMILIES[family_name].count_field if family_name else "mtp_num_hidden_layers/num_nextn_predict_layers"
        raise BebopError(
            f"model {model_dir} has no native MTP layer (its config sets no {field}); "
            "start a head from the backbone instead: bebop train-mtp --init backbone"
        )
    family = FAMILIES[family_name]
    _check_layer_count(family, count, f"model {model_dir}")
    return family, count


class NoNativeTensors(BebopError):
    """A config that declares MTP layers over a checkpoint holding none of their tensors."""


def import_mtp(model_dir: str | os.PathLike, backbone) -> MtpHead:
    """The MTP head a checkpoint ships, on ``backbone`` (the same checkpoint, loaded).

    Reads only the shards that hold MTP tensors. Raises BebopError (one line) when the model has
    no native MTP layer, when a tensor is missing, when a shape does not fit the backbone, or when
    a tensor holds NaN or inf.
    """
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    family, count = native_layout(model_dir, config)
    head = MtpHead(backbone, num_layers=count, family=family.name, warm_start=False)
    expected = head.state_dict()
    names = _native_names(family, _num_hidden_layers(config), list(expected))
    files = weight_map(model_dir)
    missing = [native for native in names.values() if native not in files]
    if len(missing) == len(names):
        raise NoNativeTensors(f"model {model_dir} declares {count} {family.name} MTP layer(s) but its checkpoint holds "
                              f"none of their tensors (no {missing[0]}; save_pretrained of a fresh config leaves "
                              "none): start the head from the backbone with --init backbone")
    if missing:
        raise BebopError(f"model {model_dir} declares {count} {family.name} MTP layer(s) but has no tensor {missing[0]}")
    state = {}
    for file in sorted({files[native] for native in names.values()}):  # only shards that hold MTP tensors
        with _open(model_dir / file) as f:
            held = set(f.keys())
            for ours, native in names.items():
                if files[native] == file:
                    if native not in held:
                        raise BebopError(f"checkpoint index {model_dir / INDEX_NAME} puts tensor {native} in {file}, "
                                         "which does not hold it")
                    state[ours] = f.get_tensor(native)
    for ours, tensor in state.items():
        if tensor.shape != expected[ours].shape:
            raise BebopError(
                f"MTP tensor {names[ours]} in {model_dir} has shape {tuple(tensor.shape)} but the backbone needs "
                f"{tuple(expected[ours].shape)}"
            )
    check_finite_weights({names[k]: v for k, v in state.items()}, f"MTP layer of {model_dir}")
    head.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return head.to(next(backbone.parameters()).device)


def _export_family(config: dict, head: MtpConfig, fmt: str, model_dir: Path) -> Family:
    """The family to write, after checking that the backbone and the head both fit it."""
    if fmt not in FORMATS:
        raise BebopError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    detected = detect_family(config)
    text = _text_config(config)
    if not detected:
        raise BebopError(
            f"model {model_dir} (model_type {text.get('model_type')!r}) is not of an MTP-capable family "
            f"({', '.join(FAMILIES)}): vLLM and SGLang have no MTP path for it"
        )
    if fmt != "auto" and fmt != detected:
        raise BebopError(f"--format {fmt} does not fit model {model_dir}, which is a {detected} model")
    family = FAMILIES[detected]
    if (head.hidden_size, head.vocab_size) != (text.get("hidden_size"), text.get("vocab_size")):
        raise BebopError(
            f"the head was trained for hidden_size={head.hidden_size}, vocab_size={head.vocab_size} but model "
            f"{model_dir} has hidden_size={text.get('hidden_size')}, vocab_size={text.get('vocab_size')}"
        )
    if head.backbone_type and head.backbone_type != text.get("model_type"):
        raise BebopError(f"the head was trained on a {head.backbone_type} model, not on {text.get('model_type')}")
    if head.conventions != family.conventions:
        raise BebopError(
            f"the head follows {head.conventions} but {family.name} serves {family.conventions}; "
            f"train it on the {family.name} backbone (heads take the backbone family's conventions)"
        )
    _check_layer_count(family, head.num_layers, "the head")
    return family


def _check_head_layout(model_dir: Path, config: dict, head: MtpConfig, state: dict, family: Family) -> None:
    """Every tensor of the head, by name and shape, is what the family's MTP layer on this backbone holds.

    The reference is an ``MtpHead`` built on a meta-device copy of the backbone (no weights read
    or allocated); a missing, unexpected or misshapen tensor is named by its checkpoint name.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise BebopError(f"cannot read the model config of {model_dir}: {str(e).splitlines()[0]}") from None
    with torch.device("meta"):
        backbone = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)
        expected = MtpHead(backbone, num_layers=head.num_layers, family=family.name, warm_start=False).state_dict()
    names = _native_names(family, _num_hidden_layers(config), list(expected))
    missing = sorted(set(expected) - set(state))
    if missing:
        raise BebopError(f"the head lacks {names[missing[0]]} ({missing[0]}), which a {family.name} MTP layer holds")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise BebopError(f"the head holds {unexpected[0]}, which a {family.name} MTP layer on {model_dir} has not")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise BebopError(f"the head's {names[name]} ({name}) has shape {tuple(tensor.shape)} but a {family.name} "
                             f"MTP layer on {model_dir} needs {tuple(expected[name].shape)}")


def export_mtp(
    model_dir: str | os.PathLike, head_dir: str | os.PathLike, out_dir: str | os.PathLike, fmt: str = "auto",
    overwrite: bool = False, tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """Writes ``out_dir``: the model at ``model_dir`` with the head at ``head_dir`` as its native MTP layer,
    and the tokenizer files of ``tokenizer_dir`` (when given) in place of the model directory's.

    Everything is checked before ``out_dir`` changes: the family, every head tensor's name and shape
    (``_check_head_layout``), finite weights, and ``out_dir`` itself (``bebop.utils.outputs.output_dir``:
    a non-empty one only with ``overwrite``, which moves it aside; never an input or inside one).
    Atomic: the directory appears complete or not at all. Returns ``out_dir``.
    """
    model_dir, head_dir, out_dir = Path(model_dir), Path(head_dir), Path(out_dir)
    what, inputs = "export directory", (model_dir, head_dir, *([Path(tokenizer_dir)] if tokenizer_dir else []))
    config = read_config(model_dir)
    head, state = read_head_files(head_dir)
    family = _export_family(config, head, fmt, model_dir)
    _check_head_layout(model_dir, config, head, state, family)
    files = weight_map(model_dir)
    text = _text_config(config)
    new_names = _native_names(family, _num_hidden_layers(config), list(state))
    old_mtp = {name for name in files if family.is_mtp_tensor(name, _num_hidden_layers(config))}
    with output_dir(out_dir, overwrite=overwrite, what=what, inputs=inputs, announce=say), atomic_dir(out_dir) as tmp:
        mapping = _write_backbone_shards(model_dir, tmp, files, old_mtp)
        save_file({new_names[k]: v.contiguous() for k, v in state.items()}, str(tmp / MTP_SHARD),
                  metadata={"format": "pt"})
        mapping.update({name: MTP_SHARD for name in new_names.values()})
        write_json(tmp / INDEX_NAME, {"metadata": {}, "weight_map": dict(sorted(mapping.items()))})
        _copy_other_files(model_dir, tmp)
        if tokenizer_dir is not None:
            _copy_other_files(Path(tokenizer_dir), tmp)
        target = config["text_config"] if "text_config" in config else config
        target[family.count_field] = head.num_layers
        if family.mtp_step:  # NOTE: both spellings: transformers reads the list, vLLM's own config the pattern
            target["mtp_layers_block_type"] = list(family.mtp_step)
            target["mtp_hybrid_override_pattern"] = "".join(
                next(c for c, t in STEP_PATTERN.items() if t == block) for block in family.mtp_step)
        write_json(tmp / "config.json", config)
        write_json(tmp / "bebop_export.json", {"format": family.name, "head": str(head_dir.resolve()),
                                               "model": str(model_dir.resolve())})
    return out_dir


def _write_backbone_shards(model_dir: Path, tmp: Path, files: dict[str, str], old_mtp: set[str]) -> dict[str, str]:
    """Copies every backbone shard into ``tmp``; rewrites only shards that hold old MTP tensors.

    NOTE: copies, never hard links: an in-place write to one file would change the other. A shard
    is read through a symbolic link (HF's cache keeps shards that way) only after its header opens
    as safetensors, so a link to some other file is never copied into the export.
    """
    mapping = {}
    for file in sorted(set(files.values())):
        names = [n for n, f in files.items() if f == file]
        keep = [n for n in names if n not in old_mtp]
        if len(keep) == len(names):
            with _open(model_dir / file):
                pass
            _copy_file(model_dir / file, tmp / file)
        elif keep:
            with _open(model_dir / file) as f:
                save_file({n: f.get_tensor(n) for n in keep}, str(tmp / file), metadata={"format": "pt"})
        mapping.update({n: file for n in keep})
    return mapping


def _copy_file(src: Path, dst: Path) -> None:
    """A real copy of ``src`` at ``dst``, made in the kernel (``copy_file_range``): XFS and btrfs share
    the blocks copy-on-write, so copying a large shard is cheap there and a write to one file still
    never reaches the other. Falls back to a plain copy where the call is missing or refused."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            while os.copy_file_range(fin.fileno(), fout.fileno(), 1 << 30):
                pass
            return
        except (AttributeError, OSError) as e:
            if isinstance(e, OSError) and e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise  # NOTE: e.g. ENOSPC, which the caller's atomic_dir names
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
        shutil.copyfileobj(fin, fout, 1 << 24)


def _copy_other_files(model_dir: Path, tmp: Path) -> None:
    """Tokenizer, generation config, chat template…: every regular file that is not a weight file.

    Symbolic links (which may point anywhere, e.g. outside the model) and folders are not copied;
    one line names them.
    """
    skipped = []
    for path in sorted(model_dir.iterdir()):
        if path.name in ("config.json", INDEX_NAME) or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        if path.is_symlink() or not path.is_file():
            kind = "a symbolic link" if path.is_symlink() else "a folder" if path.is_dir() else "not a regular file"
            skipped.append(f"{path.name} ({kind})")
            continue
        _copy_file(path, tmp / path.name)
    if skipped:
        say(f"export-mtp: copied regular files only; skipped {', '.join(skipped)} of {model_dir}")

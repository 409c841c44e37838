"""``load_pretrained``: an HF causal LM and its tokenizer from a local ``save_pretrained`` directory, frozen.

A received model directory is data, never code, and its config is checked against its weights
before anything is built:

1) nothing is downloaded (``local_files_only``) and no code of the directory runs
   (``trust_remote_code=False`` for the config, the model and the tokenizer: an ``auto_map`` is
   ignored for a family transformers knows, refused for one it does not; nothing is asked);
2) the config must load (a hybrid's ``layer_types`` with an unknown entry, or of another length than
   ``num_hidden_layers``, is one line) and be of a family Bebop runs (``bebop.architectures``);
3) its sizes are checked against the weights on disk (the safetensors headers, no tensor read) and
   the machine before the model is built: every layer the config declares has weights, the model
   the config describes holds no more parameters than the files, shapes that share a name agree,
   and the weights fit the device's free memory;
4) after loading, a missing, unexpected or misshapen tensor is an error naming it (transformers
   would initialise a missing one at random); the native MTP layers a config declares are the only
   tensors allowed beside the model's (``bebop.mtp.native`` reads them);
5) the tokenizer (the model directory's, or ``tokenizer``'s) must hold a vocabulary: transformers
   builds an empty one from the config alone for some families.

``bebop.models.load_model`` (a user's ``--model`` or the embedded default) and ``bebop.embedded``
(its own cache) both load through it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError

from bebop.architectures import check_model_type
from bebop.utils.errors import BebopError
from bebop.utils.memory import check_memory
from bebop.utils.torch_utils import resolve_device, resolve_dtype

UNPICKLABLE = ("not a file of tensors (corrupt, or a pickle of other objects, refused because loading it could run "
               "code)")  # NOTE: what torch's weights_only loader refuses; its own advice is to load it unsafely
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a decoder layer's index in a tensor name
MTP_COUNT_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # configs that declare native MTP layers
MTP_NAME = re.compile(r"(?:^|\.)mtp(?:_layers)?\.")  # native MTP tensors kept outside the decoder's layers
REASON_CHARS = 200  # a received config's error is cut to this many characters (one readable line)
NAMES_SHOWN = 3  # tensors named in a missing/unexpected error line
TOKENIZER_FIX = "give --tokenizer DIR (a directory with the model's tokenizer files, e.g. tokenizer.json)"


def load_pretrained(path: str | os.PathLike, device: str = "auto", dtype: str | torch.dtype = "auto",
                    fix: str = "", tokenizer: str | os.PathLike | None = None):
    """Loads the model and tokenizer saved in ``path``: frozen, in eval mode, on ``device``, weights in ``dtype``.

    Args:
        path: A ``save_pretrained`` directory (config.json, weights, tokenizer).
        device: ``resolve_device``'s names (auto = CUDA when present, else CPU).
        dtype: ``resolve_dtype``'s names (auto = bfloat16 on CUDA, float32 on CPU).
        fix: Appended to the error line when the files cannot be loaded (how to repair them).
        tokenizer: A directory to load the tokenizer from instead of ``path``.

    Returns:
        (model, tokenizer); the tokenizer's pad token is its EOS token when it has none.

    Raises:
        BebopError: one clear line when the directory or its files are missing, corrupt or do not
            agree with each other (the module's list), or the device or dtype is not available.
    """
    from transformers import AutoModelForCausalLM

    target = resolve_device(device)
    weights_dtype = resolve_dtype(dtype, target)
    path = Path(path)
    if not (path / "config.json").is_file():
        raise BebopError(f"model directory {path} has no config.json (expected a save_pretrained directory)")
    config = _load_config(path, fix)
    check_model_type(config)
    tok = load_tokenizer(tokenizer if tokenizer is not None else path)  # NOTE: before the (possibly large) model
    _check_sizes(path, config, target, weights_dtype)
    try:
        with _quiet_transformers():
            model, info = AutoModelForCausalLM.from_pretrained(
                path, config=config, local_files_only=True, trust_remote_code=False, dtype=weights_dtype,
                output_loading_info=True)
    except (OSError, ValueError, json.JSONDecodeError, SafetensorError, pickle.UnpicklingError, RuntimeError,
            RecursionError) as e:
        # NOTE: a corrupt pickled *.bin raises UnpicklingError (torch's weights_only loader) or RuntimeError (zip)
        weights = ", ".join(sorted(p.name for p in [*path.glob("*.safetensors"), *path.glob("*.bin")])) or \
            "no *.safetensors or *.bin"
        reason = UNPICKLABLE if isinstance(e, pickle.UnpicklingError) else (str(e) or type(e).__name__).splitlines()[0]
        raise BebopError((_file_at_fault(path) or f"cannot load model from {path} ({weights}): {reason}") + fix) from None
    _check_loading_info(path, config, info)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(target).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def load_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in ``directory`` (no code of the directory runs); BebopError (one line) when
    none loads or the one that loads holds no vocabulary but its special tokens.

    Example: a Qwen3 model directory without tokenizer files gives a one-token tokenizer, refused:
    "no usable tokenizer in DIR: it holds only the special token(s) <|endoftext|>; give --tokenizer DIR ...".
    """
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not directory.is_dir():
        raise BebopError(f"tokenizer directory {directory} is not a directory" if directory.exists() else
                         f"tokenizer directory not found: {directory}")
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - any failure to build a tokenizer from received files is a bad directory
        reason = (str(e) or type(e).__name__).strip().splitlines()[0]
        raise BebopError(f"no usable tokenizer in {directory}: {reason[:REASON_CHARS]}; {TOKENIZER_FIX}") from None
    vocab = set(tok.get_vocab())
    if vocab <= set(tok.all_special_tokens):
        shown = ", ".join(sorted(vocab)[:NAMES_SHOWN]) or "none"
        raise BebopError(f"no usable tokenizer in {directory}: it holds only the special token(s) {shown} "
                         f"(transformers built it from the config alone); {TOKENIZER_FIX}")
    return tok


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own warnings (its load report table, tokenizer notes) off while loading: Bebop
    names what is wrong in one line itself."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _load_config(path: Path, fix: str):
    """The model's config (no code runs); one line naming config.json when transformers refuses it."""
    from transformers import AutoConfig

    try:
        with _quiet_transformers():
            return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a received config fails with any exception (a validator's included)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        # NOTE: a config validator's error (huggingface_hub's StrictDataclassClassValidationError) puts the
        # reason on its last line, after one naming the validator.
        reason = lines[-1] if type(e).__module__.startswith("huggingface_hub") else lines[0]
        reason = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "..."
        at_fault = _file_at_fault(path)
        if at_fault is None and "auto_map" in _raw_config(path):
            reason = (f"model_type {_raw_config(path).get('model_type')!r} needs the directory's own code (auto_map), "
                      "and Bebop never runs a received model's code")
        raise BebopError((at_fault or f"model config {path / 'config.json'} cannot be used: {reason}") + fix) from None


def _raw_config(path: Path) -> dict:
    """config.json as a dict ({} when it is not one)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}


def _weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the headers of the directory's safetensors files (no tensor is read);
    empty when the weights are in other files (``*.bin``), whose names cannot be read cheaply."""
    from safetensors import safe_open

    shapes = {}
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
        except Exception:  # noqa: BLE001 - a corrupt file is named by the loader (_file_at_fault)
            return {}
    return shapes


def _check_sizes(path: Path, config, device: torch.device, weights_dtype: torch.dtype) -> None:
    """The config's sizes against the weights on disk and the device, before the model is built.

    A received config.json may declare 100000 layers (building them hangs) or widths the weights
    do not have (transformers allocates them, then prints a mismatch table); each is one line here.
    The model is sized on the meta device (nothing allocated) once its layer count is known to be real.
    """
    from transformers import AutoModelForCausalLM

    on_disk = _weight_shapes(path)
    where = path / "config.json"
    text = config.get_text_config()
    declared = getattr(text, "num_hidden_layers", None)
    held = {int(m.group(1)) for name in on_disk if (m := LAYER_INDEX.search(name)) and not MTP_NAME.search(name)}
    if held and isinstance(declared, int) and declared > len(held):
        raise BebopError(f"model config {where} declares num_hidden_layers={declared} but the weights hold "
                         f"{len(held)} layer(s); a layer without weights would be random")
    if not on_disk:
        return
    try:
        with torch.device("meta"), _quiet_transformers():
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - a family that cannot be built on the meta device is checked after loading
        return
    for name, param in skeleton.state_dict().items():
        if name in on_disk and tuple(param.shape) != on_disk[name]:
            raise BebopError(f"model config {where} gives {name} the shape {tuple(param.shape)} but the weights "
                             f"hold {on_disk[name]}")
    needed = sum(p.numel() for p in skeleton.parameters())
    stored = sum(math.prod(shape) for shape in on_disk.values())
    absent = [name for name, _ in skeleton.named_parameters() if name not in on_disk]
    if needed > stored and absent:
        _refuse_names(path, "lacks", absent)
    if needed > stored:
        raise BebopError(f"model config {where} describes {needed:,} parameters but the weights hold {stored:,} "
                         f"(hidden_size={getattr(text, 'hidden_size', '?')}, intermediate_size="
                         f"{getattr(text, 'intermediate_size', '?')}, vocab_size={getattr(text, 'vocab_size', '?')})")
    itemsize = torch.empty((), dtype=weights_dtype).element_size()
    check_memory(needed * itemsize, device, f"the {needed:,} parameters of {path}",
                 "use a device with more free memory or --dtype bfloat16")


def _check_loading_info(path: Path, config, info: dict) -> None:
    """A tensor the model needs and the files lack (transformers initialises it at random), one the
    files hold and the model has no place for, or one of another shape: one line naming them.
    Native MTP tensors a config declares are kept beside the model's (``bebop.mtp.native`` reads them)."""
    text = config.get_text_config()
    num_layers = getattr(text, "num_hidden_layers", 0) or 0
    declares_mtp = any(getattr(text, field, 0) for field in MTP_COUNT_FIELDS)

    def native_mtp(name: str) -> bool:
        index = LAYER_INDEX.search(name)
        beyond = index is not None and int(index.group(1)) >= num_layers  # DeepSeek-V3's model.layers.{N}
        return declares_mtp and (bool(MTP_NAME.search(name)) or beyond)

    for kind, names in (("lacks", info.get("missing_keys", ())), ("holds unexpected", info.get("unexpected_keys", ())),
                        ("holds misshapen", [str(m[0]) if isinstance(m, tuple) else str(m)
                                             for m in info.get("mismatched_keys", ())])):
        names = sorted(n for n in names if kind != "holds unexpected" or not native_mtp(n))
        if names:
            _refuse_names(path, kind, names)


def _refuse_names(path: Path, kind: str, names: list[str]) -> None:
    """Raises the one line that names the tensors a model directory lacks or holds besides its model's."""
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    raise BebopError(f"model {path} {kind} weights {', '.join(sorted(names)[:NAMES_SHOWN])}{more}: its config.json and "
                     "its weights do not describe the same model")


def _file_at_fault(path: Path) -> str | None:
    """The first file of a model directory that cannot be read, named with why: its JSON files (a
    sharded checkpoint's index, the config) and each safetensors file's header; None when each reads."""
    from safetensors import safe_open

    from bebop.utils.files import read_json

    for file in sorted(path.glob("*.json")):
        try:
            read_json(file, what="model file")
        except BebopError as e:
            return f"cannot load model from {path}: {e}"
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as e:  # noqa: BLE001 - any failure to read the header is a corrupt file
            return f"cannot load model from {path}: weights file {file.name} is corrupt: {str(e).splitlines()[0]}"
    return None

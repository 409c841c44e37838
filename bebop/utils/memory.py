"""Sizes against what the machine can hold: a size typed or received is checked before it is allocated.

A command that would allocate more than the device has free is refused in one line, before the
allocation, instead of hanging in swap or dying of memory exhaustion. The estimates are lower
bounds of what is allocated (the KV cache of a batch, the samples a check keeps), so a refused
size never fits; a size that passes may still not.
"""

from __future__ import annotations

import os

from bebop.utils.errors import BebopError

GIB = 2**30
PYTHON_INT_SLOT_BYTES = 8  # a reference in a list or tuple (small ints themselves are shared)
PYTHON_TUPLE_BYTES = 40  # a tuple's header
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")  # a config field that makes the MLP a mixture
FLOAT32_BYTES = 4  # logits and sampling probabilities are float32 whatever the weights' dtype


def available_memory(device) -> int:
    """Bytes that can still be allocated on ``device`` (a torch device or its name): the GPU's free
    memory, or the host's available memory (``MemAvailable``: free plus reclaimable caches)."""
    name = str(device)
    if name.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(name))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_memory(num_bytes: int, device, what: str, fix: str) -> None:
    """Raises BebopError (one line) when ``num_bytes`` exceed ``available_memory(device)``.

    Example: check_memory(10**15, "cpu", "group_size=1000000 rows", "lower --group-size") raises
    "group_size=1000000 rows need at least 931323 GiB of memory; cpu has 12.3 GiB free: lower --group-size".
    """
    free = available_memory(device)
    if num_bytes > free:
        raise BebopError(f"{what} need at least {num_bytes / GIB:.3g} GiB of memory; {device} has "
                         f"{free / GIB:.3g} GiB free: {fix}")


def kv_cache_bytes(model, rows: int, positions: int) -> int:
    """Bytes of the KV cache a batch of ``rows`` sequences of ``positions`` tokens needs (a lower bound:
    every attention layer keeps a key and a value of num_key_value_heads x head_dim per position).

    Example: 8 layers, 1 KV head of 32, float32: kv_cache_bytes(model, 1000, 100) = 204_800_000.
    """
    config = model.config.get_text_config()
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layer_types = getattr(config, "layer_types", None) or []
    num_attention = sum(t != "linear_attention" for t in layer_types) if layer_types else config.num_hidden_layers
    itemsize = next(model.parameters()).element_size()
    return rows * positions * num_attention * 2 * kv_heads * head_dim * itemsize


def forward_bytes(model, rows: int, positions: int) -> int:
    """Bytes one forward pass over ``rows`` sequences of ``positions`` tokens keeps alive at once (a lower
    bound): the residual stream and, in a dense model, the MLP's up projection at every position, in the
    weights' dtype, and the float32 logits of each row's last position. (A mixture of experts runs each
    expert over its own tokens, so only the residual stream is counted there.)

    Example: hidden 32, intermediate 64, vocabulary 16, float32: forward_bytes(model, 1000, 3) =
    1000 * (3 * (32 + 64) * 4 + 16 * 4) = 1_216_000.
    """
    config = model.config.get_text_config()
    moe = any(getattr(config, name, None) for name in MOE_FIELDS)
    width = config.hidden_size + (0 if moe else getattr(config, "intermediate_size", None) or 0)
    itemsize = next(model.parameters()).element_size()
    return rows * (positions * width * itemsize + config.vocab_size * FLOAT32_BYTES)


def samples_bytes(num_rows: int, num_tokens: int) -> int:
    """Bytes of ``num_rows`` rows kept as tuples of ``num_tokens`` token ids in a list (a lower bound)."""
    return num_rows * (PYTHON_INT_SLOT_BYTES + PYTHON_TUPLE_BYTES + PYTHON_INT_SLOT_BYTES * num_tokens)

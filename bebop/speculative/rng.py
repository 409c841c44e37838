"""Counter-based random numbers: a row's noise depends only on (seed, stream, counter).

Terms:
    seed     one int64 per row (a rollout sample), derived once from (run seed, RL step, row id)
             with `derive_seeds`.
    stream   a small int naming what the noise is for (accept coins, draft sampling, ...), so two
             uses at the same counter never share numbers.
    counter  one int64 per row that never repeats for a given (seed, stream), e.g. the row's decode
             position at the start of a verify step.
    element  the flat index into the requested `shape`.

Why: a `torch.Generator` hands out numbers in call order, so a row's tokens would depend on which
other rows share its batch (and on how the batch is split or padded). Here the numbers for row b are
a pure function of (seeds[b], stream, counters[b], element), so the same row gives the same tokens
in a batch of 1 or of 512, on CPU or CUDA.

Construction (splitmix64, Steele, Lea & Flood 2014, with its standard "Mix13" finaliser):
    key  = absorb(absorb(absorb(0, seed), stream), counter),  absorb(s, w) = mix64(s ^ mix64(w + GAMMA))
    bits = mix64(key + (element + 1) * GAMMA)
The second line is literally the splitmix64 sequence started at `key`; the first hashes the three
words into that starting state (for a fixed state, `absorb` is a bijection of the word, so distinct
words never collide; distinct triples collide only as 64-bit hashes do, odds 2^-64 per pair).

Torch has no uint64 arithmetic on every device, so everything is done in int64: multiplication and
addition wrap modulo 2^64 (two's complement, the same bits as uint64), and `>>` on a negative int64
is arithmetic, so `_shift_right_logical` masks off the copied sign bits.
"""

from __future__ import annotations

import math

import torch

_UINT64_MOD = 1 << 64


def _as_int64(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned `value`, e.g. 2**64 - 1 -> -1."""
    value %= _UINT64_MOD
    return value - _UINT64_MOD if value >= 1 << 63 else value


GOLDEN_GAMMA = _as_int64(0x9E3779B97F4A7C15)  # splitmix64 step, 2^64/phi: odd, so it cycles all 2^64 states
MIX_MULTIPLIER_1 = _as_int64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser constants (Stafford's Mix13),
MIX_MULTIPLIER_2 = _as_int64(0x94D049BB133111EB)  # chosen for full avalanche of every input bit
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # range a Python int must fit to become an int64 word
MANTISSA_BITS = {torch.float32: 23, torch.float64: 52}  # random bits per uniform: (2m+1)/2^(n+1) is exact


def _shift_right_logical(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Unsigned `x >> shift` on int64 bits; torch's `>>` copies the sign bit, so mask it away."""
    return (x >> shift).bitwise_and_((1 << (64 - shift)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser: a bijection of 64-bit words in which every input bit flips about half
    the output bits. `x` is int64 (any shape), the result has the same shape.

    Example: mix64(tensor([GOLDEN_GAMMA])) == tensor([_as_int64(0xE220A8397B1DCDAF)]), the first output
    of splitmix64 seeded with 0.
    """
    # In-place after the first op (which leaves the input untouched): these run on (B, V) tensors.
    x = x ^ _shift_right_logical(x, 30)
    x.mul_(MIX_MULTIPLIER_1)
    x.bitwise_xor_(_shift_right_logical(x, 27))
    x.mul_(MIX_MULTIPLIER_2)
    return x.bitwise_xor_(_shift_right_logical(x, 31))


def _absorb(state: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    """Hash one more int64 word into `state` (both (B,)); a bijection of `word` for a fixed state."""
    return mix64(state ^ mix64(word + GOLDEN_GAMMA))


def _word(value: int, like: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name}={value} does not fit in int64")
    return torch.full_like(like, value)


def _check_row_tensor(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int64 or x.dim() != 1:
        got = f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (B,) int64 tensor, got {got}")


def derive_seeds(
    seed: int,
    step: int,
    rows: torch.Tensor,  # (B,) int64, e.g. prompt_index * G + sample_index
) -> torch.Tensor:  # (B,) int64
    """Per-row seeds from (run seed, RL step, row id), so no seed ever comes from a global.

    Example: derive_seeds(0, 3, torch.arange(4)) gives four unrelated int64 seeds; the same call
    always gives the same four, and row 2's seed does not depend on the other rows.
    """
    _check_row_tensor(rows, "rows")
    state = torch.zeros_like(rows)
    state = _absorb(state, _word(seed, rows, "seed"))
    state = _absorb(state, _word(step, rows, "step"))
    return _absorb(state, rows)


def random_bits(
    seeds: torch.Tensor,  # (B,) int64
    stream: int,
    counters: torch.Tensor,  # (B,) int64
    shape: tuple[int, ...],
) -> torch.Tensor:  # (B, *shape) int64, every bit uniform
    """64 random bits per element, a pure function of (seeds[b], stream, counters[b], element)."""
    _check_row_tensor(seeds, "seeds")
    _check_row_tensor(counters, "counters")
    if seeds.shape != counters.shape or seeds.device != counters.device:
        raise ValueError(
            f"seeds {tuple(seeds.shape)} on {seeds.device} and counters {tuple(counters.shape)} on "
            f"{counters.device} must match"
        )
    shape = tuple(shape)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"shape must be a tuple of non-negative ints, got {shape}")
    key = _absorb(torch.zeros_like(seeds), seeds)
    key = _absorb(key, _word(stream, seeds, "stream"))
    key = _absorb(key, counters)  # (B,)
    num_elements = math.prod(shape)
    element = torch.arange(1, num_elements + 1, dtype=torch.int64, device=seeds.device)  # (N,)
    bits = mix64(key[:, None] + element.mul_(GOLDEN_GAMMA))  # (B, N): splitmix64 started at `key`
    return bits.view(seeds.shape[0], *shape)


def stream_keys(
    seeds: torch.Tensor,  # (B,) int64
    streams: list[int],
) -> torch.Tensor:  # (B, S) int64
    """The (seed, stream) part of `random_bits`' key, for S streams at once.

    A decode loop derives it once per call and reuses it every step: `keyed_bits(stream_keys(seeds,
    [s]), counters, shape)[:, 0]` equals `random_bits(seeds, s, counters, shape)` bit for bit.
    """
    _check_row_tensor(seeds, "seeds")
    for stream in streams:
        _word(stream, seeds[:0], "stream")  # type and int64-range check
    words = torch.tensor(streams, dtype=torch.int64, device=seeds.device)  # (S,)
    seed_key = _absorb(torch.zeros_like(seeds), seeds)  # (B,)
    return _absorb(seed_key[:, None], words[None, :])


def keyed_bits(
    keys: torch.Tensor,  # (B, S) int64 from stream_keys
    counters: torch.Tensor,  # (B,) int64
    shape: tuple[int, ...],
) -> torch.Tensor:  # (B, S, *shape) int64
    """`random_bits` for S streams in one pass, from precomputed stream keys."""
    bits = element_bits(counter_keys(keys, counters), 0, math.prod(shape))  # (B, S, N)
    return bits.view(*keys.shape, *shape)


def counter_keys(
    keys: torch.Tensor,  # (B, S) int64 from stream_keys
    counters: torch.Tensor,  # (B,) int64
) -> torch.Tensor:  # (B, S) int64
    """The full key of each (row, stream) at the rows' counters: where `element_bits` starts its sequence."""
    return _absorb(keys, counters[:, None])


def element_bits(
    key: torch.Tensor,  # (...) int64 from counter_keys
    start: int,
    stop: int,
) -> torch.Tensor:  # (..., stop - start) int64
    """Elements start .. stop - 1 of `keyed_bits`' flat element index, for each key: a slice of the
    elements can be drawn without the others (`keyed_bits` is elements 0 .. N - 1)."""
    element = torch.arange(start + 1, stop + 1, dtype=torch.int64, device=key.device)
    return mix64(key[..., None] + element.mul_(GOLDEN_GAMMA))


def uniform_from_bits(
    bits: torch.Tensor,  # (...) int64; only the low MANTISSA_BITS[dtype] bits are read
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (...) dtype, in the open interval (0, 1)
    """Map random bits to the midpoints (2m + 1) / 2^(n+1) of a 2^n grid, n = MANTISSA_BITS[dtype].

    Every value is exactly representable, symmetric about 1/2, and never 0 or 1 (min 2^-(n+1),
    max 1 - 2^-(n+1)). P(u < a) differs from a by at most 2^-(n+1): 6e-8 for float32, 1e-16 for
    float64. Example: bits 0 -> 2^-24 and bits 2^23 - 1 -> 1 - 2^-24 in float32.
    """
    if dtype not in MANTISSA_BITS:
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    num_bits = MANTISSA_BITS[dtype]
    grid_index = bits & ((1 << num_bits) - 1)
    return (2 * grid_index + 1).to(dtype) * 2.0 ** -(num_bits + 1)


def exponential_from_bits(
    bits: torch.Tensor,  # (...) int64; the low 52 bits are read
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (...) dtype, Exp(1), strictly positive and finite
    """-log(U) for U uniform on the float64 grid of `uniform_from_bits`, then cast to `dtype`.

    NOTE: U is drawn in float64 even for a float32 result. The exponential race argmax(w / E) is
    decided by the smallest E (U near 1); a float32 U would quantise those to multiples of 6e-8,
    a visible bias once V is large. In float64 the values lie in [1.1e-16, 36.8].
    """
    return (-torch.log(uniform_from_bits(bits, torch.float64))).to(dtype)


def uniform(
    seeds: torch.Tensor,  # (B,) int64
    stream: int,
    counters: torch.Tensor,  # (B,) int64
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (B, *shape) dtype in (0, 1)
    """Uniform numbers in the open interval (0, 1); see `uniform_from_bits` for the grid."""
    return uniform_from_bits(random_bits(seeds, stream, counters, shape), dtype)


def exponential(
    seeds: torch.Tensor,  # (B,) int64
    stream: int,
    counters: torch.Tensor,  # (B,) int64
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:  # (B, *shape) dtype, Exp(1)
    """Exp(1) numbers, -log(uniform); see `exponential_from_bits`."""
    return exponential_from_bits(random_bits(seeds, stream, counters, shape), dtype)

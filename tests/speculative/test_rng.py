"""Tests for bebop.speculative.rng: the counter-based generator behind batch-independent sampling.

Statistical checks use a fixed seed, so each outcome is deterministic; the stated false-alarm odds
(α = 1e-4 per check, 7 checks, so at most 7e-4 for the file by the union bound) are the chance that
a correct generator fails for a seed picked at random.
"""

import numpy as np
import pytest
import scipy.stats
import torch

from bebop.speculative import rng

ALPHA = 1e-4  # false-alarm odds per statistical check
NUM_SAMPLES = 100_000  # enough for 100-bin chi-square (1000 expected per bin), still milliseconds
MASK64 = (1 << 64) - 1


def _mix64_reference(x: int) -> int:
    """splitmix64's finaliser on Python ints, unsigned 64-bit: the textbook form."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _bits_reference(seed: int, stream: int, counter: int, element: int) -> int:
    """The construction of the rng docstring, written independently on unsigned Python ints."""
    gamma = 0x9E3779B97F4A7C15

    def absorb(state: int, word: int) -> int:
        return _mix64_reference(state ^ _mix64_reference(word + gamma))

    key = absorb(absorb(absorb(0, seed), stream), counter)
    return _mix64_reference(key + (element + 1) * gamma)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def _rows(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


def test_mix64_matches_unsigned_reference():
    values = [0, 1, -1, 2**63 - 1, -(2**63), rng.GOLDEN_GAMMA, 12345678901234567, -987654321]
    values += torch.randint(-(2**63), 2**63 - 1, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    got = rng.mix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [_signed(_mix64_reference(v)) for v in values]
    # First output of splitmix64 seeded with 0 (a published test vector).
    assert rng.mix64(torch.tensor([rng.GOLDEN_GAMMA])).item() == _signed(0xE220A8397B1DCDAF)


def test_random_bits_follow_documented_construction():
    seeds = torch.tensor([0, 7, -3], dtype=torch.int64)
    counters = torch.tensor([0, 5, 2**40], dtype=torch.int64)
    got = rng.random_bits(seeds, 9, counters, (2, 2))
    for b in range(3):
        for element in range(4):
            expected = _bits_reference(seeds[b].item(), 9, counters[b].item(), element)
            assert got[b].flatten()[element].item() == _signed(expected)


def test_deterministic_across_calls():
    seeds, counters = _rows(8, 100), _rows(8)
    a = rng.uniform(seeds, 3, counters, (4, 5))
    b = rng.uniform(seeds, 3, counters, (4, 5))
    assert a.shape == (8, 4, 5) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert torch.equal(rng.exponential(seeds, 3, counters, (7,)), rng.exponential(seeds, 3, counters, (7,)))


def test_row_independent_of_batch():
    seeds = torch.randint(-(2**62), 2**62, (64,), generator=torch.Generator().manual_seed(1))
    counters = torch.randint(0, 10_000, (64,), generator=torch.Generator().manual_seed(2))
    batch_u = rng.uniform(seeds, 1, counters, (3, 11), torch.float64)
    batch_e = rng.exponential(seeds, 2, counters, (13,))
    for b in (0, 17, 63):
        alone = slice(b, b + 1)
        alone_u = rng.uniform(seeds[alone], 1, counters[alone], (3, 11), torch.float64)
        assert torch.equal(alone_u, batch_u[alone])
        assert torch.equal(rng.exponential(seeds[alone], 2, counters[alone], (13,)), batch_e[alone])
    # Reordering the batch reorders the rows and changes nothing else.
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rng.uniform(seeds[perm], 1, counters[perm], (3, 11), torch.float64), batch_u[perm])


def test_distinct_seed_stream_counter_give_distinct_values():
    seeds, counters = _rows(1000), torch.zeros(1000, dtype=torch.int64)
    base = rng.random_bits(seeds, 0, counters, (8,))
    variants = [
        rng.random_bits(seeds, 1, counters, (8,)),
        rng.random_bits(seeds, 0, counters + 1, (8,)),
        rng.random_bits(seeds + 1000, 0, counters, (8,)),
    ]
    for other in variants:
        assert not (other == base).any()
    everything = torch.cat([base.flatten()] + [v.flatten() for v in variants])
    assert everything.unique().numel() == everything.numel()  # no 64-bit collision among 32k words


def test_derive_seeds():
    rows = _rows(16)
    seeds = rng.derive_seeds(0, 3, rows)
    assert seeds.dtype == torch.int64 and seeds.shape == (16,)
    assert torch.equal(seeds, rng.derive_seeds(0, 3, rows))
    assert torch.equal(rng.derive_seeds(0, 3, rows[5:6]), seeds[5:6])
    assert seeds.unique().numel() == 16
    assert not (rng.derive_seeds(0, 4, rows) == seeds).any()
    assert not (rng.derive_seeds(1, 3, rows) == seeds).any()


def test_open_interval_and_extreme_bits():
    extremes = torch.tensor([0, -1, 1, (1 << 23) - 1, (1 << 52) - 1, 2**63 - 1, -(2**63)], dtype=torch.int64)
    for dtype in (torch.float32, torch.float64):
        u = rng.uniform_from_bits(extremes, dtype)
        assert u.dtype == dtype and (u > 0).all() and (u < 1).all()
        e = rng.exponential_from_bits(extremes, dtype)
        assert torch.isfinite(e).all() and (e > 0).all()
    assert rng.uniform_from_bits(torch.tensor([0]), torch.float32).item() == 2.0**-24
    assert rng.uniform_from_bits(torch.tensor([-1]), torch.float32).item() == 1 - 2.0**-24
    assert rng.uniform_from_bits(torch.tensor([-1]), torch.float64).item() == 1 - 2.0**-53
    u = rng.uniform(_rows(NUM_SAMPLES), 0, torch.zeros(NUM_SAMPLES, dtype=torch.int64), (4,))
    assert (u > 0).all() and (u < 1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniformity_chi_square_and_ks(dtype):
    """Consecutive seeds at one counter: the most structured input the engine will give."""
    u = rng.uniform(_rows(NUM_SAMPLES), 0, torch.zeros(NUM_SAMPLES, dtype=torch.int64), (1,), dtype)
    u = u.flatten().double().numpy()
    counts = np.histogram(u, bins=100, range=(0, 1))[0]
    assert scipy.stats.chisquare(counts).pvalue > ALPHA
    assert scipy.stats.kstest(u, "uniform").pvalue > ALPHA


def test_pairs_independent():
    """2-D chi-square (10 x 10 bins) of values at consecutive counters and at consecutive elements."""
    seeds = rng.derive_seeds(0, 0, _rows(NUM_SAMPLES))
    counters = torch.zeros(NUM_SAMPLES, dtype=torch.int64)
    first = rng.uniform(seeds, 0, counters, (2,), torch.float64)
    next_counter = rng.uniform(seeds, 0, counters + 1, (1,), torch.float64)
    for a, b in ((first[:, 0], first[:, 1]), (first[:, 0], next_counter[:, 0])):
        cells = (a * 10).long() * 10 + (b * 10).long()
        counts = torch.bincount(cells, minlength=100).numpy()
        assert scipy.stats.chisquare(counts).pvalue > ALPHA


def test_exponential_distribution():
    e = rng.exponential(_rows(NUM_SAMPLES), 5, torch.zeros(NUM_SAMPLES, dtype=torch.int64), (1,))
    e = e.flatten().double().numpy()
    assert (e > 0).all() and np.isfinite(e).all()
    assert scipy.stats.kstest(e, "expon").pvalue > ALPHA


def test_input_validation():
    seeds, counters = _rows(4), _rows(4)
    with pytest.raises(ValueError, match="seeds"):
        rng.uniform(seeds.int(), 0, counters, (2,))
    with pytest.raises(ValueError, match="counters"):
        rng.uniform(seeds, 0, counters[:, None], (2,))
    with pytest.raises(ValueError, match="must match"):
        rng.uniform(seeds, 0, counters[:3], (2,))
    with pytest.raises(TypeError, match="stream"):
        rng.uniform(seeds, 1.5, counters, (2,))
    with pytest.raises(ValueError, match="stream"):
        rng.uniform(seeds, 2**64, counters, (2,))
    with pytest.raises(ValueError, match="shape"):
        rng.uniform(seeds, 0, counters, (-1,))
    with pytest.raises(ValueError, match="dtype"):
        rng.uniform(seeds, 0, counters, (2,), torch.float16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    seeds, counters = rng.derive_seeds(0, 1, _rows(256)), _rows(256)
    for dtype in (torch.float32, torch.float64):
        cpu = rng.uniform(seeds, 2, counters, (3, 50), dtype)
        gpu = rng.uniform(seeds.cuda(), 2, counters.cuda(), (3, 50), dtype)
        assert torch.equal(gpu.cpu(), cpu)
    assert torch.equal(rng.random_bits(seeds.cuda(), 7, counters.cuda(), (9,)).cpu(),
                       rng.random_bits(seeds, 7, counters, (9,)))
    assert torch.allclose(rng.exponential(seeds.cuda(), 3, counters.cuda(), (9,)).cpu(),
                          rng.exponential(seeds, 3, counters, (9,)), rtol=1e-6, atol=0)


def test_keyed_bits_equal_random_bits():
    """The engine's precomputed stream keys give exactly random_bits' numbers, every stream at once."""
    seeds = rng.derive_seeds(3, 1, torch.arange(6))
    counters = torch.tensor([0, 4, 9, 2, 7, 1])
    streams = [0, 1, 2, 5]
    bits = rng.keyed_bits(rng.stream_keys(seeds, streams), counters, (2, 7))
    assert bits.shape == (6, 4, 2, 7)
    for j, stream in enumerate(streams):
        assert torch.equal(bits[:, j], rng.random_bits(seeds, stream, counters, (2, 7)))

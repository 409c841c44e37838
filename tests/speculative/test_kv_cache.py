"""Tests for bebop.speculative.kv_cache: per-row lengths, the attention mask, and dropping finished rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bebop.speculative.kv_cache import RaggedKVCache, fill_order

HEADS, WIDTH, CAPACITY = 2, 3, 12


def _filled(batch: int, lengths: list[int], seed: int = 0) -> RaggedKVCache:
    """A cache of two layers whose rows hold ``lengths`` positions of random keys and values."""
    gen = torch.Generator().manual_seed(seed)
    cache = RaggedKVCache(2, batch, CAPACITY, torch.device("cpu"), torch.float32)
    width = max(lengths)
    cache.begin(width)
    for layer in range(2):
        cache.update(torch.randn(batch, HEADS, width, WIDTH, generator=gen),
                     torch.randn(batch, HEADS, width, WIDTH + 1, generator=gen), layer)  # values wider (MLA-like)
    cache.commit(lengths)
    return cache


def test_rows_keep_their_own_lengths_and_see_only_their_keys():
    cache = _filled(2, [2, 4])
    positions = cache.begin(2)
    assert positions.tolist() == [[2, 3], [4, 5]]
    visible = cache.attention_bias() == 0  # (B, 1, S, L)
    assert visible.shape == (2, 1, 2, 6)
    assert visible[0, 0].tolist() == [[True, True, True, False, False, False], [True, True, True, True, False, False]]
    assert visible[1, 0, 1].all() and not visible[1, 0, 0, 5]
    cache.commit([1, 2])
    assert cache.host_lengths == [3, 6] and cache.lengths.tolist() == [3, 6]
    cache.rollback(1)
    assert cache.host_lengths == [2, 5]


def test_a_full_cache_is_refused():
    cache = _filled(1, [CAPACITY - 1])
    with pytest.raises(ValueError, match="KV cache full"):
        cache.begin(2)


@pytest.mark.parametrize(("keep", "order"), [
    ([0, 2, 3, 5], [0, 5, 2, 3]),  # row 5 fills row 1's place
    ([1, 2, 3], [3, 1, 2]),
    ([0, 1, 2], [0, 1, 2]),  # the tail ended: nothing moves
    ([0, 4, 5, 6, 7], [0, 5, 6, 7, 4]),
    ([3], [3]),
])
def test_fill_order_by_hand(keep, order):
    assert fill_order(keep) == order


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_compacting_in_place_equals_copying_every_kept_row(data):
    """``fill_order``'s order copies only the rows that move (the rest is a view of the old buffers)
    and leaves the same cache as copying every kept row in that order; so does any other order."""
    batch = data.draw(st.integers(1, 7))
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=batch, max_size=batch))
    keep = sorted(data.draw(st.sets(st.integers(0, batch - 1), min_size=1)))
    filled = data.draw(st.booleans())
    order = fill_order(keep) if filled else data.draw(st.permutations(keep))
    assert sorted(order) == keep
    if filled:  # a kept row below the new batch size stays where it is
        assert all(order[p] == p for p in range(len(order)) if p in keep)
    cache, reference = _filled(batch, lengths, seed=1), _filled(batch, lengths, seed=1)
    before = cache.keys[0]
    cache.select_rows(order)
    expected = {name: [buf[order].clone() for buf in getattr(reference, name).values()] for name in ("keys", "values")}
    for name in ("keys", "values"):
        for got, want in zip(getattr(cache, name).values(), expected[name]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert cache.host_lengths == [lengths[r] for r in order] == cache.lengths.tolist()
    if filled:
        assert cache.keys[0].data_ptr() == before.data_ptr()  # compacted in place: a view, not a new buffer


def test_a_compacted_cache_goes_on_writing_and_masking_each_row():
    """After rows end, the rows left write their next positions at their own lengths and attend to exactly
    their own keys, as a cache that held only them from the start."""
    lengths = [2, 5, 3, 4]
    cache, alone = _filled(4, lengths, seed=2), _filled(4, lengths, seed=2)
    order = fill_order([0, 2, 3])  # row 1 ended: row 3 moves into its place
    cache.select_rows(order)
    alone.keys = {layer: buf[order] for layer, buf in alone.keys.items()}
    alone.values = {layer: buf[order] for layer, buf in alone.values.items()}
    alone.lengths, alone.host_lengths = alone.lengths[order], [lengths[r] for r in order]
    new_key, new_value = torch.randn(3, HEADS, 2, WIDTH), torch.randn(3, HEADS, 2, WIDTH + 1)
    for c in (cache, alone):
        c.begin(2)
    torch.testing.assert_close(cache.attention_bias(), alone.attention_bias(), rtol=0, atol=0)
    for got, want in zip(cache.update(new_key, new_value, 0), alone.update(new_key, new_value, 0)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

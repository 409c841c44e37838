"""Pytest fixtures for the whole suite: an isolated cache per test, one thread, and a module's filled cache.
The builders they and the tests use live in tests/helpers/."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import fill_tiny_cache


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own BEBOP_CACHE_DIR, so nothing reads or writes the user's cache."""
    monkeypatch.setenv("BEBOP_CACHE_DIR", str(tmp_path_factory.mktemp("bebop-cache")))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module: a barely-trained embedded model, so every no-argument command works."""
    mp = pytest.MonkeyPatch()
    yield fill_tiny_cache(tmp_path_factory.mktemp("cli-cache"), mp)
    mp.undo()


@pytest.fixture
def use_cache(cache, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE_DIR", str(cache))
    return cache

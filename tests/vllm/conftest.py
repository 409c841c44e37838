"""vLLM tests use the user's Bebop cache (the embedded model and head are expensive to rebuild per test)."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache():
    """Overrides the suite-wide isolated cache: these tests serve the user's cached embedded model."""
    yield

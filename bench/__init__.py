"""Benchmarks: scripts over the library, run from the repository root (``python -m bench.auto grid``,
``python bench/rollout.py``); ``bench.rollout`` and ``bench.harness`` are their shared helpers."""

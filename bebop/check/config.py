"""``LosslessOptions``: what ``bebop check-lossless`` takes, each setting with its help and check.

Nothing here imports torch: the CLI builds check-lossless's flags and --help from this module, and
``bebop.check.lossless`` checks its arguments with the same checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.config import BACKEND, SEED, integer_in, number_in, option
from bebop.speculative.settings import NUM_DRAFTS, VERIFY

DEFAULT_NUM_SAMPLES = 10_000  # rows per sample (plain and speculative each)
MIN_NUM_SAMPLES = 100  # fewer rows leave almost every cell below the chi-square test's expected count
DEFAULT_ALPHA = 3e-4  # false-alarm odds per check; with the retest, at most 0.05% per default run (verdict.py)
DEFAULT_TESTED_PROMPTS = 3  # prompts tested, each in its own checks (the others are mixed into batches)
NUM_SAMPLES_CHECK = integer_in(MIN_NUM_SAMPLES, note=" (a chi-square test needs counts)")
ALPHA_CHECK = number_in(0, 1, low_open=True, high_open=True)
TESTED_PROMPTS_CHECK = integer_in(1)


@dataclass(frozen=True)
class LosslessOptions:
    """Which prompts are tested, how hard, and which sampler is judged."""

    samples: int = option(DEFAULT_NUM_SAMPLES, "completions per configuration and tested prompt, each of up to "
                          "3K+3 tokens", check=NUM_SAMPLES_CHECK)
    prompts: str | None = option(None, "prompt file (JSONL/parquet with a 'prompt' field, or one prompt per line); "
                                 "default: five-term task prompts, whose continuations branch early",
                                 parse=str, role="input")
    tested_prompts: int = option(DEFAULT_TESTED_PROMPTS, "how many of the prompts (the first ones) are tested, each "
                                 "with every configuration; the others are mixed into batches",
                                 check=TESTED_PROMPTS_CHECK)
    alpha: float = option(DEFAULT_ALPHA, "false-alarm probability of each check", check=ALPHA_CHECK)
    seed: int = SEED.field()
    verify: str = VERIFY.field()
    num_drafts: int = NUM_DRAFTS.field()
    backend: str = BACKEND.field()

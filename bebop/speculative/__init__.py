"""Speculative decoding: verification (``rejection_sample``, ``block_verify``, ``greedy_verify``) and the batched engine.

Verification knows nothing about where drafts come from: it takes tensors and returns tokens and
counts. The engine (``generate``) drafts with an MTP head and verifies with the target.
"""

from bebop.speculative.completions import Completions
from bebop.speculative.engine import generate
from bebop.speculative.sampling import PAD_TOKEN_ID, logits_to_probs
from bebop.speculative.settings import MODES, SamplingParams, SpecConfig
from bebop.speculative.stats import SpecStats
from bebop.speculative.verification import block_verify, greedy_verify, rejection_sample

__all__ = [
    "MODES",
    "PAD_TOKEN_ID",
    "Completions",
    "SamplingParams",
    "SpecConfig",
    "SpecStats",
    "block_verify",
    "generate",
    "greedy_verify",
    "logits_to_probs",
    "rejection_sample",
]

"""``bebop check-lossless``, a wing above the rollout backends: does speculative sampling, with your model
and head, sample exactly as plain sampling? ``lossless`` (the chi-square harness), ``chi2`` (the
two-sample test), ``reference`` (plain sampling against the model's own forward pass), ``verdict``
(lossless, not lossless or inconclusive, and the report), ``config`` (the command's settings).
"""

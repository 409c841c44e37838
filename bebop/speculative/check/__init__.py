"""Exactness checks of the samplers: ``lossless`` (chi-square harness behind ``bebop check-lossless``),
``chi2`` (the two-sample test), ``reference`` (plain sampling against the model's own forward pass).
"""

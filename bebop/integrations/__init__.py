"""Bebop inside other trainers: ``bebop.integrations.trl`` (TRL's ``GRPOTrainer``, extra ``bebop[trl]``).

Each integration imports its trainer lazily, so ``import bebop`` never needs it.
"""

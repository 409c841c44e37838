"""Helpers shared by the tests, one module per job (pytest fixtures live in tests/conftest.py).

- ``models``: tiny offline models of each transformers architecture, the tiny tokenizer, random MTP sequences.
- ``cli``: what a command reads from disk (a model directory, a user's work directory, a filled cache), its error line.
- ``engine``: toy models, prompts and a spy for the speculative engine; plain sampling's exact joint and its fit.
- ``verification``: awkward (p, q) pairs, chains' exact joints and statistical tables for the verifiers.
- ``rl``: a tiny RL policy, config and reward.
- ``rollout_contract``: the checks every rollout backend must pass.
- ``native_checkpoints``: tiny native-MTP checkpoints of each family.
- ``analysis``: synthetic RL metrics, head evaluations and a temperature sweep.
- ``doc_blocks``: the documentation's fenced blocks and their shell commands.
"""

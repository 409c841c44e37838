"""Tasks: prompt generators and reward functions (``bebop.task.arith`` is the embedded one)."""

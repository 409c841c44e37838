"""Rollouts on engines other than Bebop's own: today, what serving a Bebop head on vLLM needs."""

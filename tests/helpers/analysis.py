"""Synthetic inputs shared by the analysis tests: RL metrics rows, head evaluations and a temperature sweep."""

from __future__ import annotations

import numpy as np

from bebop.analysis.fit import expected_accept_length

K = 3
NUM_STEPS = 40  # steps of a fake_metrics run
SWEEP_TEMPERATURES = (0.1, 0.3, 0.5, 0.7, 1.0, 1.3)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_metrics(mode, slope, intercept, step_s, seed):
    """Metrics rows with accept length = intercept + slope * H + noise (mode 'none' logs no spec keys)."""
    rng = np.random.default_rng(seed)
    entropy = np.linspace(0.25, 0.55, NUM_STEPS) + rng.normal(0, 0.01, NUM_STEPS)  # (S,)
    accept = intercept + slope * entropy + rng.normal(0, 0.02, NUM_STEPS)  # (S,)
    rows = []
    for s in range(NUM_STEPS):
        row = {
            "step": s, "mode": mode, "reward_mean": 0.5, "reward_std": 0.1, "accuracy": 0.3 + 0.01 * s,
            "target_entropy": float(entropy[s]), "rollout_s": 0.7 * step_s, "train_s": 0.25 * step_s,
            "mtp_s": 0.05 * step_s, "step_s": step_s, "num_tokens": 1000, "tokens_per_s": 1000 / step_s,
        }
        if mode != "none":
            alpha = float((accept[s] - 1) / K) ** (1 / 2)
            row.update({
                "spec/accept_length": float(accept[s]), "spec/accepted_per_pos": [alpha, alpha**2, alpha**3],
                "spec/alpha_rs": [alpha] * K, "spec/alpha_to": [alpha - 0.05] * K, "spec/num_drafts": 100,
                "spec/num_draft_tokens": 300, "spec/num_accepted_tokens": int(100 * (accept[s] - 1)),
            })
        rows.append(row)
    return rows


def fake_head_evals(rs_offsets=None, to_offsets=None, block_gains=None):
    """eval-mtp dicts per loss: alpha_RS = CE's + offset (points, per step); alpha_TO likewise; the block
    accept length = the RS one + block_gains[loss] (default 0.03 for every loss)."""
    rs_offsets = rs_offsets or {"ce": (0, 0, 0), "fkl": (0.1, 0.1, 0.1), "rkl": (1.3, 1.3, 1.3),
                                "tv": (2.4, 2.4, 2.4), "e2e_tv": (2.0, 3.5, 5.0)}
    to_offsets = to_offsets or {loss: (0.05 * i,) * K for i, loss in enumerate(rs_offsets)}
    ce_rs, ce_to = np.array([0.80, 0.70, 0.60]), np.array([0.70, 0.60, 0.50])
    out = {}
    for loss in rs_offsets:
        alpha_rs = (ce_rs + np.array(rs_offsets[loss]) / 100).tolist()
        alpha_to = (ce_to + np.array(to_offsets[loss]) / 100).tolist()
        out[loss] = {"alpha_rs": alpha_rs, "alpha_to": alpha_to, "accept_length_rs": expected_accept_length(alpha_rs),
                     "accept_length_to": expected_accept_length(alpha_to), "target_entropy": 0.4,
                     "num_positions": 500}
        out[loss]["accept_length_block"] = out[loss]["accept_length_rs"] + (block_gains or {}).get(loss, 0.03)
    return out


def fake_sweep(slopes=None):
    """Rows per (loss, tau): accept length = intercept + slope * H with H rising with tau."""
    slopes = slopes or {("ce", "to"): -1.2, ("ce", "rs"): -1.0, ("e2e_tv", "to"): -1.2, ("e2e_tv", "rs"): -0.01}
    rows = []
    for loss in ("ce", "e2e_tv"):
        for i, tau in enumerate(SWEEP_TEMPERATURES):
            h = 0.05 + 0.9 * tau
            wiggle = 0.002 * (-1) ** i  # keeps the residuals non-zero, so intervals have width
            row = {"loss": loss, "temperature": tau, "target_entropy": h, "alpha_rs": [0.8] * K, "alpha_to": [0.7] * K}
            for method in ("rs", "to"):
                row[f"accept_length_{method}"] = 3.7 + slopes[(loss, method)] * h + wiggle
            rows.append(row)
    return rows

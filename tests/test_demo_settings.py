"""The demo's RL settings: the key comparison runs with several seeds, each in its own run directory."""

from __future__ import annotations

import numpy as np

import bebop.demo as demo
import bebop.rl
from bebop.analysis.runs import Run
from bebop.demo import RL_RUNS, SEEDED_RUNS, DemoConfig


def _launched(tmp_path, monkeypatch, cfg: DemoConfig) -> list[tuple[str, int, float, str]]:
    """(label, seed, lr, run directory name) of every RL run the demo starts, without training anything."""
    seen = []
    monkeypatch.setattr(demo.models, "load_model", lambda path, **_: (None, None))
    monkeypatch.setattr(demo.MtpHead, "from_pretrained", lambda path, model: None)
    monkeypatch.setattr(bebop.rl, "train_rl", lambda model, tok, head, rl_cfg, run_dir, resume:
                        seen.append((rl_cfg.label, rl_cfg.seed, rl_cfg.policy.lr, run_dir.name)))
    for spec in RL_RUNS:
        for seed in demo._seeds(cfg, spec):
            demo._rl_run(cfg, tmp_path, tmp_path, {"ce": tmp_path, "e2e_tv": tmp_path}, spec, seed)
    return seen


def test_key_comparison_runs_with_three_seeds(tmp_path, monkeypatch):
    cfg = DemoConfig(out=str(tmp_path))
    seen = _launched(tmp_path, monkeypatch, cfg)
    assert cfg.seeds >= 3
    for name in SEEDED_RUNS:
        runs = [s for s in seen if s[0].split("-seed")[0] == name]
        assert sorted(seed for _, seed, _, _ in runs) == [0, 1, 2], name
        assert len({d for *_, d in runs}) == 3, name  # one directory per seed: no run overwrites another
    others = [s for s in seen if s[0].split("-seed")[0] not in SEEDED_RUNS]
    assert [seed for _, seed, _, _ in others] == [0] * (len(RL_RUNS) - len(SEEDED_RUNS))
    assert {lr for _, _, lr, _ in seen} == {cfg.lr}  # the demo's learning rate reaches every run


def test_report_states_the_seed_count():
    assert "3 seeds (0, 1, 2)" in demo._rl_settings(DemoConfig())
    assert "only 1 seed(s)" in demo._rl_settings(DemoConfig(seeds=1))


def _run(steps: int, entropy: tuple[float, float], accuracy: tuple[float, float], seed: int) -> Run:
    rng = np.random.default_rng(seed)
    h = np.linspace(*entropy, steps) + rng.normal(0, 0.02, steps)  # (S,)
    acc = np.clip(np.linspace(*accuracy, steps) + rng.normal(0, 0.03, steps), 0, 1)  # (S,)
    metrics = [{"step": s, "mode": "none", "target_entropy": float(h[s]), "accuracy": float(acc[s])} for s in range(steps)]
    return Run(label="none", config={"mode": "none"}, metrics=metrics, token_stats=None)


def test_report_says_whether_rl_moved_the_policy():
    moved = demo.rl_moved_policy([_run(120, (1.5, 0.7), (0.2, 0.4), seed=0)])  # windows of 20%: 1.42 -> 0.78
    assert moved.startswith("RL moved the policy") and "(-45%)" in moved
    too_little = demo.rl_moved_policy([_run(120, (1.4, 1.2), (0.2, 0.4), seed=1)])  # -14%: below the bar
    flat_accuracy = demo.rl_moved_policy([_run(120, (1.5, 0.7), (0.3, 0.3), seed=2)])  # accuracy CI spans 0
    assert too_little.startswith("RL did not move") and flat_accuracy.startswith("RL did not move")
    assert "not measured" in demo.rl_moved_policy([])

"""The demo's RL settings: the key comparison runs with several seeds, each in its own run directory."""

from __future__ import annotations

import bebop.demo as demo
import bebop.rl
from bebop.demo import RL_RUNS, SEEDED_RUNS, DemoConfig


def _launched(tmp_path, monkeypatch, cfg: DemoConfig) -> list[tuple[str, int, float, str]]:
    """(label, seed, lr, run directory name) of every RL run the demo starts, without training anything."""
    seen = []
    monkeypatch.setattr(demo.embedded, "load_model", lambda path, **_: (None, None))
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

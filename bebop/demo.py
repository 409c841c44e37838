"""``bebop demo``: the whole recipe on the embedded model, with the paper's analyses and a report.

Stages (each reuses what an earlier, possibly interrupted, run finished):
    1. the embedded model (cached; ``--quick`` pretrains a short one when none is cached);
    2. self-generated training and held-out data (T=1 samples of the model itself);
    3. heads trained with ce, fkl, rkl, tv and e2e_tv under the same budget, each fine-tuned from one
       shared CE-trained head (as in the paper, where every loss starts from the native MTP head);
    4. exact teacher-forced acceptance of each head at K=3 (RS and TO), and a temperature sweep;
    5. RL runs: none, to+ce, rs+ce, rs+e2e_tv (frozen), rs+e2e_tv with online CE, and with online TV updates;
       the key comparison (to+ce, rs+ce, rs+e2e_tv) runs with ``seeds`` RL seeds, pooled by the analyses;
    6. a markdown report that opens with the answer (RL step time with and without MTP, accept length against
       entropy), then one row per paper finding the runs answer, its verdict computed from the data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bebop import embedded, models
from bebop.config import BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS, DRAFT_LOSS_NAMES
from bebop.mtp.data import Sequences
from bebop.mtp.evaluate import acceptance_table, evaluate_mtp
from bebop.mtp.head import MtpHead
from bebop.utils.files import read_json, read_jsonl, write_json
from bebop.utils.progress import say, stage
from bebop.utils.torch_utils import resolve_dtype

LOSSES = DRAFT_LOSS_NAMES  # heads compared in the acceptance table: every draft loss
CE, TV = BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS
SWEEP_LOSSES = (CE, TV)  # heads in the temperature sweep
# (label, rollout mode, head loss, head update during RL, online loss)
RL_RUNS = (
    ("none", "none", TV, "frozen", TV),
    (f"to+{CE}", "to", CE, "frozen", TV),
    (f"rs+{CE}", "rs", CE, "frozen", TV),
    (f"rs+{TV}", "rs", TV, "frozen", TV),
    (f"rs+{TV}+online-{CE}", "rs", TV, "online", CE),
    (f"rs+{TV}+online-tv", "rs", TV, "online", "tv"),
)
SEEDED_RUNS = (f"to+{CE}", f"rs+{CE}", f"rs+{TV}")  # the key comparison (paper Figs. 1a/8), run with every seed


@dataclass(frozen=True)
class DemoConfig:
    """Budgets of the demo (the README gives the time the defaults take)."""

    out: str = "demo_out"  # output directory (report, plots, evaluations, RL runs)
    quick: bool = False  # smoke-test budgets, everything under ``out``
    head_steps: int = 0  # --quick only: warm-start and per-loss head steps (default: the embedded cache's budget)
    # RL that works: on the embedded model (a careful and a careless way to answer, bebop.task.arith) GRPO drops
    # the careless way, so the none run's entropy falls while accuracy rises. These budgets are sized so the
    # report's 20% windows clear MIN_ENTROPY_CHANGE (the runs behind them: docs/results.md).
    rl_steps: int = 150  # RL steps per run
    prompts_per_step: int = 8  # B of the RL runs
    group_size: int = 8  # G of the RL runs
    lr: float = 1.5e-4  # policy learning rate of the RL runs
    seeds: int = 3  # RL seeds of the key comparison (SEEDED_RUNS); the other runs use ``seed`` only
    temperatures: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 1.0, 1.3)  # sweep temperatures
    eval_sequences: int = 256  # held-out sequences for exact acceptance
    seed: int = 0  # first RL seed (the only one of the runs outside the key comparison)
    device: str = "auto"  # cpu, cuda or auto
    dtype: str = "auto"  # of the evaluations and RL runs; data and heads are built on the float32 weights


QUICK = DemoConfig(quick=True, head_steps=20, rl_steps=3, prompts_per_step=2, group_size=4, seeds=1,
                   temperatures=(0.5, 1.0), eval_sequences=48)
QUICK_PRETRAIN_STEPS = 150  # a short model for --quick when no embedded model is cached
QUICK_TRAIN_SEQUENCES = 128  # self-generated training sequences for --quick


def run_demo(cfg: DemoConfig) -> Path:
    """Runs every stage and returns the report's path. Each stage announces itself, says while it runs how
    long it has run and which part it is on (``bebop.utils.progress.stage``), and says when it is done."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with stage("demo: the embedded model"):
        model_dir = _model_dir(cfg, out)
        model, tok = models.load_model(model_dir, device=cfg.device, dtype=embedded.CACHE_DTYPE)
    with stage("demo: self-generated training and held-out data"):
        train_data, eval_data = _data(cfg, out, model, tok)
    with stage(f"demo: heads ({len(LOSSES)} draft losses)", total=len(LOSSES)) as advance:
        head_dirs = {}
        for loss in LOSSES:
            advance(f"{loss} head")
            head_dirs[loss] = _head(cfg, out, loss, model, tok, train_data)
    model.to(resolve_dtype(cfg.dtype, model.device))
    with stage(f"demo: exact acceptance of each head ({len(LOSSES)} evaluations)", total=len(LOSSES)) as advance:
        head_evals = _head_evals(cfg, out, model, tok, head_dirs, eval_data, advance)
    num_sweep = len(SWEEP_LOSSES) * len(cfg.temperatures)
    with stage(f"demo: temperature sweep ({num_sweep} evaluations)", total=num_sweep) as advance:
        sweep = _sweep(cfg, out, model, tok, head_dirs, eval_data, advance)
    runs = [(spec, seed) for spec in RL_RUNS for seed in _seeds(cfg, spec)]
    with stage(f"demo: RL runs ({len(runs)} of {cfg.rl_steps} steps)", total=len(runs)) as advance:
        run_dirs = []
        for spec, seed in runs:
            advance(spec[0] if seed == cfg.seed else f"{spec[0]} seed {seed}")
            run_dirs.append(_rl_run(cfg, out, model_dir, head_dirs, spec, seed))
    with stage("demo: report"):
        report = _report(cfg, out, model_dir, head_evals, sweep, run_dirs)
    say(f"demo: report at {report} ({time.time() - t0:.0f}s in all)")
    return report


def _model_dir(cfg: DemoConfig, out: Path) -> Path:
    cached = embedded.embedded_model_dir()
    if (cached / "config.json").is_file() or not cfg.quick:
        return embedded.ensure_embedded_model()
    quick_dir = out / "model"
    if not (quick_dir / "config.json").is_file():
        say(f"demo --quick: no cached embedded model; pretraining a short one ({QUICK_PRETRAIN_STEPS} steps)")
        embedded.pretrain(quick_dir, embedded.PretrainConfig(steps=QUICK_PRETRAIN_STEPS, eval_problems=32))
    return quick_dir


def _data(cfg: DemoConfig, out: Path, model, tok) -> tuple[Sequences, Sequences]:
    if not cfg.quick:
        return embedded.embedded_data("train", model, tok), embedded.embedded_data("eval", model, tok)
    return (embedded.embedded_data("train", model, tok, QUICK_TRAIN_SEQUENCES, out / "data-train.jsonl"),
            embedded.embedded_data("eval", model, tok, cfg.eval_sequences, out / "data-eval.jsonl"))


def _head(cfg: DemoConfig, out: Path, loss: str, model, tok, data: Sequences) -> Path:
    """The head trained with ``loss``: the shared cache at the default budget, ``out/heads`` for --quick."""
    if not cfg.quick:
        return embedded.ensure_embedded_head(loss, model, tok, data=data)
    return embedded.ensure_embedded_head(loss, model, tok, root=out / "heads", warmup_steps=cfg.head_steps,
                                         steps=cfg.head_steps, data=data)


def _head_evals(cfg, out: Path, model, tok, head_dirs: dict[str, Path], data: Sequences,
                advance: Callable[[str], None]) -> dict[str, dict]:
    """eval-mtp at K=3, T=1 for every head (cached as JSON); ``advance`` names each evaluation as it starts."""
    evals = {}
    for loss, path in head_dirs.items():
        advance(f"{loss} head")
        file = out / "evals" / f"{loss}.json"
        if not file.is_file():
            head = MtpHead.from_pretrained(path, model).eval()
            write_json(file, {**evaluate_mtp(model, head, data, speculate_k=3, pad_id=tok.pad_token_id), "loss": loss})
        evals[loss] = read_json(file)
    return evals


def _sweep(cfg: DemoConfig, out: Path, model, tok, head_dirs: dict[str, Path], data: Sequences,
           advance: Callable[[str], None]) -> list[dict]:
    """Exact acceptance across sampling temperatures (p and q both at temperature tau); ``advance`` names each
    evaluation as it starts."""
    file = out / "evals" / "temperature_sweep.json"
    if file.is_file():
        return read_json(file)
    rows = []
    for loss in SWEEP_LOSSES:
        head = MtpHead.from_pretrained(head_dirs[loss], model).eval()
        for tau in cfg.temperatures:
            advance(f"{loss} head at T={tau:g}")
            rows.append({**evaluate_mtp(model, head, data, speculate_k=3, temperature=tau, pad_id=tok.pad_token_id),
                         "loss": loss})
    write_json(file, rows)
    return rows


def _seeds(cfg: DemoConfig, spec: tuple) -> list[int]:
    """RL seeds of one entry of RL_RUNS: ``cfg.seeds`` of them for the key comparison, else one."""
    return [cfg.seed + i for i in range(cfg.seeds)] if spec[0] in SEEDED_RUNS else [cfg.seed]


def _rl_run(cfg: DemoConfig, out: Path, model_dir: Path, head_dirs: dict[str, Path], spec: tuple, seed: int) -> Path:
    """One RL run from the pretrained policy; skipped when complete, resumed when checkpointed."""
    from bebop.rl import resolve_rl_config, train_rl
    from bebop.utils.run_files import METRICS_FILE

    label, mode, loss, update, online_loss = spec
    label = label if seed == cfg.seed else f"{label}-seed{seed}"  # the first seed keeps the plain name
    run_dir = out / "runs" / label
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and len(read_jsonl(metrics, torn_tail_ok=True)) >= cfg.rl_steps:
        return run_dir
    rl_cfg = resolve_rl_config(None, {
        "mode": mode, "mtp_loss": loss, "mtp_update": update, "online_loss": online_loss, "label": label,
        "steps": cfg.rl_steps, "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
        "lr": cfg.lr, "seed": seed, "save_every": max(cfg.rl_steps // 3, 1),
    })
    model, tok = models.load_model(model_dir, device=cfg.device, dtype=cfg.dtype)
    head = MtpHead.from_pretrained(head_dirs[loss], model) if (mode != "none" or update == "online") else None
    train_rl(model, tok, head, rl_cfg, run_dir, resume=True)  # from the checkpoint, or from step 0 without one
    return run_dir


def _report(cfg: DemoConfig, out: Path, model_dir: Path, head_evals: dict, sweep: list, run_dirs: list[Path]) -> Path:
    from bebop.analysis.findings import compute_findings
    from bebop.analysis.report import write_report
    from bebop.analysis.runs import load_run

    runs = [load_run(d) for d in run_dirs]
    findings = compute_findings(head_evals, sweep, runs)
    pretrain = read_json(model_dir / "pretrain.json") if (model_dir / "pretrain.json").is_file() else {}
    sections = [
        "## Exact acceptance per head (K=3, T=1, teacher-forced held-out data)\n\n" + acceptance_table(head_evals),
        "## The embedded model\n\n" + _model_summary(pretrain, model_dir),
        "## RL settings\n\n" + _rl_settings(cfg) + "\n\n" + rl_moved_policy(runs),
    ]
    write_json(out / "findings.json", [f.__dict__ if hasattr(f, "__dict__") else f for f in findings])
    evals = list(head_evals.values()) + [r for r in sweep if r["temperature"] != 1.0]  # T=1 rows are head_evals
    return write_report(run_dirs, out, title="Bebop demo" + (" (--quick)" if cfg.quick else ""),
                        extra_sections=sections, head_evals=evals, findings=findings)


def _model_summary(pretrain: dict, model_dir: Path) -> str:
    if not pretrain:
        return f"Model at `{model_dir}` (no pretrain summary found)."
    return (f"Model at `{model_dir}`: accuracy at T=1 {pretrain.get('accuracy', float('nan')):.1%}, careless answers "
            f"(`arith.make_guess`) {pretrain.get('guess_rate', float('nan')):.1%}, mean completion "
            f"entropy {pretrain.get('target_entropy', float('nan')):.3f} nats, pretraining "
            f"{pretrain.get('seconds', float('nan')):.0f} s.")


def _rl_settings(cfg: DemoConfig) -> str:
    seeds = (f"{cfg.seeds} seeds ({', '.join(str(cfg.seed + i) for i in range(cfg.seeds))}), pooled by the findings"
             if cfg.seeds >= 3 else f"only {cfg.seeds} seed(s), to fit the time budget: too few for a seed-level spread")
    return (f"Every run: {cfg.rl_steps} GRPO steps of {cfg.prompts_per_step} prompts x {cfg.group_size} samples, "
            f"policy learning rate {cfg.lr:g}, rollout temperature 1. The key comparison "
            f"({', '.join(SEEDED_RUNS)}) ran with {seeds}; the other runs with seed {cfg.seed}.")


MIN_ENTROPY_CHANGE = 0.4  # the demo's bar: the none run's entropy moves by >= 40% of its start


def rl_moved_policy(runs: list) -> str:
    """Whether RL moved the policy enough to test the entropy findings: the none run's entropy change is at least
    MIN_ENTROPY_CHANGE of its start and its accuracy interval excludes 0 (both block-bootstrap intervals)."""
    from bebop.analysis.summary import summarize_run
    from bebop.analysis.roles import none_runs

    base = none_runs(runs)
    if not base:
        return "No `none` run, so whether RL moved the policy is not measured."
    s = summarize_run(base[0])
    entropy, accuracy = s["entropy_change"], s["accuracy_change"]
    relative = entropy.estimate / s["entropy_start"] if s["entropy_start"] > 0 else float("nan")
    moved = abs(relative) >= MIN_ENTROPY_CHANGE and not accuracy.ci[0] <= 0.0 <= accuracy.ci[1]
    return (f"RL {'moved' if moved else 'did not move'} the policy enough to test the entropy findings (bar: the "
            f"`none` run's entropy changes by at least {MIN_ENTROPY_CHANGE:.0%} of its start and its accuracy interval "
            f"excludes 0): entropy {s['entropy_start']:.3f} → {s['entropy_end']:.3f} nats ({relative:+.0%}), accuracy "
            f"{s['accuracy_start']:.3f} → {s['final_accuracy']:.3f} (Δ {accuracy.estimate:+.3f}, 95% CI "
            f"[{accuracy.ci[0]:+.3f}, {accuracy.ci[1]:+.3f}]).")


def quick_or_default(quick: bool, out: str | None, device: str = "auto", dtype: str = "auto") -> DemoConfig:
    base = replace(QUICK if quick else DemoConfig(), device=device, dtype=dtype)
    return replace(base, out=out) if out else base

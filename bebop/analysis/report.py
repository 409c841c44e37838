"""Summarises RL runs and writes a markdown report with plots.

Run directories (written by ``bebop rl``, loaded by ``bebop.analysis.runs``) hold ``config.json``,
``metrics.jsonl`` and optionally ``token_stats.jsonl``. ``write_report`` turns any number of them,
plus optional MTP-head evaluations (``bebop eval-mtp --json`` dicts with ``loss`` and
``temperature`` added), into ``report.md`` beside the PNGs it links.

The report leads with the user's answer (``answer``): RL step time with and without MTP, their
ratio with its interval, the rollout's share of the step, and accept length against entropy in one
figure. The paper's findings follow, only those the runs can answer (``findings``); details after.

Conventions (besides those of ``summary``: start/end windows, NaN for missing metrics, warm-up
steps left out of step times):

1. The speed-up of a run is (mean step time of its baseline, the first ``none`` run as synchronous or
   asynchronous as it, else the first other ``none`` run) / (its mean step time).
2. Slope intervals come from ``bootstrap``: a block bootstrap over RL steps, and at token level a
   bootstrap over completions (token statistics' ``row``), never over single tokens.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bebop.analysis import bootstrap, plots
from bebop.analysis.bootstrap import Interval
from bebop.analysis.answer import answer_section
from bebop.analysis.findings import compute_findings, findings_section
from bebop.analysis.markdown import MISSING, markdown_table
from bebop.analysis.roles import baseline_runs, is_async, none_runs
from bebop.analysis.runs import TOKEN_STATS_FILE, Run, as_float, load_run, metric_column
from bebop.analysis.slopes import MIN_ENTROPY_RANGE, MIN_POINTS
from bebop.analysis.summary import WINDOW_FRAC, describe_speedup, per_position, step_speedup, summarize_run
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_write_text

REPORT_FILE = "report.md"


# --------------------------------------------------------------------------------------------
# Markdown helpers
# --------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f") -> str:
    """Formats a number, or MISSING for None/NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return format(value, spec)


def _fmt_list(values: Sequence[float], spec: str = ".3f") -> str:
    return " / ".join(_fmt(v, spec) for v in values) if len(values) else MISSING


def _fmt_slope(slope: Interval, r: float | None = None) -> str:
    """A slope with its interval (when there is one) and, optionally, r."""
    if not math.isfinite(slope.estimate):
        return MISSING
    low, high = slope.ci
    ci = f" [{low:+.2f}, {high:+.2f}]" if math.isfinite(low) else ""
    return f"{slope.estimate:+.2f}{ci}" + (f" (r = {_fmt(r)})" if r is not None else "")


def _fmt_change(start: float, end: float, change: bootstrap.Interval) -> str:
    """Start → end (change [95% interval], relative change)."""
    if not (math.isfinite(start) and math.isfinite(end)):
        return MISSING
    low, high = change.ci
    ci = f" [{low:+.3f}, {high:+.3f}]" if math.isfinite(low) else ""
    relative = f", {change.estimate / start:+.0%}" if start > 0 else ""
    return f"{start:.3f} → {end:.3f} ({change.estimate:+.3f}{ci}{relative})"


def _unique_labels(runs: Sequence[Run]) -> list[str]:
    """Run labels, with the directory name appended where two runs share a label."""
    labels = [r.label for r in runs]
    return [
        f"{r.label} ({r.path.name if r.path else i})" if labels.count(r.label) > 1 else r.label
        for i, r in enumerate(runs)
    ]


# --------------------------------------------------------------------------------------------
# Report sections
# --------------------------------------------------------------------------------------------


def _run_row(run: Run, s: dict, base: Run | None) -> list[str]:
    """One row of the runs table; ``base`` is its baseline ``none`` run (``_baseline``), if any."""
    speculative = s["mode"] != "none"
    speedup = MISSING if base is None else "1.00× (the baseline)" if run is base else (
        describe_speedup(step_speedup([base], [run])[0]))
    update = s["mtp_update"] or MISSING
    if s["mtp_update"] == "online" and s["online_loss"]:
        update = f"online ({s['online_loss']})"
    return [
        s["label"],
        s["mode"] + (" (async)" if is_async(run) else ""),
        (s["mtp_loss"] or MISSING) if speculative else MISSING,
        update if speculative else MISSING,
        _fmt(s["step_s"]),
        speedup,
        _fmt(s["rollout_s"]),
        _fmt_change(s["entropy_start"], s["entropy_end"], s["entropy_change"]),
        _fmt_change(s["accuracy_start"], s["final_accuracy"], s["accuracy_change"]),
        f"{_fmt(s['accept_length_start'])} → {_fmt(s['accept_length_end'])}",
        _fmt_slope(s["entropy_slope"], s["entropy_r"]),
    ]


RUNS_HEADER = ("run", "mode", "head loss", "update", "step (s)", "speed-up vs none [95% CI]", "rollout (s)",
               "entropy start → end, nats (Δ [95% CI], relative)", "accuracy start → end (Δ [95% CI], relative)",
               "accept length start → end", "accept-length slope vs entropy (/nat) [95% CI]")


def _runs_section(runs: Sequence[Run], summaries: Sequence[dict]) -> str:
    notes = (
        f"Start and end are means over the first and last {WINDOW_FRAC:.0%} of the steps; intervals are 95%, "
        "block bootstrap over RL steps. Entropy is the mean H(p) per completion token. Accept length is tokens per "
        "verify pass including the bonus token. Speed-up is the mean step time of the first `none` run with "
        "rollouts as synchronous or asynchronous as the run's (else of the first other `none` run) over the run's "
        f"(first step of each run left out). A slope needs {MIN_POINTS} or more steps whose entropies span "
        f"{MIN_ENTROPY_RANGE} nats or more."
    )
    if not none_runs(runs):
        notes += " No `none` run was given, so speed-ups are not computed."
    rows = [_run_row(r, s, next(iter(baseline_runs(runs, [r])), None)) for r, s in zip(runs, summaries)]
    return "## Runs\n\n" + markdown_table(RUNS_HEADER, rows) + "\n\n" + notes


def _mismatch_row(s: dict) -> list[str]:
    parts = ("delta_accept_end", "entropy_part_end", "mismatch_part_end")
    return [s["label"], _fmt(s["early_slope"], "+.2f"), *(_fmt(s[k], "+.3f") for k in parts)]


def _mismatch_section(summaries: Sequence[dict]) -> str:
    rows = [_mismatch_row(s) for s in summaries if math.isfinite(s["delta_accept_end"])]
    text = "## Entropy vs mismatch (Eq. 16)\n\n"
    if not rows:
        return text + "_Skipped: no run has speculative metrics (`spec/accept_length`) on 3 or more steps._"
    header = ["run", "early slope b (/nat)", "Δ accept length (end)", "entropy part b·(H−H₀)", "mismatch part"]
    return text + (
        "Change in accept length from the first step to the last steps, split into what the early-phase "
        "entropy slope b predicts and the rest (draft–policy mismatch). The paper finds the mismatch part "
        "near zero under RS, so a frozen head suffices.\n\n" + markdown_table(header, rows)
    )


def _token_row(label: str, t: dict) -> list[str]:
    shares = (t["share_rs_wins"], t["share_to_wins"], t["share_tie"])
    return [label, str(t["num_positions"]), _fmt_slope(t["alpha_rs_slope"]), _fmt_slope(t["alpha_to_slope"]),
            *(_fmt(v, ".1%") for v in shares)]


def _token_section(summaries: Sequence[dict]) -> str:
    rows = [_token_row(s["label"], s["token"]) for s in summaries if s["token"] is not None]
    text = "## Token level: RS vs TO (App. E)\n\n"
    if not rows:
        return text + f"_Skipped: no run has `{TOKEN_STATS_FILE}`._"
    header = ["run", "positions", "α_RS slope vs H (/nat)", "α_TO slope vs H (/nat)", "RS wins", "TO wins", "ties"]
    return text + "RS wins where TV(p, q) < 1 − p(argmax q), i.e. α_RS > α_TO.\n\n" + markdown_table(header, rows)


def _plot_block(out_dir: Path, name: str, heading: str, data: Mapping, skip_reason: str, draw: Any) -> str:
    """Draws one plot into out_dir with ``draw(data, path)``, or says why it was skipped."""
    if not data:
        return f"### {heading}\n\n_Skipped: {skip_reason}._"
    draw(data, out_dir / name)
    return f"### {heading}\n\n![{heading}]({name})"


def _run_plots(out_dir: Path, runs: Sequence[Run], labels: Sequence[str], summaries: Sequence[dict]) -> list[str]:
    """The plots drawn from the runs' metrics besides the answer's: per-position acceptance, step time by part."""
    position_data, latency = {}, {}
    for run, label, s in zip(runs, labels, summaries):
        per_pos = per_position(run.metrics, "spec/accepted_per_pos")  # (S, K)
        if np.isfinite(per_pos).any():
            position_data[label] = (metric_column(run.metrics, "step"), per_pos)
        if math.isfinite(s["rollout_s"]) or math.isfinite(s["step_s"]):
            latency[label] = (s["rollout_s"], s["train_s"], s["mtp_s"], s["step_s"])
    no_spec = "no run has speculative metrics (every run is mode `none` or logged no `spec/*` keys)"
    return [
        _plot_block(out_dir, "accept_per_position.png", "Per-position acceptance over RL (Figs. 2, 6)",
                    position_data, no_spec, plots.plot_accept_per_position),
        _plot_block(out_dir, "step_latency.png", "Mean time per RL step, by part (Fig. 7)",
                    latency, "no run logged `step_s` or `rollout_s`", plots.plot_step_latency),
    ]


def _common_temperature(head_evals: Sequence[Mapping]) -> float | None:
    """The temperature evaluated for the most losses (ties: closest to 1.0), or None."""
    losses_at: dict[float, set] = {}
    for e in head_evals:
        losses_at.setdefault(as_float(e.get("temperature")), set()).add(e.get("loss"))
    candidates = [t for t in losses_at if math.isfinite(t)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (len(losses_at[t]), -abs(t - 1.0)))


def _head_eval_row(e: Mapping) -> list[str]:
    scalars = ("temperature", "accept_length_rs", "accept_length_to")
    return [
        str(e.get("loss")),
        *(_fmt(as_float(e.get(k))) for k in scalars),
        _fmt_list(e.get("alpha_rs") or []),
        _fmt_list(e.get("alpha_to") or []),
        _fmt(as_float(e.get("target_entropy")), ".3f"),
        str(e.get("num_positions", MISSING)),
    ]


def _temperature_series(head_evals: Sequence[Mapping]) -> dict[str, tuple[list, list]]:
    """Per "loss / RS" and "loss / TO", temperatures and accept lengths; only losses with >= 2 temperatures."""
    series: dict[str, tuple[list, list]] = {}
    for e in head_evals:
        for method in ("rs", "to"):
            temps, accepts = series.setdefault(f"{e.get('loss')} / {method.upper()}", ([], []))
            temps.append(as_float(e.get("temperature")))
            accepts.append(as_float(e.get(f"accept_length_{method}")))
    return {k: v for k, v in series.items() if len(set(v[0])) >= 2}


def _head_eval_section(out_dir: Path, head_evals: Sequence[Mapping]) -> list[str]:
    """The head-evaluation table and its two plots (temperature sweep, RS acceptance per loss)."""
    heading = "## MTP head evaluations"
    if not head_evals:
        return [f"{heading}\n\n_Skipped: no head evaluations given._"]
    ordered = sorted(head_evals, key=lambda e: (str(e.get("loss")), as_float(e.get("temperature"))))
    header = ["loss", "τ", "accept length RS", "accept length TO", "α_RS per step", "α_TO per step",
              "H(p) (nats)", "positions"]
    tau = _common_temperature(ordered)
    rs_title = f"RS acceptance per draft loss and draft step (τ = {_fmt(tau)})"
    by_loss = {
        str(e.get("loss")): list(e["alpha_rs"])
        for e in ordered
        if as_float(e.get("temperature")) == tau and e.get("alpha_rs")
    }
    return [
        f"{heading}\n\n" + markdown_table(header, [_head_eval_row(e) for e in ordered]),
        _plot_block(out_dir, "accept_vs_temperature.png", "Accept length vs temperature (Fig. 12a)",
                    _temperature_series(ordered), "no head loss was evaluated at two or more temperatures",
                    plots.plot_accept_vs_temperature),
        _plot_block(out_dir, "rs_acceptance_by_loss.png", "RS acceptance per loss and draft step (Table 2, Fig. 4)",
                    by_loss, "no evaluation reported `alpha_rs` with a temperature",
                    functools.partial(plots.plot_rs_acceptance_by_loss, title=rs_title)),
    ]


def _findings_markdown(runs: Sequence[Run], head_evals: Sequence[Mapping[str, Any]], findings) -> str:
    """The findings section: ``findings`` as given, or computed from the runs and the head evaluations
    (those at τ = 1 as the per-loss evaluations, all of them as the temperature sweep)."""
    if findings is None:
        at_one = {str(e.get("loss")): e for e in head_evals if as_float(e.get("temperature")) == 1.0}
        findings = compute_findings(at_one, list(head_evals), runs)
    return findings_section(findings)


def write_report(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    title: str = "Bebop report",
    extra_sections: Sequence[str] = (),
    head_evals: Sequence[Mapping[str, Any]] = (),
    findings: Sequence | None = None,
) -> Path:
    """Writes ``report.md`` and its PNGs into ``out_dir`` from run directories and head evaluations.

    The first screen is the user's answer (``answer.answer_section``): step time with and without
    MTP, the speed-up with its interval, the rollout's share of the step, accept length against
    entropy and its figure. Then the paper's findings the runs can answer, with what the others
    need (``findings.findings_section``). Details follow: the runs table (label, mode, head loss,
    update, mean step seconds, speed-up over the ``none`` run with its interval, rollout seconds,
    entropy start → end with its interval, accuracy and accept length start → end, accept-length
    slope against entropy), per-position acceptance and step time by part, the Eq. 16
    entropy/mismatch split, token-level RS-vs-TO shares, head evaluations with their plots, then
    ``extra_sections`` verbatim. A plot without data is skipped and the report says why. Files are
    written atomically; plots are linked by relative path.

    Args:
        run_dirs: Run directories (from ``bebop rl`` or the user's own runs in the same format), or runs
            ``load_run`` already read.
        out_dir: Output directory, created if needed.
        title: Level-1 heading of the report.
        extra_sections: Markdown blocks appended at the end, in order.
        head_evals: ``bebop eval-mtp --json`` dicts, each with ``loss`` and ``temperature`` added.
        findings: ``findings.Finding``s to show; None computes them from the runs and ``head_evals``.

    Returns:
        Path of the written report.md.

    Raises:
        BebopError: If no run directory is given or one cannot be loaded.
    """
    if not run_dirs:
        raise BebopError("write_report needs at least one run directory")
    runs = [d if isinstance(d, Run) else load_run(d) for d in run_dirs]  # NOTE: before creating out_dir
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = _unique_labels(runs)
    summaries = [{**summarize_run(r), "label": lab} for r, lab in zip(runs, labels)]
    sources = "\n".join(f"- **{lab}**: `{os.path.relpath(r.path, out_dir)}`" for lab, r in zip(labels, runs))
    sections = [
        f"# {title}",
        answer_section(out_dir, runs, summaries),
        _findings_markdown(runs, head_evals, findings),
        f"## Details\n\n{len(runs)} run(s), method of arXiv 2606.12370 (MTP drafts verified by rejection "
        f"sampling):\n\n{sources}",
        _runs_section(runs, summaries),
        "## Plots",
        *_run_plots(out_dir, runs, labels, summaries),
        _mismatch_section(summaries),
        _token_section(summaries),
        *_head_eval_section(out_dir, head_evals),
        *extra_sections,
    ]
    path = out_dir / REPORT_FILE
    atomic_write_text(path, "\n\n".join(s.strip() for s in sections) + "\n")
    return path

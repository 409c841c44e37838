"""Summarises RL runs and writes a markdown report with plots.

Run directories (written by ``bebop rl``, loaded by ``bebop.analysis.runs``) hold ``config.json``,
``metrics.jsonl`` and optionally ``token_stats.jsonl``. ``write_report`` turns any number of them,
plus optional MTP-head evaluations (``bebop eval-mtp --json`` dicts with ``loss`` and
``temperature`` added), into ``report.md`` beside the PNGs it links.

The report leads with the answer: the accept-length-vs-entropy figure of the TO, RS+CE and
RS+e2e-TV runs (``headline``) and the findings table; details follow.

Conventions:

1. "start" and "end" values are means over the first and last ``WINDOW_FRAC`` of the steps
   (at least one step each), so one noisy step does not decide them. The entropy change between
   them has a 95% interval from a block bootstrap within each window.
2. A metric that is absent or null on a step counts as NaN and is left out of means and fits.
3. The speed-up of a run is (mean step time of the first ``none`` run) / (its mean step time).
4. Slope intervals come from ``bootstrap``: a block bootstrap over RL steps, and at token level a
   bootstrap over completions (token statistics' ``row``), never over single tokens.
5. Step times (step, rollout, train, MTP) leave out a run's first ``WARMUP_STEPS`` steps when it has
   more: the first step carries one-time costs (allocations, lazy initialisation) that are not speed.
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
from bebop.analysis.fit import entropy_mismatch_split, linear_fit, rs_vs_to
from bebop.analysis.headline import headline_section
from bebop.analysis.runs import (  # noqa: F401 (re-exported: the report's public API)
    CONFIG_FILE,
    METRICS_FILE,
    TOKEN_ROW_KEY,
    TOKEN_STATS_FILE,
    TOKEN_STATS_KEYS,
    Run,
    _as_float,
    _column,
    load_run,
    run_label,
)
from bebop.utils.io import BebopError, atomic_write_text

WARMUP_STEPS = 1  # first steps of a run left out of its mean step times (one-time costs)
REPORT_FILE = "report.md"
WINDOW_FRAC = 0.2  # share of the steps averaged for "start" and "end" values
MISSING = "–"  # shown in tables for values that do not apply or could not be computed


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def _per_position(metrics: Sequence[Mapping], key: str) -> np.ndarray:
    """A per-position list metric over steps, shape (S, K), NaN where absent; K = longest list."""
    rows = [row.get(key) if isinstance(row.get(key), list) else [] for row in metrics]
    num_pos = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), num_pos), math.nan)  # (S, K)
    for i, r in enumerate(rows):
        out[i, : len(r)] = [_as_float(v) for v in r]
    return out


def _nanmean(values: np.ndarray, axis: int | None = None) -> Any:
    """Mean of the finite entries (NaN when there are none), without numpy's empty-slice warning."""
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, values, 0.0).sum(axis=axis) / finite.sum(axis=axis)


def _window(values: np.ndarray, end: bool) -> np.ndarray:
    """The first (or last) WINDOW_FRAC of the rows of ``values``, at least one row."""
    size = max(1, int(len(values) * WINDOW_FRAC))
    return values[-size:] if end else values[:size]


def _mismatch_summary(entropy: np.ndarray, accept: np.ndarray) -> dict:
    """Eq. 16 on accept length: early slope and the end-window entropy and mismatch parts."""
    keep = np.isfinite(entropy) & np.isfinite(accept)
    if keep.sum() < 3:
        return dict.fromkeys(("early_slope", "delta_accept_end", "entropy_part_end", "mismatch_part_end"), math.nan)
    split = entropy_mismatch_split(entropy[keep], accept[keep])
    return {
        "early_slope": split["slope"],
        "delta_accept_end": float(_nanmean(_window(split["delta_alpha"], end=True))),
        "entropy_part_end": float(_nanmean(_window(split["entropy_part"], end=True))),
        "mismatch_part_end": float(_nanmean(_window(split["mismatch_part"], end=True))),
    }


def _sequence_ids(token_stats: Sequence[Mapping]) -> np.ndarray:  # (N,)
    """One id per (RL step, completion) of the flattened positions; a whole step without ``row`` lists."""
    pairs = [(i, _as_float(r)) for i, row in enumerate(token_stats)
             for r in (row.get(TOKEN_ROW_KEY) or [0] * len(row["position"]))]
    return np.unique(np.array(pairs, dtype=float).reshape(-1, 2), axis=0, return_inverse=True)[1].reshape(-1)


def _token_summary(token_stats: Sequence[Mapping] | None) -> dict | None:
    """Token-level slopes of alpha against entropy (bootstrap over completions) and the RS-vs-TO shares (Eq. 48)."""
    if not token_stats:
        return None
    flat = {k: np.array([_as_float(v) for row in token_stats for v in row[k]], dtype=float) for k in TOKEN_STATS_KEYS}
    if flat["entropy"].size == 0:
        return None
    ids = _sequence_ids(token_stats)
    return {
        "num_positions": int(flat["entropy"].size),
        "alpha_rs_slope": bootstrap.sequences_slope(flat["entropy"], flat["alpha_rs"], ids),
        "alpha_to_slope": bootstrap.sequences_slope(flat["entropy"], flat["alpha_to"], ids),
        **rs_vs_to(flat["alpha_rs"], flat["alpha_to"]),
    }


def summarize_run(run: Run) -> dict:
    """Reduces a run to the numbers the report shows.

    Args:
        run: A loaded run.

    Returns:
        dict with ``label``, ``mode``, ``mtp_loss``, ``mtp_update``, ``online_loss``,
        ``num_steps``; mean seconds ``step_s``, ``rollout_s``, ``train_s``, ``mtp_s``;
        ``accept_length_start``/``_end``, ``accuracy_start``/``final_accuracy`` and
        ``entropy_start``/``_end`` (window means, see the module docstring) with ``accuracy_change``
        and ``entropy_change`` (Intervals of end - start); ``mean_target_entropy`` (nats); ``entropy_slope`` (Interval of the
        accept-length slope against entropy over steps, block bootstrap) and ``entropy_r``;
        per-position lists ``alpha_rs_start``/``_end``, ``alpha_to_start``/``_end``,
        ``accepted_per_pos_start``/``_end``; the Eq. 16 split (``early_slope``,
        ``delta_accept_end``, ``entropy_part_end``, ``mismatch_part_end``); and ``token``
        (token-level slopes and RS-vs-TO shares, or None without token stats). Values that cannot
        be computed are NaN.
    """
    m, cfg = run.metrics, run.config
    timed = m[WARMUP_STEPS:] if len(m) > WARMUP_STEPS else m  # step times without the warm-up step
    entropy = _column(m, "target_entropy")  # (S,)
    accept = _column(m, "spec/accept_length")  # (S,)
    accuracy = _column(m, "accuracy")  # (S,)
    entropy_start, entropy_end, entropy_change = bootstrap.window_change(entropy, WINDOW_FRAC)
    accuracy_start, accuracy_end, accuracy_change = bootstrap.window_change(accuracy, WINDOW_FRAC)
    summary = {
        "label": run.label,
        "mode": str(cfg.get("mode") or (m[0].get("mode") if m else None) or "none"),
        "mtp_loss": cfg.get("mtp_loss"),
        "mtp_update": cfg.get("mtp_update"),
        "online_loss": cfg.get("online_loss"),
        "num_steps": len(m),
        **{key: float(_nanmean(_column(timed, key))) for key in ("step_s", "rollout_s", "train_s", "mtp_s")},
        "accept_length_start": float(_nanmean(_window(accept, end=False))),
        "accept_length_end": float(_nanmean(_window(accept, end=True))),
        "accuracy_start": accuracy_start,
        "final_accuracy": accuracy_end,
        "accuracy_change": accuracy_change,
        "entropy_start": entropy_start,
        "entropy_end": entropy_end,
        "entropy_change": entropy_change,
        "mean_target_entropy": float(_nanmean(entropy)),
        "entropy_slope": bootstrap.steps_slope([(entropy, accept)])[0],
        "entropy_r": linear_fit(entropy, accept).r,
    }
    for key in ("alpha_rs", "alpha_to", "accepted_per_pos"):
        values = _per_position(m, f"spec/{key}")  # (S, K)
        summary[f"{key}_start"] = [float(v) for v in _nanmean(_window(values, end=False), axis=0)]
        summary[f"{key}_end"] = [float(v) for v in _nanmean(_window(values, end=True), axis=0)]
    summary.update(_mismatch_summary(entropy, accept))
    summary["token"] = _token_summary(run.token_stats)
    return summary


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


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


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


def _run_row(s: dict, base: dict | None) -> list[str]:
    """One row of the runs table; ``base`` is the summary of the ``none`` run, if any."""
    speculative = s["mode"] != "none"
    speedup = base["step_s"] / s["step_s"] if base and s["step_s"] > 0 else math.nan
    update = s["mtp_update"] or MISSING
    if s["mtp_update"] == "online" and s["online_loss"]:
        update = f"online ({s['online_loss']})"
    return [
        s["label"],
        s["mode"],
        (s["mtp_loss"] or MISSING) if speculative else MISSING,
        update if speculative else MISSING,
        _fmt(s["step_s"]),
        f"{speedup:.2f}×" if math.isfinite(speedup) else MISSING,
        _fmt(s["rollout_s"]),
        _fmt_change(s["entropy_start"], s["entropy_end"], s["entropy_change"]),
        _fmt_change(s["accuracy_start"], s["final_accuracy"], s["accuracy_change"]),
        f"{_fmt(s['accept_length_start'])} → {_fmt(s['accept_length_end'])}",
        _fmt_slope(s["entropy_slope"], s["entropy_r"]),
    ]


RUNS_HEADER = ("run", "mode", "head loss", "update", "step (s)", "speed-up vs none", "rollout (s)",
               "entropy start → end, nats (Δ [95% CI], relative)", "accuracy start → end (Δ [95% CI], relative)",
               "accept length start → end", "accept-length slope vs entropy (/nat) [95% CI]")


def _runs_section(summaries: Sequence[dict]) -> str:
    base = next((s for s in summaries if s["mode"] == "none"), None)
    notes = (
        f"Start and end are means over the first and last {WINDOW_FRAC:.0%} of the steps; intervals are 95%, "
        "block bootstrap over RL steps. Entropy is the mean H(p) per completion token. Accept length is tokens per "
        "verify pass including the bonus token. Speed-up is the `none` run's mean step time over the run's."
    )
    if base is None:
        notes += " No `none` run was given, so speed-ups are not computed."
    return "## Runs\n\n" + _table(RUNS_HEADER, [_run_row(s, base) for s in summaries]) + "\n\n" + notes


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
        "near zero under RS, so a frozen head suffices.\n\n" + _table(header, rows)
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
    return text + "RS wins where TV(p, q) < 1 − p(argmax q), i.e. α_RS > α_TO.\n\n" + _table(header, rows)


def _plot_block(out_dir: Path, name: str, heading: str, data: Mapping, skip_reason: str, draw: Any) -> str:
    """Draws one plot into out_dir with ``draw(data, path)``, or says why it was skipped."""
    if not data:
        return f"### {heading}\n\n_Skipped: {skip_reason}._"
    draw(data, out_dir / name)
    return f"### {heading}\n\n![{heading}]({name})"


def _run_plots(out_dir: Path, runs: Sequence[Run], labels: Sequence[str], summaries: Sequence[dict]) -> list[str]:
    """The plots drawn from the runs' metrics: accept vs entropy, per-position acceptance, latency."""
    entropy_data, position_data, latency = {}, {}, {}
    for run, label, s in zip(runs, labels, summaries):
        accept = _column(run.metrics, "spec/accept_length")  # (S,)
        if np.isfinite(accept).sum() >= 2:
            entropy_data[label] = (_column(run.metrics, "target_entropy"), accept)
        per_pos = _per_position(run.metrics, "spec/accepted_per_pos")  # (S, K)
        if np.isfinite(per_pos).any():
            position_data[label] = (_column(run.metrics, "step"), per_pos)
        if math.isfinite(s["rollout_s"]):
            latency[label] = (s["rollout_s"], s["train_s"], s["mtp_s"])
    no_spec = "no run has speculative metrics (every run is mode `none` or logged no `spec/*` keys)"
    return [
        _plot_block(out_dir, "accept_vs_entropy.png", "Accept length vs entropy (Figs. 1a, 8)",
                    entropy_data, no_spec, plots.plot_accept_vs_entropy),
        _plot_block(out_dir, "accept_per_position.png", "Per-position acceptance over RL (Figs. 2, 6)",
                    position_data, no_spec, plots.plot_accept_per_position),
        _plot_block(out_dir, "step_latency.png", "Step latency (Fig. 7)",
                    latency, "no run logged `rollout_s`", plots.plot_step_latency),
    ]


def _common_temperature(head_evals: Sequence[Mapping]) -> float | None:
    """The temperature evaluated for the most losses (ties: closest to 1.0), or None."""
    losses_at: dict[float, set] = {}
    for e in head_evals:
        losses_at.setdefault(_as_float(e.get("temperature")), set()).add(e.get("loss"))
    candidates = [t for t in losses_at if math.isfinite(t)]
    if not candidates:
        return None
    return max(candidates, key=lambda t: (len(losses_at[t]), -abs(t - 1.0)))


def _head_eval_row(e: Mapping) -> list[str]:
    scalars = ("temperature", "accept_length_rs", "accept_length_to")
    return [
        str(e.get("loss")),
        *(_fmt(_as_float(e.get(k))) for k in scalars),
        _fmt_list(e.get("alpha_rs") or []),
        _fmt_list(e.get("alpha_to") or []),
        _fmt(_as_float(e.get("target_entropy")), ".3f"),
        str(e.get("num_positions", MISSING)),
    ]


def _temperature_series(head_evals: Sequence[Mapping]) -> dict[str, tuple[list, list]]:
    """Per "loss / RS" and "loss / TO", temperatures and accept lengths; only losses with >= 2 temperatures."""
    series: dict[str, tuple[list, list]] = {}
    for e in head_evals:
        for method in ("rs", "to"):
            temps, accepts = series.setdefault(f"{e.get('loss')} / {method.upper()}", ([], []))
            temps.append(_as_float(e.get("temperature")))
            accepts.append(_as_float(e.get(f"accept_length_{method}")))
    return {k: v for k, v in series.items() if len(set(v[0])) >= 2}


def _head_eval_section(out_dir: Path, head_evals: Sequence[Mapping]) -> list[str]:
    """The head-evaluation table and its two plots (temperature sweep, RS acceptance per loss)."""
    heading = "## MTP head evaluations"
    if not head_evals:
        return [f"{heading}\n\n_Skipped: no head evaluations given._"]
    ordered = sorted(head_evals, key=lambda e: (str(e.get("loss")), _as_float(e.get("temperature"))))
    header = ["loss", "τ", "accept length RS", "accept length TO", "α_RS per step", "α_TO per step",
              "H(p) (nats)", "positions"]
    tau = _common_temperature(ordered)
    rs_title = f"RS acceptance per draft loss and draft step (τ = {_fmt(tau)})"
    by_loss = {
        str(e.get("loss")): list(e["alpha_rs"])
        for e in ordered
        if _as_float(e.get("temperature")) == tau and e.get("alpha_rs")
    }
    return [
        f"{heading}\n\n" + _table(header, [_head_eval_row(e) for e in ordered]),
        _plot_block(out_dir, "accept_vs_temperature.png", "Accept length vs temperature (Fig. 12a)",
                    _temperature_series(ordered), "no head loss was evaluated at two or more temperatures",
                    plots.plot_accept_vs_temperature),
        _plot_block(out_dir, "rs_acceptance_by_loss.png", "RS acceptance per loss and draft step (Table 2, Fig. 4)",
                    by_loss, "no evaluation reported `alpha_rs` with a temperature",
                    functools.partial(plots.plot_rs_acceptance_by_loss, title=rs_title)),
    ]


def _findings_markdown(runs: Sequence[Run], head_evals: Sequence[Mapping[str, Any]], findings) -> str:
    """The findings table: ``findings`` as given, or computed from the runs and the head evaluations
    (those at τ = 1 as the per-loss evaluations, all of them as the temperature sweep)."""
    from bebop.analysis.findings import compute_findings, findings_table  # NOTE: findings imports this module

    if findings is None:
        at_one = {str(e.get("loss")): e for e in head_evals if _as_float(e.get("temperature")) == 1.0}
        findings = compute_findings(at_one, list(head_evals), runs)
    return "### Paper findings at our scale\n\nVerdicts are computed from the data of this report.\n\n" + (
        findings_table(findings))


def write_report(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    title: str = "Bebop report",
    extra_sections: Sequence[str] = (),
    head_evals: Sequence[Mapping[str, Any]] = (),
    findings: Sequence | None = None,
) -> Path:
    """Writes ``report.md`` and its PNGs into ``out_dir`` from run directories and head evaluations.

    The first screen answers the paper's question: accept length against entropy for the TO,
    RS+CE and RS+e2e-TV runs with fitted lines and 95% bands, and the findings table. Details
    follow: the runs table (label, mode, head loss, update, mean step seconds, speed-up over the
    ``none`` run, rollout seconds, entropy start → end with its interval, accuracy and accept
    length start → end, accept-length slope against entropy), plots over the runs' metrics, the
    Eq. 16 entropy/mismatch split, token-level RS-vs-TO shares, head evaluations with their plots,
    then ``extra_sections`` verbatim. A plot without data is skipped and the report says why.
    Files are written atomically; plots are linked by relative path.

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
        f"{len(runs)} run(s), method of arXiv 2606.12370 (MTP drafts verified by rejection sampling).",
        headline_section(out_dir, runs, _findings_markdown(runs, head_evals, findings)),
        f"## Details\n\nRuns:\n\n{sources}",
        _runs_section(summaries),
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

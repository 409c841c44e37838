"""The report's first section: the user's answer in two sentences, then one figure.

1. Speed: the mean RL step time with MTP (the role of ``roles.answer_role``) and without it (the
   ``none`` runs, ``roles.baseline_runs``), their ratio with its 95% interval (``summary.step_speedup``),
   and the share of the step the rollout takes, which caps what a faster rollout can give. Synchronous
   and asynchronous runs of the same role get a sentence each: their step times measure different
   things and are never pooled.
2. Acceptance: the accept length from the first to the last steps against the policy's entropy,
   with its slope per nat where the entropies spread enough to fit one (``slopes.steps_estimate``).
3. The figure: accept length against entropy, one point per RL step, for every speculative role, each
   with a least-squares line, its pointwise 95% band and slope interval from the block bootstrap over
   RL steps (paper Figs. 1a, 8). The runs of a role (seeds) are pooled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bebop.analysis import bootstrap, plots
from bebop.analysis.roles import answer_role, baseline_runs, is_async, none_runs, role_name, speculative_roles
from bebop.analysis.runs import Run, metric_column
from bebop.analysis.slopes import steps_estimate
from bebop.analysis.summary import (
    WARMUP_STEPS,
    WINDOW_FRAC,
    mean_step_time,
    rollout_share,
    step_speedup,
)

FIGURE_FILE = "accept_vs_entropy.png"
GRID_POINTS = 50  # entropies at which each line and band are drawn
# What the answer tells the user to run when the baseline or the MTP run is missing: in `bebop rl`'s flags, or in TRL's
# settings for runs TRL wrote
BASELINE_HOW = "run the baseline with `--mode none` and the same settings, then report both"
TRL_SPECULATIVE_HOW = ("train once more with the same `GRPOConfig` and seed and "
                       "`rollout_func=bebop_rollout_func(HEAD, mode=\"rs\")`, save its state (`trainer.save_state()`)")
TRL_BASELINE_HOW = ("train once more with the same `GRPOConfig` and seed without Bebop's `rollout_func` (or with "
                    "`bebop_rollout_func(..., mode=\"none\")`), save its state (`trainer.save_state()`), then report "
                    "both output directories")


def entropy_series(runs: Sequence[Run]) -> dict[str, plots.FittedSeries]:
    """Per speculative role with >= 1 RL step of accept length: its points, and where a slope can be fitted
    (``slopes.steps_estimate``) its line and band; the legend gives the slope or why there is none."""
    series = {}
    for name, role_runs in speculative_roles(runs).items():
        pairs = [(metric_column(r.metrics, "target_entropy"), metric_column(r.metrics, "spec/accept_length"))
                 for r in role_runs]
        h = np.concatenate([x for x, _ in pairs])  # (S,)
        a = np.concatenate([y for _, y in pairs])  # (S,)
        keep = np.isfinite(h) & np.isfinite(a)
        if not keep.any():
            continue
        grid = np.linspace(h[keep].min(), h[keep].max(), GRID_POINTS)  # (G,)
        estimate = steps_estimate(role_runs, name)
        if estimate.comparable:
            line, low, high = bootstrap.steps_line(pairs, grid)
            slope = f"slope {estimate.interval.describe()} /nat"
        else:
            line = low = high = np.full(GRID_POINTS, np.nan)
            slope = f"no slope: {estimate.reason}"
        legend = f"{name}: {slope} ({int(keep.sum())} steps, {len(role_runs)} run{'s' if len(role_runs) > 1 else ''})"
        series[name] = plots.FittedSeries(h[keep], a[keep], grid, line, (low, high), legend)
    return series


def _pooled(name: str, runs: Sequence[Run]) -> str:
    return name if len(runs) == 1 else f"{name}, {len(runs)} runs pooled"


def _share_clause(base: Sequence[Run], runs: Sequence[Run]) -> str:
    """What share of a step the rollout took, without MTP (with the cap it sets) and with it."""
    base_share, share = rollout_share(base), rollout_share(runs)
    parts = []
    if 0 < base_share < 1:
        parts.append(f"the rollout was {base_share:.0%} of the step without MTP (so a faster rollout gives at most "
                     f"{1 / (1 - base_share):.2f}× a step)")
    if np.isfinite(share):
        parts.append(f"{share:.0%} of the step with it" if parts else f"the rollout was {share:.0%} of the step")
    return "; " + " and ".join(parts) if parts else ""


def _speed_sentence(name: str, runs: Sequence[Run], base: Sequence[Run]) -> str:
    """Step time with and without MTP and their ratio (see the module docstring, item 1)."""
    trl = any(r.config.get("trainer") == "trl" for r in (*runs, *base))
    source = "step times are TRL's `step_time`, which leaves out the optimizer step" if trl else ""
    if not base:
        mean, _ = mean_step_time(runs)
        if not np.isfinite(mean.estimate):
            return f"The runs logged no step time (`step_s`), so there is no speed-up ({_pooled(name, runs)})."
        took = f"An RL step took {mean.estimate:.3g} s with MTP ({_pooled(name, runs)})"
        took += f" ({source})" if source else ""
        how = TRL_BASELINE_HOW if trl else BASELINE_HOW
        return f"{took}; no run without MTP was given, so there is no speed-up: {how}."
    ratio, base_mean, mean = step_speedup(base, runs)
    if not np.isfinite(ratio.estimate):
        return f"The runs logged no step time (`step_s`), so there is no speed-up ({_pooled(name, runs)} vs none)."
    low, high = ratio.ci
    warmup = "first step" if WARMUP_STEPS == 1 else f"first {WARMUP_STEPS} steps"
    if np.isfinite(low) and np.isfinite(high):
        speedup, how = f"{ratio.estimate:.2f}× [{low:.2f}, {high:.2f}]", "95% interval, block bootstrap over"
    else:
        speedup, how = f"{ratio.estimate:.2f}×", "no interval from"
    notes = "; ".join(filter(None, (f"{how} {ratio.n} RL steps, each run's {warmup} left out", source)))
    return (f"**An RL step took {mean.estimate:.3g} s with MTP ({_pooled(name, runs)}) and {base_mean.estimate:.3g} s "
            f"without ({_pooled(role_name(base[0]), base)}): a speed-up of {speedup}** ({notes})"
            f"{_share_clause(base, runs)}.")


def _accept_sentence(name: str, runs: Sequence[Run], summaries: Sequence[dict]) -> str:
    """Accept length from the first to the last steps against the entropy (module docstring, item 2)."""
    accept = np.concatenate([metric_column(r.metrics, "spec/accept_length") for r in runs])  # (S,)
    if not np.isfinite(accept).any():
        return f"The MTP run ({name}) logged no accept length (`spec/accept_length`)."

    def mean(key: str) -> float:
        values = [s[key] for s in summaries if np.isfinite(s[key])]
        return float(np.mean(values)) if values else float("nan")

    text = (f"Accept length was {np.nanmean(accept):.2f} tokens per verify pass"
            + _window_change(mean("accept_length_start"), mean("accept_length_end")))
    if not (np.isfinite(mean("entropy_start")) and np.isfinite(mean("entropy_end"))):
        return text + " (the runs logged no entropy at the start or the end)."
    estimate = steps_estimate(runs, name)
    slope = (f"slope {estimate.interval.describe()} per nat, 95% interval" if estimate.comparable
             else f"no slope fitted ({estimate.reason})")
    return (text + f", while the policy's entropy went {mean('entropy_start'):.3f} → {mean('entropy_end'):.3f} nats "
            f"(accept length against entropy: {slope}; the figure below).")


def _window_change(start: float, end: float) -> str:
    """The accept length from the first to the last steps, or which window drafted nothing (a run of mode
    auto that chose plain decoding there logs no accept length).

    Example: _window_change(2.75, nan) -> ", 2.75 over the first 20% of steps; the last 20% drafted nothing
    (plain decoding, as mode auto chooses when drafts do not pay)"
    """
    window = f"{WINDOW_FRAC:.0%} of steps"
    plain = "drafted nothing (plain decoding, as mode auto chooses when drafts do not pay)"
    if np.isfinite(start) and np.isfinite(end):
        return f", {start:.2f} → {end:.2f} from the first to the last {window}"
    if np.isfinite(start):
        return f", {start:.2f} over the first {window}; the last {WINDOW_FRAC:.0%} {plain}"
    if np.isfinite(end):
        return f", {end:.2f} over the last {window}; the first {WINDOW_FRAC:.0%} {plain}"
    return ""


def _figure(out_dir: Path, runs: Sequence[Run]) -> str:
    series = entropy_series(runs)
    if not series:
        return "_No figure: no speculative run logged `spec/accept_length` with an entropy._"
    plots.plot_accept_vs_entropy(series, out_dir / FIGURE_FILE)
    return (f"![Accept length vs entropy]({FIGURE_FILE})\n\nOne point per RL step. Lines: least-squares fits; bands "
            "and slope intervals: 95%, block bootstrap over RL steps. In the paper, target-only (TO) accept length "
            "falls with entropy (−1.68 /nat) and RS with an e2e-TV head stays flat (−0.06 /nat).")


def _other_kind(name: str, role_runs: Sequence[Run], roles: dict[str, list[Run]]) -> list[tuple[str, list[Run]]]:
    """The role that differs from ``name`` only in synchronous vs asynchronous rollouts, as (name, runs), if any."""
    other = name.removesuffix("+async") if is_async(role_runs[0]) else f"{name}+async"
    return [(other, roles[other])] if other in roles else []


def answer_section(out_dir: Path, runs: Sequence[Run], summaries: Sequence[dict]) -> str:
    """``## The answer``: step time with and without MTP, accept length against entropy, and the figure.

    Args:
        out_dir: Where the figure is written.
        runs: Every run of the report.
        summaries: ``summary.summarize_run`` of each run, in the order of ``runs``.
    """
    chosen = answer_role(runs)
    if chosen is None:
        base = none_runs(runs, async_rollout=False) or none_runs(runs)  # NOTE: never sync and async pooled
        mean, _ = mean_step_time(base)
        took = f"An RL step took {mean.estimate:.3g} s ({_pooled(role_name(base[0]), base)}). " \
            if np.isfinite(mean.estimate) else ""
        how = (TRL_SPECULATIVE_HOW if any(r.config.get("trainer") == "trl" for r in runs)
               else "run `bebop rl --mode rs --mtp HEAD` with the same settings")
        return ("## The answer\n\n" + took + "No run used MTP (every run is mode `none`), so there is no speed-up or "
                f"accept length: {how}, and report both.")
    name, role_runs = chosen
    roles = speculative_roles(runs)
    twin = _other_kind(name, role_runs, roles)
    speed = [_speed_sentence(n, r, baseline_runs(runs, r)) for n, r in ((name, role_runs), *twin)]
    role_summaries = [s for r, s in zip(runs, summaries) if any(r is x for x in role_runs)]
    text = " ".join(speed) + " " + _accept_sentence(name, role_runs, role_summaries)
    if len(roles) > 1:
        text += " The runs table below gives every run's speed-up over `none`."
    return "## The answer\n\n" + text + "\n\n" + _figure(out_dir, runs)

"""The report's first screen: accept length against entropy for TO, RS+CE and RS+e2e-TV (Figs. 1a, 8).

One point per RL step, the runs of a role (seeds) pooled; a least-squares line per role with its
pointwise 95% band and slope interval from the block bootstrap over RL steps
(``bootstrap.steps_line`` / ``steps_slope``), the same numbers findings 1 and 2 decide on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bebop.analysis import bootstrap, plots
from bebop.analysis.roles import headline_roles
from bebop.analysis.slopes import metric_column

HEADLINE_FILE = "headline.png"
GRID_POINTS = 50  # entropies at which each line and band are drawn


def headline_series(runs: Sequence) -> dict[str, plots.FittedSeries]:
    """Per role with >= 2 RL steps of accept length: its points, fitted line, band and legend."""
    series = {}
    for name, role_runs in headline_roles(runs).items():
        pairs = [(metric_column(r.metrics, "target_entropy"), metric_column(r.metrics, "spec/accept_length"))
                 for r in role_runs]
        h = np.concatenate([x for x, _ in pairs])  # (S,)
        a = np.concatenate([y for _, y in pairs])  # (S,)
        keep = np.isfinite(h) & np.isfinite(a)
        if keep.sum() < 2:
            continue
        grid = np.linspace(h[keep].min(), h[keep].max(), GRID_POINTS)  # (G,)
        slope, _ = bootstrap.steps_slope(pairs)
        line, low, high = bootstrap.steps_line(pairs, grid)
        legend = (f"{name}: slope {slope.describe()} /nat "
                  f"({int(keep.sum())} steps, {len(role_runs)} run{'s' if len(role_runs) > 1 else ''})")
        series[name] = plots.FittedSeries(h[keep], a[keep], grid, line, (low, high), legend)
    return series


def headline_section(out_dir: Path, runs: Sequence, findings_markdown: str) -> str:
    """``## The answer``: the headline figure (or why it is missing) and the findings table."""
    series = headline_series(runs)
    if series:
        plots.plot_headline(series, out_dir / HEADLINE_FILE)
        figure = (f"![Accept length vs entropy]({HEADLINE_FILE})\n\nOne point per RL step. Lines: least-squares "
                  "fits; bands and slope intervals: 95%, block bootstrap over RL steps. The paper: TO falls "
                  "(−1.68 /nat), RS with an e2e-TV head stays flat (−0.06 /nat).")
    else:
        figure = ("_No headline figure: no to+ce, rs+ce or rs+e2e_tv run logged `spec/accept_length` on 2 or "
                  "more steps._")
    return "## The answer\n\n" + figure + "\n\n" + findings_markdown

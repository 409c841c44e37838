"""PNG plots of the paper's figures from plain data (lists, arrays, dicts).

Each function draws one figure, writes it atomically to ``path`` (a temporary file, then a
rename) and returns the path. Figures are built with ``matplotlib.figure.Figure`` directly, so
importing this module or calling it never changes matplotlib's global backend or pyplot state.
Every figure carries a title, axis labels with units and a legend, so it reads on its own.

Figures (arXiv 2606.12370):

- ``plot_accept_vs_entropy``: accept length against entropy per role with fitted lines and 95% bands
  (Figs. 1a, 8), the figure of the report's answer.
- ``plot_accept_per_position``: per-position acceptance over RL steps (Figs. 2, 6).
- ``plot_step_latency``: mean RL step time split into the parts the runs logged (Fig. 7).
- ``plot_accept_vs_temperature``: accept length against sampling temperature (Fig. 12a).
- ``plot_rs_acceptance_by_loss``: RS acceptance per draft loss and draft step (Table 2, Fig. 4).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from matplotlib.figure import Figure

from bebop.utils.files import no_space_left, shared_mode

FIG_DPI = 120  # sharp enough for a report, small enough to keep PNGs around 50 kB
PANEL_INCHES = (6.4, 4.2)  # width, height of one panel
LINE_STYLES = ("-", "--", ":", "-.")  # told apart within a "group / variant" family of series
ACCEPT_LENGTH_LABEL = "accept length (tokens per verify pass, incl. bonus)"


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    """Writes ``fig`` as a PNG to ``path`` through a temporary file and a rename (a full device: one line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=".png", dir=path.parent)
    try:
        with no_space_left(path), os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=FIG_DPI, bbox_inches="tight")
        os.chmod(tmp, shared_mode())  # NOTE: mkstemp creates 0600 files; reports are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def _check_nonempty(series: Mapping, what: str) -> None:
    if not series:
        raise ValueError(f"nothing to plot: {what} is empty")


class FittedSeries(NamedTuple):
    """Points of one role and a fitted line with its band, drawn by ``plot_accept_vs_entropy``."""

    entropy: Sequence[float]  # (S,) mean target entropy per RL step, nats
    accept: Sequence[float]  # (S,) accept length per RL step
    grid: Sequence[float]  # (G,) entropies the line is drawn at
    line: Sequence[float]  # (G,) fitted accept length (NaN: no line, the points alone)
    band: tuple[Sequence[float], Sequence[float]]  # (G,) lower and upper edge of the 95% band (NaN: none)
    legend: str  # e.g. "TO + CE head: slope -1.52 [-2.10, -0.90] /nat (60 steps, 2 runs)"


def plot_accept_vs_entropy(
    series: Mapping[str, FittedSeries],
    path: str | os.PathLike,
    title: str = "Accept length vs policy entropy over RL (paper Figs. 1a, 8)",
) -> Path:
    """Scatters accept length against entropy per role, with its fitted line and 95% band where it has them.

    Args:
        series: Per role (e.g. "rs+e2e_tv"), a ``FittedSeries``; a role without a line (NaN) puts its legend
            on its points.
        path: Where the PNG goes.
        title: Figure title.

    Returns:
        ``path``.

    Raises:
        ValueError: If ``series`` is empty.
    """
    _check_nonempty(series, "series")
    fig = Figure(figsize=(PANEL_INCHES[0] * 1.25, PANEL_INCHES[1] * 1.25))
    ax = fig.add_subplot()
    for i, s in enumerate(series.values()):
        color = f"C{i % 10}"
        grid, line = np.asarray(s.grid, dtype=float), np.asarray(s.line, dtype=float)
        fitted = bool(np.isfinite(line).all())
        ax.scatter(np.asarray(s.entropy, dtype=float), np.asarray(s.accept, dtype=float), s=10, alpha=0.45,
                   color=color, label=None if fitted else s.legend)
        if fitted:
            ax.plot(grid, line, color=color, linewidth=2.0, label=s.legend)
        low, high = (np.asarray(b, dtype=float) for b in s.band)
        if np.isfinite(low).all() and np.isfinite(high).all():
            ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
    ax.set_title(f"{title}\n(one point per RL step; lines: least-squares fits; bands: 95% block bootstrap)")
    ax.set_xlabel("mean target entropy H(p) (nats/token)")
    ax.set_ylabel(ACCEPT_LENGTH_LABEL)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return _save(fig, path)


def plot_accept_per_position(
    series: Mapping[str, tuple[Sequence[float], Sequence[Sequence[float]]]],  # label -> ((S,), (S, K))
    path: str | os.PathLike,
    title: str = "Per-position acceptance over RL",
) -> Path:
    """Draws, for each draft position j, the share of drafts accepted at j over RL steps.

    Args:
        series: Per label, the RL steps (S,) and ``spec/accepted_per_pos`` as (S, K). Series
            may differ in K; there is one panel per position up to the largest K.
        path: Where the PNG goes.
        title: Figure title.

    Returns:
        ``path``.

    Raises:
        ValueError: If ``series`` is empty.
    """
    _check_nonempty(series, "series")
    arrays = {
        label: (np.asarray(steps, dtype=float), np.atleast_2d(np.asarray(accepted, dtype=float)))  # (S,), (S, K)
        for label, (steps, accepted) in series.items()
    }
    num_pos = max(a.shape[1] for _, a in arrays.values())
    fig = Figure(figsize=(PANEL_INCHES[0], 2.4 * num_pos + 0.8))
    axes = fig.subplots(num_pos, 1, sharex=True, squeeze=False)[:, 0]
    for i, (label, (steps, accepted)) in enumerate(arrays.items()):
        for j in range(accepted.shape[1]):
            axes[j].plot(steps, 100.0 * accepted[:, j], color=f"C{i % 10}", linewidth=1.2, label=label)
    for j, ax in enumerate(axes):
        ax.set_title(f"draft position {j + 1}", fontsize="medium")
        ax.set_ylabel("accepted (% of drafts)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("RL step")
    fig.suptitle(title)
    return _save(fig, path)


LATENCY_PARTS = ("rollout", "policy update (train)", "MTP update", "rest of the step (not split out)")


def latency_parts(rollout_s: float, train_s: float, mtp_s: float, step_s: float) -> np.ndarray:  # (4,)
    """Seconds of each of ``LATENCY_PARTS`` in a mean step; a part a run did not log is 0, and the rest is
    the step time the logged parts leave unexplained (0 without a step time).

    Example: a TRL run logs its rollout and step time only: latency_parts(1.5, nan, nan, 2.0) -> [1.5, 0, 0, 0.5].
    """
    parts = np.nan_to_num(np.array([rollout_s, train_s, mtp_s], dtype=float))  # (3,)
    rest = step_s - parts.sum() if np.isfinite(step_s) else 0.0
    return np.append(parts, max(rest, 0.0))


def plot_step_latency(
    latency: Mapping[str, tuple[float, float, float, float]],  # label -> (rollout_s, train_s, mtp_s, step_s)
    path: str | os.PathLike,
    title: str = "Mean time per RL step, by part",
) -> Path:
    """Draws one stacked bar per run: the parts of its mean step time (``LATENCY_PARTS``, ``latency_parts``).

    The update is split into its policy (``train_s``) and MTP-head (``mtp_s``) parts so the cost of
    online MTP training is visible; what the step time (``step_s``) holds beyond the logged parts is
    drawn as its rest, so a run that logs only its rollout and step time (TRL) shows both. The bar's
    height, written above it, is the step time when the run logged one.

    Args:
        latency: Per run label, the mean rollout, policy-update, MTP-update and step seconds (NaN: not logged).
        path: Where the PNG goes.
        title: Figure title.

    Returns:
        ``path``.

    Raises:
        ValueError: If ``latency`` is empty.
    """
    _check_nonempty(latency, "latency")
    labels = list(latency)
    parts = np.stack([latency_parts(*latency[k]) for k in labels])  # (R, 4)
    fig = Figure(figsize=(max(PANEL_INCHES[0], 1.2 * len(labels) + 2.0), PANEL_INCHES[1]))
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for c, name in enumerate(LATENCY_PARTS):
        ax.bar(x, parts[:, c], bottom=bottom, color=f"C{c}", label=name, width=0.6)
        bottom += parts[:, c]
    for xi, total in zip(x, bottom):
        ax.annotate(f"{total:.2f} s", (xi, total), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylabel("mean seconds per RL step")
    ax.set_title(title)
    ax.set_ylim(0, 1.4 * max(float(bottom.max()), 1e-9))  # room for the legend above the bars
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", ncol=2)
    return _save(fig, path)


def plot_accept_vs_temperature(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],  # label -> ((T,), (T,))
    path: str | os.PathLike,
    title: str = "Accept length vs sampling temperature",
) -> Path:
    """Draws accept length against sampling temperature, one line per series.

    Labels of the form "group / variant" (e.g. "tv / RS", "tv / TO") share a color per group
    and get a line style per variant, so a loss's RS and TO curves read as a pair.

    Args:
        series: Per label, the temperatures and the accept length measured at each.
        path: Where the PNG goes.
        title: Figure title.

    Returns:
        ``path``.

    Raises:
        ValueError: If ``series`` is empty.
    """
    _check_nonempty(series, "series")
    fig = Figure(figsize=PANEL_INCHES)
    ax = fig.add_subplot()
    groups: dict[str, int] = {}
    variants: dict[str, int] = {}
    for label, (temps, accept) in series.items():
        group, _, variant = label.partition(" / ")
        color = f"C{groups.setdefault(group, len(groups)) % 10}"
        style = LINE_STYLES[variants.setdefault(variant, len(variants)) % len(LINE_STYLES)]
        t = np.asarray(temps, dtype=float)
        a = np.asarray(accept, dtype=float)
        order = np.argsort(t)
        ax.plot(t[order], a[order], marker="o", linestyle=style, color=color, label=label)
    ax.set_title(title)
    ax.set_xlabel("sampling temperature \u03c4 (dimensionless)")
    ax.set_ylabel(ACCEPT_LENGTH_LABEL)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_rs_acceptance_by_loss(
    alpha_rs: Mapping[str, Sequence[float]],  # loss -> (K,)
    path: str | os.PathLike,
    title: str = "RS acceptance per draft loss and draft step",
) -> Path:
    """Draws grouped bars: for each draft step, the RS acceptance sum_v min(p, q) of each loss.

    Args:
        alpha_rs: Per draft loss (e.g. "ce", "tv", "e2e_tv"), alpha_RS at draft steps 1..K.
        path: Where the PNG goes.
        title: Figure title.

    Returns:
        ``path``.

    Raises:
        ValueError: If ``alpha_rs`` is empty.
    """
    _check_nonempty(alpha_rs, "alpha_rs")
    num_pos = max(len(v) for v in alpha_rs.values())
    width = 0.8 / len(alpha_rs)
    fig = Figure(figsize=PANEL_INCHES)
    ax = fig.add_subplot()
    x = np.arange(1, num_pos + 1)
    for i, (loss, alphas) in enumerate(alpha_rs.items()):
        values = 100.0 * np.asarray(alphas, dtype=float)
        offset = (i - (len(alpha_rs) - 1) / 2) * width
        bars = ax.bar(x[: values.size] + offset, values, width=width, color=f"C{i % 10}", label=loss)
        ax.bar_label(bars, fmt="%.1f", fontsize="x-small")
    ax.set_xticks(x, [str(j) for j in x])
    ax.set_xlabel("draft step j")
    ax.set_ylabel("RS acceptance \u03a3 min(p, q) (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="draft loss", fontsize="small")
    return _save(fig, path)

"""Tests for bebop.analysis.plots: real PNGs, the data on the axes, atomic saves, empty input, headless use.

Inputs have the shapes report.py and answer.py pass, built from the synthetic runs of
test_report (metrics rows) and test_findings (MTP head evaluations and temperature sweeps).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import matplotlib
import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from bebop.analysis import plots
from bebop.analysis.fit import linear_fit
from bebop.analysis.plots import FittedSeries
from bebop.utils.files import shared_mode
from tests.helpers.analysis import NUM_STEPS, PNG_MAGIC, K, fake_head_evals, fake_metrics, fake_sweep

REPO_ROOT = Path(__file__).resolve().parents[2]
PIXEL_SLACK = 2  # text extents round differently between a measuring renderer and the saving one


# --------------------------------------------------------------------------------------------
# Synthetic inputs, shaped as report.py / answer.py pass them
# --------------------------------------------------------------------------------------------


def _column(rows, key):
    return np.array([r[key] for r in rows], dtype=float)  # (S,) or (S, K)


def _rows():
    """Metrics rows of a TO run whose accept length falls with entropy and an RS run where it stays flat."""
    return {"to+ce": fake_metrics("to", -1.5, 3.6, 1.4, seed=1),
            "rs+e2e_tv": fake_metrics("rs", -0.06, 3.6, 1.2, seed=2)}


def _fitted(rows, legend, band_half_width=0.1):
    """A role's FittedSeries: its points and a least-squares line with a band of +-band_half_width (NaN: none)."""
    h, a = _column(rows, "target_entropy"), _column(rows, "spec/accept_length")
    grid = np.linspace(h.min(), h.max(), 5)  # (G,)
    line = linear_fit(h, a).predict(grid)  # (G,)
    return FittedSeries(h, a, grid, line, (line - band_half_width, line + band_half_width), legend)


def _entropy_input():
    """answer.entropy_series: role -> FittedSeries; the RS role has no band (NaN edges), the third no line."""
    rows = _rows()
    flat = _fitted(rows["rs+e2e_tv"][:2], "rs+e2e_tv-short: no slope: 2 point(s), need 3", np.nan)
    return {
        "to+ce": _fitted(rows["to+ce"], "to+ce: slope -1.50 /nat"),
        "rs+e2e_tv": _fitted(rows["rs+e2e_tv"], "rs+e2e_tv: slope -0.06 /nat", np.nan),
        "rs+e2e_tv-short": flat._replace(line=np.full(len(flat.grid), np.nan)),
    }


def _position_input():
    """report._run_plots: label -> ((S,) steps, (S, K) accepted per position); the RS run has one position fewer."""
    series = {label: (_column(rows, "step"), _column(rows, "spec/accepted_per_pos")) for label, rows in _rows().items()}
    steps, accepted = series["rs+e2e_tv"]
    series["rs+e2e_tv"] = (steps, accepted[:, :-1])
    return series


def _latency_input(num_runs=5):
    """report._run_plots: label -> (rollout_s, train_s, mtp_s, step_s), means over steps; the first run has no
    MTP time, the last is a TRL run (rollout and step time only)."""
    latency = {}
    for i in range(num_runs):
        rows = fake_metrics("rs", -0.06, 3.6, 1.0 + 0.2 * i, seed=i)
        keys = ("rollout_s", "train_s", "mtp_s", "step_s")
        latency[f"run {i}"] = tuple(float(_column(rows, key).mean()) for key in keys)
    latency["run 0"] = (*latency["run 0"][:2], float("nan"), latency["run 0"][3])  # a run that logged no `mtp_s`
    rollout, _, _, step = latency[f"run {num_runs - 1}"]
    latency[f"run {num_runs - 1}"] = (rollout, float("nan"), float("nan"), step)  # TRL: no update times
    return latency


def _temperature_input(rows=None):
    """report._temperature_series: "loss / RS|TO" -> ((T,) temperatures, (T,) accept lengths), from eval-mtp rows."""
    series: dict[str, tuple[list, list]] = {}
    for e in rows if rows is not None else fake_sweep():
        for method in ("rs", "to"):
            temps, accepts = series.setdefault(f"{e['loss']} / {method.upper()}", ([], []))
            temps.append(e["temperature"])
            accepts.append(e[f"accept_length_{method}"])
    return series


def _rs_input():
    """report._head_eval_section: loss -> (K,) alpha_RS at one temperature; "ce" reports one step fewer."""
    by_loss = {loss: e["alpha_rs"] for loss, e in fake_head_evals().items()}
    by_loss["ce"] = by_loss["ce"][:-1]
    return by_loss


# (function, input, the name _check_nonempty reports, figure size in inches)
PLOTS = {
    "accept_vs_entropy": (plots.plot_accept_vs_entropy, _entropy_input, "series",
                          (plots.PANEL_INCHES[0] * 1.25, plots.PANEL_INCHES[1] * 1.25)),
    "accept_per_position": (plots.plot_accept_per_position, _position_input, "series",
                            (plots.PANEL_INCHES[0], 2.4 * K + 0.8)),  # one panel per position
    "step_latency": (plots.plot_step_latency, _latency_input, "latency",
                     (1.2 * 5 + 2.0, plots.PANEL_INCHES[1])),  # 5 runs: wider than one panel
    "accept_vs_temperature": (plots.plot_accept_vs_temperature, _temperature_input, "series", plots.PANEL_INCHES),
    "rs_acceptance_by_loss": (plots.plot_rs_acceptance_by_loss, _rs_input, "alpha_rs", plots.PANEL_INCHES),
}


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions hand to ``_save``, which writes nothing while this is in use."""
    figures: list[Figure] = []

    def capture(fig, path):
        figures.append(fig)
        return Path(path)

    monkeypatch.setattr(plots, "_save", capture)
    return figures


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _scatters(ax):
    return [c for c in ax.collections if isinstance(c, PathCollection)]


# --------------------------------------------------------------------------------------------
# Every plot writes a real PNG
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLOTS)
def test_each_plot_writes_a_decodable_png_of_the_figure_size(tmp_path, monkeypatch, name):
    draw, make_input, _, size_inches = PLOTS[name]
    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or save(fig, path))
    path = tmp_path / f"{name}.png"
    assert draw(make_input(), str(path)) == path
    assert path.read_bytes().startswith(PNG_MAGIC)
    image = mpimg.imread(path)  # (H, W, 4) floats in [0, 1]
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    assert image.var() > 0, "blank image"

    (fig,) = figures
    np.testing.assert_allclose(fig.get_size_inches(), size_inches)
    # The PNG is the figure's tight bounding box (bbox_inches="tight", default padding) at FIG_DPI.
    FigureCanvasAgg(fig)
    fig.set_dpi(plots.FIG_DPI)
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(matplotlib.rcParams["savefig.pad_inches"])
    assert abs(image.shape[0] - box.height * plots.FIG_DPI) <= PIXEL_SLACK
    assert abs(image.shape[1] - box.width * plots.FIG_DPI) <= PIXEL_SLACK
    # ... which only trims the figure's margins: the image is the whole figure, not a fragment of it.
    ratio = np.array(image.shape[1::-1]) / (np.array(size_inches) * plots.FIG_DPI)  # (width, height)
    assert ((0.75 < ratio) & (ratio < 1.1)).all(), ratio


# --------------------------------------------------------------------------------------------
# The data reach the axes
# --------------------------------------------------------------------------------------------


def test_accept_vs_entropy_draws_each_roles_points_line_band_and_legend(drawn):
    series = _entropy_input()
    plots.plot_accept_vs_entropy(series, "unused.png")
    (ax,) = drawn[0].axes
    scatters, lines = _scatters(ax), ax.lines
    assert len(scatters) == len(series) and len(lines) == 2  # the role without a fitted line: points only
    for scatter, s in zip(scatters, series.values()):
        np.testing.assert_allclose(scatter.get_offsets(), np.column_stack([s.entropy, s.accept]))
    for scatter, line, s in zip(scatters, lines, list(series.values())[:2]):
        np.testing.assert_allclose(line.get_xydata(), np.column_stack([s.grid, s.line]))
        assert to_hex(line.get_color()) == to_hex(scatter.get_facecolor()[0])  # a role keeps one color
    assert to_hex(lines[0].get_color()) != to_hex(lines[1].get_color())
    assert _legend(ax) == [s.legend for s in series.values()]  # the line's legend, or the points' without one
    # Only the first role has a finite band: one filled region, spanning its lower and upper edges.
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection) and not isinstance(c, PathCollection)]
    vertices = band.get_paths()[0].vertices  # (P, 2)
    first = series["to+ce"]
    for edge in first.band:
        for point in np.column_stack([first.grid, edge]):
            assert np.isclose(vertices, point).all(axis=1).any(), point


def test_accept_per_position_draws_one_panel_per_position_in_percent(drawn):
    series = _position_input()
    plots.plot_accept_per_position(series, "unused.png")
    axes = drawn[0].axes
    assert len(axes) == K
    for j, ax in enumerate(axes):
        assert ax.get_title() == f"draft position {j + 1}"
        with_position = [(label, s) for label, s in series.items() if s[1].shape[1] > j]
        assert len(ax.lines) == len(with_position) and _legend(ax) == [label for label, _ in with_position]
        for line, (_, (steps, accepted)) in zip(ax.lines, with_position):
            np.testing.assert_allclose(line.get_xydata(), np.column_stack([steps, 100.0 * accepted[:, j]]))
    assert axes[-1].get_xlabel() == "RL step"


def test_step_latency_stacks_the_logged_parts_and_the_rest_of_the_step(drawn):
    latency = _latency_input()
    plots.plot_step_latency(latency, "unused.png")
    (ax,) = drawn[0].axes
    values = np.array(list(latency.values()))  # (R, 4): rollout, train, mtp, step seconds
    parts = np.nan_to_num(values[:, :3])  # a part not logged draws as 0
    parts = np.column_stack([parts, values[:, 3] - parts.sum(axis=1)])  # the rest of the logged step time
    assert (parts >= -1e-12).all() and len(ax.containers) == 4
    assert parts[-1, 3] == pytest.approx(values[-1, 3] - values[-1, 0])  # TRL: step time beyond the rollout
    bottom = np.zeros(len(latency))
    for c, bars in enumerate(ax.containers):
        np.testing.assert_allclose([r.get_height() for r in bars], parts[:, c], atol=1e-12)
        np.testing.assert_allclose([r.get_y() for r in bars], bottom, atol=1e-12)
        bottom += parts[:, c]
    np.testing.assert_allclose(bottom, values[:, 3])  # each bar is the run's mean step time
    assert [t.get_text() for t in ax.texts] == [f"{total:.2f} s" for total in values[:, 3]]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(latency)
    assert _legend(ax) == list(plots.LATENCY_PARTS)
    assert "per RL step" in ax.get_title() and ax.get_ylabel() == "mean seconds per RL step"


def test_latency_parts_without_a_step_time_are_the_logged_parts():
    np.testing.assert_allclose(plots.latency_parts(1.5, np.nan, np.nan, 2.0), [1.5, 0, 0, 0.5])
    np.testing.assert_allclose(plots.latency_parts(1.5, 0.4, np.nan, np.nan), [1.5, 0.4, 0, 0])
    # parts that add up to more than the step time: no negative rest
    np.testing.assert_allclose(plots.latency_parts(1.5, 0.6, 0.1, 2.0), [1.5, 0.6, 0.1, 0])


def test_accept_vs_temperature_sorts_by_temperature_and_pairs_rs_with_to(drawn):
    series = _temperature_input(fake_sweep()[::-1])  # temperatures arrive in falling order
    plots.plot_accept_vs_temperature(series, "unused.png")
    (ax,) = drawn[0].axes
    assert len(ax.lines) == 4 and _legend(ax) == list(series)
    lines = dict(zip(series, ax.lines))
    for label, (temps, accepts) in series.items():
        order = np.argsort(temps)
        np.testing.assert_allclose(lines[label].get_xydata(), np.column_stack([temps, accepts])[order])
    # A loss's RS and TO curves share a color and differ in line style; a variant keeps its style across losses.
    assert lines["ce / RS"].get_color() == lines["ce / TO"].get_color() != lines["e2e_tv / RS"].get_color()
    assert lines["ce / RS"].get_linestyle() == lines["e2e_tv / RS"].get_linestyle() != lines["ce / TO"].get_linestyle()


def test_rs_acceptance_by_loss_draws_grouped_bars_in_percent(drawn):
    alpha_rs = _rs_input()
    plots.plot_rs_acceptance_by_loss(alpha_rs, "unused.png", title="RS acceptance (τ = 1.00)")
    (ax,) = drawn[0].axes
    assert ax.get_title() == "RS acceptance (τ = 1.00)"
    assert len(ax.containers) == len(alpha_rs) and _legend(ax) == list(alpha_rs)
    width = 0.8 / len(alpha_rs)
    for i, (bars, alphas) in enumerate(zip(ax.containers, alpha_rs.values())):
        np.testing.assert_allclose([r.get_height() for r in bars], 100.0 * np.asarray(alphas))
        centers = [r.get_x() + r.get_width() / 2 for r in bars]
        np.testing.assert_allclose(centers, np.arange(1, len(alphas) + 1) + (i - (len(alpha_rs) - 1) / 2) * width)
    labels = [t.get_text() for t in ax.texts]  # bar_label, one per bar
    assert labels == [f"{100 * a:.1f}" for alphas in alpha_rs.values() for a in alphas]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(j) for j in range(1, K + 1)]


# --------------------------------------------------------------------------------------------
# _save: atomic, makes its folder, leaves no figure behind
# --------------------------------------------------------------------------------------------


def _small_figure():
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    return fig


def test_save_makes_missing_folders_and_shareable_png(tmp_path):
    path = tmp_path / "a" / "b" / "fig.png"
    assert plots._save(_small_figure(), str(path)) == path
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert stat.S_IMODE(path.stat().st_mode) == shared_mode()  # what open() makes under the umask
    assert os.listdir(path.parent) == ["fig.png"]  # no temporary file left


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()], ids=["OSError", "KeyboardInterrupt"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_failed_save_leaves_the_destination_as_it_was(tmp_path, monkeypatch, error, existing):
    path = tmp_path / "fig.png"
    if existing:
        plots._save(_small_figure(), path)
    before = path.read_bytes() if existing else None

    def savefig_that_fails_halfway(self, fname, *args, **kwargs):
        fname.write(PNG_MAGIC + b"partial")
        raise error

    monkeypatch.setattr(Figure, "savefig", savefig_that_fails_halfway)
    with pytest.raises(type(error)):
        plots._save(_small_figure(), path)
    assert os.listdir(tmp_path) == (["fig.png"] if existing else [])  # no partial file, no temporary file
    if existing:
        assert path.read_bytes() == before


def test_plots_leave_pyplot_and_the_backend_alone(tmp_path):
    import matplotlib.pyplot as plt

    backend, open_figures = matplotlib.get_backend(), plt.get_fignums()
    for name, (draw, make_input, _, _) in PLOTS.items():
        draw(make_input(), tmp_path / f"{name}.png")
    assert plt.get_fignums() == open_figures
    assert matplotlib.get_backend() == backend


def test_import_and_plot_headless_in_a_fresh_process(tmp_path):
    """No DISPLAY, no MPLBACKEND: importing and plotting works and never loads pyplot."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    path = tmp_path / "rs.png"
    code = ("import sys; from bebop.analysis import plots; "
            f"plots.plot_rs_acceptance_by_loss({{'ce': [0.8, 0.7]}}, {str(path)!r}); "
            "print('matplotlib.pyplot' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert path.read_bytes().startswith(PNG_MAGIC)


# --------------------------------------------------------------------------------------------
# Empty input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["series", "latency", "alpha_rs"])
def test_check_nonempty_names_what_is_empty(what):
    with pytest.raises(ValueError, match=f"^nothing to plot: {what} is empty$"):
        plots._check_nonempty({}, what)
    plots._check_nonempty({"a": [1.0]}, what)


@pytest.mark.parametrize("name", PLOTS)
def test_each_plot_refuses_empty_input_and_writes_nothing(tmp_path, name):
    draw, _, what, _ = PLOTS[name]
    with pytest.raises(ValueError, match=f"^nothing to plot: {what} is empty$"):
        draw({}, tmp_path / "empty.png")
    assert os.listdir(tmp_path) == []

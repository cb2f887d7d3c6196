"""The report's figures: matplotlib drawings of the plain data :mod:`vitlab.report.collect` gathers.

:func:`draw` turns a :class:`~vitlab.report.page.Plot` into PNG images ``[(name, bytes)]``: one for most kinds,
several for the dynamics of a run (the controller's three figures). Drawn on matplotlib's Agg canvas (no display).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from vitlab.report.curves import PER_STEP, Series, panel_rank
from vitlab.report.page import Plot

FIGURE_DPI = 110
CURVE_COLUMNS = 4


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI)
    return buffer.getvalue()


def _grid_figure(count: int, columns: int, width: float, height: float) -> tuple[Figure, np.ndarray]:
    columns = max(1, min(columns, count))
    rows = -(-count // columns)
    fig = Figure(figsize=(width * columns, height * rows + 0.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes


def _style_axis(ax: Any, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, lw=0.5)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("epoch", fontsize=8)
    ax.xaxis.get_major_locator().set_params(integer=True)


def _epoch_axis(epochs: Sequence[float]) -> list[float]:
    """Lightning's epoch index (``metrics.jsonl``: 0 = the first epoch) as the epochs completed, the numbering of the
    console (``epoch 1/10``) and of ``dynamics.jsonl``: the first epoch's values at 1, its steps between 0 and 1."""
    return [epoch + 1 for epoch in epochs]


def _rate_axis(ax: Any) -> None:
    """The learning-rate axis: plain numbers ("0.0005", not a "1e-3" multiplier), and a rate that never changes
    drawn against zero, so the ticks do not all read the same value."""
    values = [float(y) for line in ax.get_lines() for y in line.get_ydata()]
    if values and max(values) > 0 and max(values) - min(values) <= 1e-6 * max(values):
        ax.set_ylim(0, max(values) * 1.25)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.2g}"))


def curves_figure(panels: Mapping[str, Mapping[str, Series]]) -> Figure:
    """One panel per term, train (solid) and validation (dashed) in each; other series in their own colours."""
    fig, axes = _grid_figure(len(panels), CURVE_COLUMNS, 3.1, 2.3)
    styles = {"train": {"color": "tab:blue", "ls": "-"}, "val": {"color": "tab:orange", "ls": "--"}}
    for ax, (panel, series) in zip(axes, panels.items(), strict=False):
        for index, (name, (epochs, values)) in enumerate(series.items()):
            x = _epoch_axis(epochs)
            if name.endswith(PER_STEP):  # many points: a thin, light line under the epoch means
                ax.plot(x, values, label=name, lw=0.8, alpha=0.45, color="tab:gray", zorder=1)
                continue
            style = styles.get(name, {"color": matplotlib.colormaps["tab10"](2 + index % 8), "ls": "-"})
            ax.plot(x, values, label=name, lw=1.4, marker="o" if len(epochs) < 25 else None, ms=3, **style)
        _style_axis(ax, panel)
        if panel == "learning rate":
            _rate_axis(ax)
        if len(series) > 1 or panel == "learning rate":
            ax.legend(fontsize=7, frameon=False)
    return fig


def comparison_curves_figure(runs: Sequence[tuple[str, Mapping[str, Mapping[str, Series]]]]) -> Figure:
    """Curves of several runs overlaid: one colour per run, train solid, validation dashed."""
    series: dict[str, set[str]] = {}
    for _, panels in runs:
        for panel, lines in panels.items():
            series.setdefault(panel, set()).update(lines)
    names = sorted(series, key=lambda p: panel_rank(p, series[p]))
    fig, axes = _grid_figure(len(names), CURVE_COLUMNS, 3.1, 2.3)
    colors = matplotlib.colormaps["tab10"]
    for ax, panel in zip(axes, names, strict=False):
        for run_index, (_, panels) in enumerate(runs):
            for name, (epochs, values) in panels.get(panel, {}).items():
                marker = "o" if len(epochs) < 25 else None
                ls = "--" if name == "val" else "-"
                x = _epoch_axis(epochs)
                ax.plot(x, values, color=colors(run_index % 10), ls=ls, lw=1.3, marker=marker, ms=2.5)
        _style_axis(ax, panel)
        if panel == "learning rate":
            _rate_axis(ax)
    handles = [Line2D([], [], color=colors(i % 10), lw=2, label=name) for i, (name, _) in enumerate(runs)]
    handles += [
        Line2D([], [], color="black", ls="-", label="train"),
        Line2D([], [], color="black", ls="--", label="val"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    return fig


def _layer_label(name: str) -> str:
    return name.removesuffix(".attn").replace("blocks.", "block ")


def _display(image: np.ndarray) -> np.ndarray:
    """``[C, H, W]`` in [0, 1] -> HxW (one channel) or HxWx3."""
    return image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)


def _show_image(ax: Any, pixels: np.ndarray) -> None:
    ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def attention_figure(pixels: np.ndarray, labels: Sequence[str], layer_maps: Mapping[str, np.ndarray]) -> Figure:
    """``pixels: [B, C, H, W]`` in [0, 1], ``layer_maps: {name: [B, gh, gw]}``. Rows: images; columns: the image,
    then each layer's map (min-max scaled per panel) over the image."""
    images = [_display(image) for image in pixels]
    columns = 1 + len(layer_maps)
    cell = max(0.9, min(1.6, 13.0 / columns))
    fig = Figure(figsize=(cell * columns, cell * len(images) + 0.4), layout="constrained")
    axes = fig.subplots(len(images), columns, squeeze=False)
    height, width = images[0].shape[:2]
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)
    for row, (image, label) in enumerate(zip(images, labels, strict=True)):
        _show_image(axes[row, 0], image)
        axes[row, 0].set_ylabel(label, fontsize=8)
        for column, (name, maps) in enumerate(layer_maps.items(), start=1):
            ax = axes[row, column]
            _show_image(ax, image)
            heat = maps[row]
            heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
            ax.imshow(heat, cmap="inferno", alpha=0.75, extent=extent, interpolation="nearest", vmin=0, vmax=1)
            if row == 0:
                ax.set_title(_layer_label(name), fontsize=8)
    axes[0, 0].set_title("image", fontsize=8)
    return fig


def segments_figure(pixels: Any, S: Any, grid: tuple[int, int], titles: Sequence[str]) -> Figure:
    """Segment maps in the colours of ``vitlab probe slot-k`` (:func:`vitlab.diagnostics.segments.draw_segment_maps`:
    slot ``k`` has the same colour everywhere)."""
    from vitlab.diagnostics.segments import draw_segment_maps

    return draw_segment_maps(pixels, S, grid, titles=titles)


def per_class_figure(per_class: Sequence[Mapping[str, Any]]) -> Figure:
    names = [str(e["class"]) for e in per_class]
    accuracy = [np.nan if e["accuracy"] is None else e["accuracy"] for e in per_class]
    fig = Figure(figsize=(min(max(5.0, 0.16 * len(names) + 2), 14.0), 2.6), layout="constrained")
    ax = fig.subplots()
    ax.bar(range(len(names)), accuracy, color="tab:blue")
    step = max(1, len(names) // 40)
    ax.set_xticks(range(0, len(names), step), names[::step], rotation=90 if len(names) > 12 else 0, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy", fontsize=8)
    ax.set_title("per-class test accuracy", fontsize=10)
    ax.grid(axis="y", alpha=0.3, lw=0.5)
    ax.tick_params(labelsize=7)
    return fig


def _dynamics_run(path: str) -> list[tuple[str, bytes]]:
    """The dynamics controller's figures of a ``dynamics.jsonl`` (drift and clusters, tau, frozen epochs)."""
    from vitlab.diagnostics.plots import draw_run

    with tempfile.TemporaryDirectory() as tmp:
        return [(p.name, p.read_bytes()) for p in draw_run(path, tmp)]


def _dynamics_comparison(paths: Sequence[str], labels: Sequence[str]) -> list[tuple[str, bytes]]:
    """The two runs' heads side by side and, when both records carry the learning rate, drift against it."""
    from vitlab.diagnostics.plots import has_learning_rate, plot_comparison, plot_drift_vs_lr, read_dynamics

    runs = [read_dynamics(path) for path in paths]
    with tempfile.TemporaryDirectory() as tmp:
        written = [plot_comparison(runs[0], runs[1], Path(tmp) / "comparison.png", labels=tuple(labels))]
        if all(has_learning_rate(records) for records in runs):
            written.append(plot_drift_vs_lr(dict(zip(labels, runs, strict=True)), Path(tmp) / "drift_vs_lr.png"))
        return [(path.name, path.read_bytes()) for path in written]


def explanations_figure(pixels: Any, labels: Sequence[str], maps: Mapping[str, np.ndarray]) -> Figure:
    """Test images (rows) and every applicable explanation method (columns): ``overlay_grid`` of vitlab.explain."""
    import torch

    from vitlab.explain.figures import overlay_grid

    return overlay_grid(torch.as_tensor(pixels), {m: torch.as_tensor(v) for m, v in maps.items()}, list(labels))


#: kind -> drawing of a :class:`Plot`'s data into one matplotlib figure
FIGURES: dict[str, Callable[..., Figure]] = {
    "curves": curves_figure,
    "comparison_curves": comparison_curves_figure,
    "attention": attention_figure,
    "segments": segments_figure,
    "per_class": per_class_figure,
    "explanations": explanations_figure,
}
#: kind -> drawing that writes PNG files itself (the dynamics controller's figures)
PNG_DRAWINGS: dict[str, Callable[..., list[tuple[str, bytes]]]] = {
    "dynamics_run": _dynamics_run,
    "dynamics_comparison": _dynamics_comparison,
}


def draw(plot: Plot) -> list[tuple[str, bytes]]:
    """The PNG images of ``plot``: ``[(name, bytes)]``."""
    if plot.kind in PNG_DRAWINGS:
        return PNG_DRAWINGS[plot.kind](**plot.data)
    return [(f"{plot.kind}.png", png_bytes(FIGURES[plot.kind](**plot.data)))]

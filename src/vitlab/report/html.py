"""The run report: one self-contained HTML page per run, or per comparison of runs (``vitlab report``).

A run's page shows what its directory holds, each part only when the run has it: the resolved config and the
environment; training and validation curves of every logged term from ``metrics.jsonl``; the test metrics; the
evaluation suite (``evaluation/evaluation.json``: accuracy, calibration, reliability diagram, corruptions, per-class
accuracy, CET-ViT reversibility and slot-usage K); ViTCAE's generative grids and numbers (``generate/``); the attention
dynamics (``dynamics.jsonl`` and its figures); attention maps and, for models with a token-to-slot assignment, segment
maps of a few test images, computed here from the exported model; and any other PNG or JSON found in the run
directory (probe outputs, for instance). A comparison page puts the final metrics of several runs in one table,
lists the config keys in which they differ and overlays their curves.

Every image is embedded as a base64 ``data:`` URI and the CSS is inline: the file needs no network and no other file.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import itertools
import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter
from torch import nn

from vitlab.config import RunConfig, to_dict
from vitlab.errors import ConfigError, VitlabError
from vitlab.rundir import (
    CONFIG_FILE,
    DYNAMICS_DIR,
    DYNAMICS_FILE,
    ENV_FILE,
    EVALUATION_DIR,
    EVALUATION_FILE,
    EXPORT_CONFIG_FILE,
    GENERATE_DIR,
    GENERATE_METRICS_FILE,
    METRICS_FILE,
    REPORT_FILE,
    STEPS_FILE,
    TEST_METRICS_FILE,
    RunDir,
    atomic_write_text,
    locate_model,
    read_json,
)
from vitlab.version import __version__

ATTENTION_IMAGES = 4  # test images whose attention maps and segment maps are shown
FIGURE_DPI = 110
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_JSON_BYTES = 100_000  # discovered JSON files up to this size are shown in full
SKIPPED_DIRS = frozenset({"tb", "checkpoints", "export", "lightning_logs"})
CURVE_COLUMNS = 4
#: metrics whose best value is the largest (bold in the comparison table); ``LOWER_IS_BETTER`` the smallest
HIGHER_IS_BETTER = ("acc", "accuracy", "top1", "top5", "psnr", "ssim", "psnr_gain", "mean_corrupted")
LOWER_IS_BETTER = ("loss", "nll", "ece", "mse")

GRID_CAPTIONS = {
    "reconstruction": "Reconstruction: test images and their reconstructions.",
    "conditional": "Class-conditional samples, one row per class.",
    "interpolation": "Interpolation of the class latent between two test images of different classes.",
    "inpainting": "Inpainting of randomly masked patches.",
}


# -------------------------------------------------------------------------------------------------------------------
# Small HTML helpers
# -------------------------------------------------------------------------------------------------------------------
def esc(value: Any) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A number as a short string: ints as they are, floats to 4 significant digits, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.0f}" if value.is_integer() and abs(value) < 1e6 else f"{value:.4g}"
    return str(value)


def png_uri(data: bytes) -> str:
    """PNG bytes -> a ``data:image/png;base64,...`` URI. Raises ``ValueError`` on bytes that are not a PNG."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file (its first bytes are not the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def figure_uri(fig: Figure) -> str:
    """A matplotlib figure rendered to PNG, as a data URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI)
    return png_uri(buffer.getvalue())


def table_html(header: Sequence[str], rows: Iterable[Sequence[Any]], bold: Iterable[tuple[int, int]] = ()) -> str:
    """A table; cells are escaped and numbers formatted with :func:`fmt`; ``bold`` holds ``(row, column)`` cells."""
    bold = set(bold)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, cell in enumerate(row):
            text = esc(fmt(cell))
            cells.append(f"<td><b>{text}</b></td>" if (r, c) in bold else f"<td>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def metrics_html(values: Mapping[str, Any], css_class: str = "kv") -> str:
    """Name/value pairs in as many columns as the page is wide (``css_class="kv facts"``: one column of text)."""
    items = "".join(
        f'<div class="kv-item"><span>{esc(name)}</span><b>{esc(fmt(value))}</b></div>' for name, value in values.items()
    )
    return f'<div class="{css_class}">{items}</div>'


def figure_html(uri: str, caption: str = "", alt: str = "") -> str:
    caption_html = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{uri}" alt="{esc(alt or caption)}">{caption_html}</figure>'


def details_html(summary: str, body: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>{body}</details>"


def pre_html(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


@dataclass
class Section:
    """One part of the page: an anchor id, a heading and its (already escaped) HTML body."""

    id: str
    title: str
    body: str

    def html(self) -> str:
        return f'<section id="{esc(self.id)}"><h2>{esc(self.title)}</h2>{self.body}</section>'


# -------------------------------------------------------------------------------------------------------------------
# Reading a run directory
# -------------------------------------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """What a report reads from one run directory (each entry None or empty when the run does not have it)."""

    path: Path
    config: RunConfig
    config_text: str
    env: dict[str, Any] | None
    metrics: list[dict[str, Any]]
    test_metrics: dict[str, float] | None
    steps: list[dict[str, Any]]
    generate_metrics: dict[str, float] | None
    evaluation: dict[str, Any] | None
    final_metrics: dict[str, float] = field(default_factory=dict)
    name: str = ""
    used_files: set[Path] = field(default_factory=set)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        run = RunDir(run_dir)
        config = run.config()
        record = cls(
            path=run.path,
            config=config,
            config_text=run.config_file.read_text(),
            env=run.env(),
            metrics=run.metrics(),
            test_metrics=run.test_metrics(),
            steps=run.steps(),
            generate_metrics=run.generate_metrics(),
            evaluation=run.evaluation(),
            final_metrics=run.final_metrics(),
            name=run.path.resolve().name,
        )
        record.use(CONFIG_FILE, ENV_FILE, METRICS_FILE, STEPS_FILE, TEST_METRICS_FILE)
        record.use(f"{GENERATE_DIR}/{GENERATE_METRICS_FILE}", f"{EVALUATION_DIR}/{EVALUATION_FILE}")
        return record

    def use(self, *relative: str | Path) -> None:
        """Mark files as shown, so that the 'other outputs' section does not show them again."""
        self.used_files.update((self.path / r).resolve() for r in relative)

    def png(self, relative: str | Path) -> str | None:
        """The data URI of a PNG in the run directory (marked as shown), or None if the file is absent or no PNG."""
        file = self.path / relative
        if not file.is_file():
            return None
        self.use(relative)
        try:
            return png_uri(file.read_bytes())
        except ValueError as e:
            warnings.warn(f"report: {file} left out: {e}", stacklevel=2)
            return None

    @property
    def model_name(self) -> str:
        return str(self.config.model.get("name", "?"))


# -------------------------------------------------------------------------------------------------------------------
# Curves from metrics.jsonl
# -------------------------------------------------------------------------------------------------------------------
Series = tuple[list[float], list[float]]  # (epochs, values)


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Series]]:
    """Group the per-epoch rows of ``metrics.jsonl`` into panels of series: ``{panel: {series: (epochs, values)}}``.

    ``train/<term>`` and ``val/<term>`` share the panel ``<term>`` (series ``train`` and ``val``); learning-rate keys
    (``train/lr`` from vitlab's tasks; ``lr``, ``lr-AdamW``, ``lr-AdamW/pg1`` from Lightning's
    ``LearningRateMonitor``) share the panel ``learning rate``;
    any other key (``dynamics/mean_drift``) is a panel of its own. Panels come in the order loss, acc, learning rate,
    then the other train/val terms, then the rest, each group sorted by name; in a panel, train comes before val.
    ``epoch`` and ``step`` are the axis, not panels; values that are not finite numbers are left out.
    """
    panels: dict[str, dict[str, Series]] = {}
    for row in rows:
        epoch = row.get("epoch")
        if epoch is None:
            continue
        for key, value in row.items():
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if key in ("epoch", "step") or not numeric or not math.isfinite(value):
                continue
            stage, _, term = key.partition("/")
            if key == "train/lr":  # logged by vitlab's tasks
                panel, series = "learning rate", "lr"
            elif stage in ("train", "val") and term:
                panel, series = term, stage
            elif key == "lr" or key.startswith("lr-"):
                panel, series = "learning rate", key
            else:
                panel, series = key, key
            epochs, values = panels.setdefault(panel, {}).setdefault(series, ([], []))
            epochs.append(float(epoch))
            values.append(float(value))

    train_val_first = {"train": 0, "val": 1}
    return {
        panel: {
            name: panels[panel][name] for name in sorted(panels[panel], key=lambda s: (train_val_first.get(s, 2), s))
        }
        for panel in sorted(panels, key=lambda p: _panel_rank(p, panels[p]))
    }


PER_STEP = " (per step)"


def add_step_series(
    panels: dict[str, dict[str, Series]], steps: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Series]]:
    """Add the per-step training loss and learning rate of ``steps.jsonl`` to the ``loss`` and ``learning rate``
    panels (series ``train (per step)``, ``lr (per step)``), on the epoch axis: the last step of epoch ``e`` (the
    ``step`` of its ``metrics.jsonl`` row) lands at ``e``, where the epoch's mean is drawn."""
    ends = {int(row["epoch"]): int(row["step"]) for row in rows if row.get("step") is not None}
    for key, panel, series in (("loss", "loss", "train" + PER_STEP), ("lr", "learning rate", "lr" + PER_STEP)):
        xs, ys = [], []
        for record in steps:
            epoch, step, value = record.get("epoch"), record.get("step"), record.get(key)
            if epoch not in ends or step is None or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            start = ends.get(epoch - 1, -1)
            xs.append(epoch - 1 + (step - start) / max(1, ends[epoch] - start))
            ys.append(float(value))
        if xs:
            panels.setdefault(panel, {})[series] = (xs, ys)
    return panels


def _panel_rank(panel: str, series: Iterable[str]) -> tuple[int, str]:
    """Sort key of a panel: loss, acc, learning rate, then train/val terms, then other keys, each by name."""
    first = {"loss": 0, "acc": 1, "learning rate": 2}
    if panel in first:
        return first[panel], panel
    return (3 if {"train", "val"} & set(series) else 4), panel


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


def curves_figure(panels: Mapping[str, Mapping[str, Series]]) -> Figure:
    """One panel per term, train (solid) and validation (dashed) in each; other series in their own colours."""
    fig, axes = _grid_figure(len(panels), CURVE_COLUMNS, 3.1, 2.3)
    styles = {"train": {"color": "tab:blue", "ls": "-"}, "val": {"color": "tab:orange", "ls": "--"}}
    for ax, (panel, series) in zip(axes, panels.items(), strict=False):
        for index, (name, (epochs, values)) in enumerate(series.items()):
            if name.endswith(PER_STEP):  # many points: a thin, light line under the epoch means
                ax.plot(epochs, values, label=name, lw=0.8, alpha=0.45, color="tab:gray", zorder=1)
                continue
            style = styles.get(name, {"color": matplotlib.colormaps["tab10"](2 + index % 8), "ls": "-"})
            ax.plot(epochs, values, label=name, lw=1.4, marker="o" if len(epochs) < 25 else None, ms=3, **style)
        _style_axis(ax, panel)
        if panel == "learning rate":  # "0.0005" on the axis, not a "1e-3" multiplier on top of the title
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.2g}"))
        if len(series) > 1 or panel == "learning rate":
            ax.legend(fontsize=7, frameon=False)
    return fig


def comparison_curves_figure(runs: Sequence[tuple[str, Mapping[str, Mapping[str, Series]]]]) -> Figure:
    """Curves of several runs overlaid: one colour per run, train solid, validation dashed."""
    series = {}
    for _, panels in runs:
        for panel, lines in panels.items():
            series.setdefault(panel, set()).update(lines)
    names = sorted(series, key=lambda p: _panel_rank(p, series[p]))
    fig, axes = _grid_figure(len(names), CURVE_COLUMNS, 3.1, 2.3)
    colors = matplotlib.colormaps["tab10"]
    for ax, panel in zip(axes, names, strict=False):
        for run_index, (_, panels) in enumerate(runs):
            for name, (epochs, values) in panels.get(panel, {}).items():
                ls = "--" if name == "val" else "-"
                ax.plot(
                    epochs,
                    values,
                    color=colors(run_index % 10),
                    ls=ls,
                    lw=1.3,
                    marker="o" if len(epochs) < 25 else None,
                    ms=2.5,
                )
        _style_axis(ax, panel)
    handles = [Line2D([], [], color=colors(i % 10), lw=2, label=name) for i, (name, _) in enumerate(runs)]
    handles += [
        Line2D([], [], color="black", ls="-", label="train"),
        Line2D([], [], color="black", ls="--", label="val"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    return fig


# -------------------------------------------------------------------------------------------------------------------
# Attention maps and segment maps of a few test images
# -------------------------------------------------------------------------------------------------------------------
def cls_attention_maps(maps: Mapping[str, torch.Tensor], grid: tuple[int, int]) -> dict[str, torch.Tensor]:
    """CLS-to-patch attention of each layer, averaged over the heads, on the patch grid: ``{name: [B, gh, gw]}``.

    ``maps``: ``{name: [B, H, T, T]}`` from :func:`vitlab.capture_attention`. A layer over a CLS token and the
    patches (``T = gh * gw + 1``, the CLS token first, as in ``VisionTransformer``) gives ``attn[:, :, 0, 1:]``
    averaged over ``H``. Other maps are left out: windowed or cross attention, decoders and slot encoders over other
    tokens, layers after token merging, and models without a CLS token.
    """
    num_patches = grid[0] * grid[1]
    return {
        name: attn[:, :, 0, 1:].float().mean(1).reshape(attn.shape[0], *grid)
        for name, attn in maps.items()
        if attn.ndim == 4 and attn.shape[-2] == attn.shape[-1] == num_patches + 1
    }


def _layer_label(name: str) -> str:
    return name.removesuffix(".attn").replace("blocks.", "block ")


def _pixels_for_display(images: torch.Tensor) -> list[np.ndarray]:
    """``images: [B, C, H, W]`` in [0, 1] -> HxW (one channel) or HxWx3 arrays."""
    return [img[0].numpy() if img.shape[0] == 1 else img.permute(1, 2, 0).numpy() for img in images]


def _show_image(ax: Any, pixels: np.ndarray) -> None:
    ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def attention_figure(pixels: list[np.ndarray], labels: list[str], layer_maps: Mapping[str, torch.Tensor]) -> Figure:
    """Rows: images; columns: the image, then each layer's map (min-max scaled per panel) over the image."""
    columns = 1 + len(layer_maps)
    cell = max(0.9, min(1.6, 13.0 / columns))
    fig = Figure(figsize=(cell * columns, cell * len(pixels) + 0.4), layout="constrained")
    axes = fig.subplots(len(pixels), columns, squeeze=False)
    height, width = pixels[0].shape[:2]
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)
    for row, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        _show_image(axes[row, 0], image)
        axes[row, 0].set_ylabel(label, fontsize=8)
        for column, (name, maps) in enumerate(layer_maps.items(), start=1):
            ax = axes[row, column]
            _show_image(ax, image)
            heat = maps[row].numpy()
            heat = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
            ax.imshow(heat, cmap="inferno", alpha=0.75, extent=extent, interpolation="nearest", vmin=0, vmax=1)
            if row == 0:
                ax.set_title(_layer_label(name), fontsize=8)
    axes[0, 0].set_title("image", fontsize=8)
    return fig


def segment_figure(pixels: list[np.ndarray], labels: list[str], segments: torch.Tensor, slot_k: torch.Tensor) -> Figure:
    """Top row: the images; bottom row: each patch coloured by the slot it is assigned to most (``argmax S``)."""
    fig = Figure(figsize=(1.7 * len(pixels), 3.6), layout="constrained")
    axes = fig.subplots(2, len(pixels), squeeze=False)
    palette = matplotlib.colormaps["tab20"]
    height, width = pixels[0].shape[:2]
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)
    for column, (image, label) in enumerate(zip(pixels, labels, strict=True)):
        _show_image(axes[0, column], image)
        axes[0, column].set_title(label, fontsize=8)
        _show_image(axes[1, column], image)
        colours = palette(segments[column].numpy() % 20)
        axes[1, column].imshow(colours, alpha=0.6, extent=extent, interpolation="nearest")
        axes[1, column].set_title(f"K = {int(slot_k[column])}", fontsize=8)
    return fig


@dataclass
class ImageProbe:
    """A few test images pushed through a run's model: what the attention and segment sections draw."""

    model: nn.Module
    pixels: torch.Tensor  # [B, C, H, W] in [0, 1]
    inputs: torch.Tensor  # [B, C, H, W] normalised as in training
    labels: list[str]


def _pick_test_images(labels: torch.Tensor, count: int) -> list[int]:
    """Indices of the first test image of each class, in class order, then further images if there are few classes."""
    firsts = [int(torch.nonzero(labels == c)[0]) for c in torch.unique(labels).tolist()]
    chosen = firsts[:count]
    taken = set(chosen)
    chosen += list(itertools.islice((i for i in range(len(labels)) if i not in taken), count - len(chosen)))
    return chosen


def _model_source(run: RunRecord) -> Path | None:
    try:
        return locate_model(run.path).source
    except VitlabError:
        return None


def load_image_probe(run: RunRecord, count: int) -> ImageProbe | None:
    """The run's model and ``count`` test images of its data (None, with a warning, when either cannot be had)."""
    from vitlab.data import build_datamodule
    from vitlab.export import load_model

    source = _model_source(run)
    if source is None or count < 1:
        return None
    try:
        model = load_model(source).eval()
        dm = build_datamodule(run.config.data)
        dm.setup("test")
        indices = _pick_test_images(dm.test_set.labels, count)
        images = torch.stack([dm.test_set[i][0] for i in indices])
        info = read_json(source / EXPORT_CONFIG_FILE).get("data", {}) if source.is_dir() else {}
        mean, std = info.get("mean", dm.mean), info.get("std", dm.std)
    except (VitlabError, OSError) as e:
        warnings.warn(f"report: attention and segment maps of {run.path} left out: {e}", stacklevel=2)
        return None
    pixels = images.float() / 255
    inputs = (pixels - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    class_names = dm.class_names
    labels = [str(class_names[int(dm.test_set.labels[i])]) for i in indices]
    return ImageProbe(model, pixels, inputs, labels)


def _model_grid(model: nn.Module) -> tuple[int, int] | None:
    grid = getattr(model, "grid_size", None) or getattr(getattr(model, "patch_embed", None), "grid_size", None)
    return tuple(grid) if grid is not None else None


def attention_section(probe: ImageProbe) -> Section | None:
    """CLS-to-patch attention maps of the probe images, per layer (models with a CLS token)."""
    from vitlab.layers.capture import attention_modules, capture_attention

    grid = _model_grid(probe.model)
    if grid is None or not attention_modules(probe.model):
        return None
    layer_maps = cls_attention_maps(capture_attention(probe.model, probe.inputs), grid)
    if not layer_maps:
        return None
    caption = (
        f"Attention of the CLS token to each patch, per layer, averaged over the heads, on the {grid[0]}x{grid[1]} "
        "patch grid over the image; each map is scaled to its own minimum and maximum (bright: high)."
    )
    fig = attention_figure(_pixels_for_display(probe.pixels), probe.labels, layer_maps)
    return Section("attention", "Attention maps", f"<p>{esc(caption)}</p>" + figure_html(figure_uri(fig)))


def segment_maps_html(probe: ImageProbe) -> str:
    """For a model with a token-to-slot assignment ``S: [B, N, K_max]`` (CET-ViT), the segment maps of the probe
    images and their slot-usage K; an empty string for other models."""
    from vitlab.evaluation.evaluate import logits_and_assignment
    from vitlab.models.cet_vit import slot_usage_k

    grid = _model_grid(probe.model)
    if grid is None or not hasattr(probe.model, "forward_with_aux"):
        return ""
    with torch.no_grad():
        _, assignment = logits_and_assignment(probe.model, probe.inputs)
    if assignment is None or assignment.shape[1] != grid[0] * grid[1]:
        return ""
    segments = assignment.argmax(-1).reshape(-1, *grid)  # [B, gh, gw]
    fig = segment_figure(_pixels_for_display(probe.pixels), probe.labels, segments, slot_usage_k(assignment))
    return (
        f"<p>Each patch coloured by the slot it is assigned to most (argmax over the {assignment.shape[-1]} slots of "
        "S); K is the slot-usage K of the image: the slots holding more than 5% of the assignment mass.</p>"
        + figure_html(figure_uri(fig))
    )


def segments_section(run: RunRecord, probe: ImageProbe | None) -> Section | None:
    """CET-ViT: segment maps of the probe images and the per-class slot-usage K of ``vitlab evaluate``."""
    body = segment_maps_html(probe) if probe is not None else ""
    assignment = (run.evaluation or {}).get("assignment")
    if assignment:
        body += "<h3>Per class, from vitlab evaluate</h3>" + _assignment_html(assignment)
    return Section("segments", "Token groups and slot-usage K", body) if body else None


# -------------------------------------------------------------------------------------------------------------------
# Sections of one run
# -------------------------------------------------------------------------------------------------------------------
def run_summary(run: RunRecord, model: nn.Module | None) -> str:
    """The page heading's key facts as cards."""
    cards = [("model", run.model_name), ("dataset", run.config.data.name), ("epochs", len(run.metrics) or None)]
    if model is not None:
        cards.append(("parameters", f"{sum(p.numel() for p in model.parameters()) / 1e6:.3g} M"))
    for key in ("test/acc", "test/loss"):
        if run.test_metrics and key in run.test_metrics:
            cards.append((key, run.test_metrics[key]))
    if run.evaluation:
        cards.append(("test ECE", run.evaluation["test"]["ece"]))
    cells = "".join(
        f'<div class="card"><div class="label">{esc(label)}</div><div class="value">{esc(fmt(value))}</div></div>'
        for label, value in cards
        if value is not None
    )
    return f'<div class="cards">{cells}</div>'


def config_section(run: RunRecord) -> Section:
    body = details_html("Resolved config (config.yaml)", pre_html(run.config_text))
    if run.env is not None:
        env = run.env
        versions = env.get("versions", {})
        hardware = env.get("hardware", {})
        git = env.get("git", {})
        rows = [
            ("started", env.get("time")),
            ("command", " ".join(env.get("command", []))),
            ("git revision", f"{git.get('revision') or '?'}{' (uncommitted changes)' if git.get('dirty') else ''}"),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
            ("platform", hardware.get("platform")),
            ("CPUs", hardware.get("cpu_count")),
            ("GPUs", ", ".join(hardware.get("cuda", [])) or "none"),
        ]
        facts = metrics_html({name: value for name, value in rows if value is not None}, "kv facts")
        body += details_html("Environment (env.json)", facts + pre_html(json.dumps(env, indent=2)))
    return Section("config", "Config and environment", body)


def curves_section(run: RunRecord) -> Section | None:
    panels = add_step_series(curve_panels(run.metrics), run.steps, run.metrics)
    if not panels:
        return None
    note = "Per epoch, from metrics.jsonl: training (solid) and validation (dashed) values of every logged term."
    if run.steps:
        note += " In grey: the training loss and learning rate every trainer.log_every_n_steps steps (steps.jsonl)."
    if "learning rate" not in panels:
        note += " The run logged no learning rate."
    return Section("curves", "Training curves", f"<p>{esc(note)}</p>" + figure_html(figure_uri(curves_figure(panels))))


def test_metrics_section(run: RunRecord) -> Section | None:
    if not run.test_metrics:
        return None
    body = "<p>The best checkpoint on the test set (test_metrics.json).</p>" + metrics_html(run.test_metrics)
    return Section("test", "Test metrics", body)


def _assignment_html(assignment: Mapping[str, Any]) -> str:
    corr = assignment.get("correlation")
    parts = [
        f"<p>On the test set: mean reversibility {esc(fmt(assignment['reversibility_mean']))}, mean slot-usage K "
        f"{esc(fmt(assignment['slot_usage_k_mean']))}."
    ]
    if corr:
        parts.append(
            f" Reversibility against per-class accuracy over {esc(corr['n'])} classes: Pearson r = "
            f"{esc(fmt(corr['pearson_r']))} (p = {esc(fmt(corr['pearson_p']))}, 95% CI "
            f"[{esc(fmt(corr['pearson_ci_low']))}, {esc(fmt(corr['pearson_ci_high']))}]), Spearman rho = "
            f"{esc(fmt(corr['spearman_rho']))} (p = {esc(fmt(corr['spearman_p']))})."
        )
    elif assignment.get("correlation_skipped"):
        parts.append(f" Correlation with accuracy: {esc(assignment['correlation_skipped'])}.")
    parts.append("</p>")
    ranked = sorted((e for e in assignment["per_class"] if e["n"]), key=lambda e: -(e["slot_usage_k"] or 0.0))
    rows = [(e["class"], e["n"], e["slot_usage_k"], e["reversibility"], e["accuracy"]) for e in ranked]
    table = table_html(["class", "test images", "slot-usage K", "reversibility", "accuracy"], rows)
    parts.append(details_html("Per class, ranked by slot-usage K", table, open_=len(rows) <= 10))
    return "".join(parts)


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


def evaluation_section(run: RunRecord) -> Section | None:
    results = run.evaluation
    if not results:
        return None
    info = results["run"]
    parts = [
        f"<p>{esc(info['n_test'])} test images of {esc(info['dataset'])}"
        + (f" (first {esc(info['max_batches'])} batches)" if info.get("max_batches") else "")
        + ", from <code>vitlab evaluate</code> (evaluation/evaluation.json).</p>"
    ]
    calibrated = results["test_calibrated"]
    rows = [("test", *(results["test"][k] for k in ("top1", "top5", "nll", "ece")))]
    rows.append(
        (f"test, T = {calibrated['temperature']:.3f}", *(calibrated[k] for k in ("top1", "top5", "nll", "ece")))
    )
    if results.get("tta"):
        rows.append(
            (f"TTA, {len(info['tta_views'])} views", *(results["tta"][k] for k in ("top1", "top5", "nll", "ece")))
        )
    parts.append(table_html(["", "top-1", "top-5", "NLL", "ECE"], rows))
    cal = results["calibration"]
    parts.append(
        f"<p>Temperature scaling: T = {esc(fmt(cal['temperature']))} fitted on {esc(cal['n_fit'])} validation images; "
        f"on the other {esc(cal['n_eval'])}, ECE {esc(fmt(cal['ece_before']))} → {esc(fmt(cal['ece_after']))}, "
        f"NLL {esc(fmt(cal['nll_before']))} → {esc(fmt(cal['nll_after']))}.</p>"
    )
    figures = []
    reliability = run.png(Path("evaluation") / results.get("files", {}).get("reliability", "reliability.png"))
    if reliability:
        figures.append(figure_html(reliability, "Reliability diagram of the test set, before and after scaling."))
    if results.get("per_class"):
        figures.append(figure_html(figure_uri(per_class_figure(results["per_class"])), "Per-class test accuracy."))
    parts.append(f'<div class="grid2">{"".join(figures)}</div>')
    corruptions = results.get("corruptions") or {}
    if corruptions:
        severities = [str(s) for s in info["severities"]]
        rows = [(name, *(e["by_severity"][s] for s in severities), e["mean"]) for name, e in corruptions.items()]
        rows.append(("mean over corrupted", *[None] * len(severities), results["mean_corrupted"]))
        rows.append(("clean", *[None] * len(severities), results["test"]["top1"]))
        parts.append("<h3>Corruptions (top-1 by severity)</h3>")
        parts.append(table_html(["corruption", *severities, "mean"], rows))
    return Section("evaluation", "Evaluation", "".join(parts))


def generate_section(run: RunRecord) -> Section | None:
    from vitlab.evaluation.generative import GRID_FILES

    wide, narrow = [], []
    for task, file in GRID_FILES.items():
        uri = run.png(Path("generate") / file)
        if uri:
            (wide if task == "reconstruction" else narrow).append(figure_html(uri, GRID_CAPTIONS.get(task, task)))
    if not wide and not narrow and not run.generate_metrics:
        return None
    body = metrics_html(run.generate_metrics) if run.generate_metrics else ""
    body += "".join(wide) + f'<div class="grid2">{"".join(narrow)}</div>'
    return Section("generate", "Generative tasks", body)


def dynamics_section(run: RunRecord) -> Section | None:
    """``dynamics.jsonl``: the figures of ``dynamics/`` (drawn here when the run has none) and the final head table."""
    from vitlab.diagnostics.plots import draw_run, head_table, read_dynamics

    if not (run.path / DYNAMICS_FILE).exists():
        return None
    run.use(DYNAMICS_FILE)
    records = read_dynamics(run.path / DYNAMICS_FILE)
    known = ["dynamics.png", "temperature.png", "frozen.png", "comparison.png"]
    plots_dir = run.path / DYNAMICS_DIR
    files = sorted(plots_dir.glob("*.png"), key=lambda p: (known.index(p.name) if p.name in known else 99, p.name))
    uris = [(p.name, run.png(p.relative_to(run.path))) for p in files]
    if not uris:
        with tempfile.TemporaryDirectory() as tmp:
            uris = [(p.name, png_uri(p.read_bytes())) for p in draw_run(run.path / DYNAMICS_FILE, tmp)]
    captions = {
        "dynamics.png": "Drift d of each head's CLS attention between epochs (top) and consensus clusters (bottom).",
        "temperature.png": "Temperature tau of every head over the epochs.",
        "frozen.png": "Epoch at which each head was frozen.",
        "comparison.png": "Baseline (left) and this run (right).",
    }
    final = records[-1]
    heads = int(np.size(final["frozen"]))
    body = (
        f"<p>Mode <code>{esc(final['mode'])}</code>, {esc(len(records))} records (epoch 0 = before training). At the "
        f"last epoch: {esc(final['non_converged'])}/{heads} heads not converged, "
        f"{esc(int(np.sum(final['frozen'])))}/{heads} frozen.</p>"
    )
    wide, small = [], []
    for name, uri in uris:
        (wide if name in ("dynamics.png", "comparison.png") else small).append(
            figure_html(uri, captions.get(name, name))
        )
    body += "".join(wide) + f'<div class="grid2">{"".join(small)}</div>'
    rows = [
        (r["layer"], r["head"], r["d"], r["kappa"], r["tau"], r["converged"], r["frozen_at"])
        for r in head_table(records)
    ]
    table = table_html(["layer", "head", "drift d", "clusters κ", "tau", "converged", "frozen at epoch"], rows)
    body += details_html("Heads at the last epoch", table)
    return Section("dynamics", "Attention dynamics", body)


def other_outputs_section(run: RunRecord) -> Section | None:
    """PNG and JSON files of the run directory that no other section showed (probe outputs, for instance)."""
    found = []
    for root, dirs, files in os.walk(run.path):
        folder = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (folder == run.path and d in SKIPPED_DIRS))
        found += [folder / f for f in sorted(files) if f.endswith((".png", ".json")) and not f.startswith(".")]
    found = [f for f in found if f.resolve() not in run.used_files]
    if not found:
        return None
    images, texts = [], []
    for file in found:
        relative = file.relative_to(run.path)
        if file.suffix == ".png":
            uri = run.png(relative)
            if uri:
                images.append(figure_html(uri, str(relative)))
        elif file.stat().st_size <= MAX_JSON_BYTES:
            text = file.read_text(errors="replace")
            with contextlib.suppress(json.JSONDecodeError):  # a file another tool is still writing: shown as it is
                text = json.dumps(json.loads(text), indent=2)
            texts.append(details_html(str(relative), pre_html(text)))
        else:
            texts.append(f"<p><code>{esc(relative)}</code>: {esc(file.stat().st_size // 1024)} KB, not shown.</p>")
    if not images and not texts:
        return None
    body = f'<div class="grid2">{"".join(images)}</div>' + "".join(texts)
    return Section("other", "Other outputs", body)


# -------------------------------------------------------------------------------------------------------------------
# Comparison of runs
# -------------------------------------------------------------------------------------------------------------------
#: final metrics left out of the comparison table (per-severity corruption numbers, the validation halves)
DETAIL_METRICS = ("eval/corruptions/", "eval/calibration/")


def summary_metrics(run: RunRecord) -> dict[str, float]:
    """The run's final metrics (:meth:`vitlab.rundir.RunDir.final_metrics`) without :data:`DETAIL_METRICS`."""
    return {k: v for k, v in run.final_metrics.items() if not k.startswith(DETAIL_METRICS)}


def better_direction(metric: str) -> str | None:
    """``"max"`` or ``"min"`` for metrics whose best value is known from their last name part, else None."""
    leaf = metric.rsplit("/", 1)[-1]
    if leaf.endswith(HIGHER_IS_BETTER):
        return "max"
    if leaf.endswith(LOWER_IS_BETTER):
        return "min"
    return None


def _flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(values, Mapping):
        out: dict[str, Any] = {}
        for key, value in values.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): values}


def config_differences(configs: Sequence[RunConfig]) -> dict[str, list[Any]]:
    """Dotted config keys whose values are not the same in every run: ``{key: [value per run]}``."""
    flat = [_flatten(to_dict(c)) for c in configs]
    keys = sorted(set().union(*flat))
    return {k: [f.get(k) for f in flat] for k in keys if len({json.dumps(f.get(k), default=str) for f in flat}) > 1}


def comparison_sections(runs: Sequence[RunRecord]) -> list[Section]:
    names = [run.name for run in runs]
    overview = table_html(
        ["run", "model", "dataset", "epochs", "seed", "directory"],
        [(r.name, r.model_name, r.config.data.name, len(r.metrics), r.config.run.seed, str(r.path)) for r in runs],
    )
    sections = [Section("runs", "Runs", overview)]
    metrics = [summary_metrics(r) for r in runs]
    keys = list(dict.fromkeys(k for m in metrics for k in m))
    if keys:
        rows, bold = [], []
        for row_index, key in enumerate(keys):
            values = [m.get(key) for m in metrics]
            rows.append((key, *values))
            direction = better_direction(key)
            present = [v for v in values if v is not None]
            if direction and len(present) > 1:
                best = max(present) if direction == "max" else min(present)
                bold += [(row_index, 1 + i) for i, v in enumerate(values) if v == best]
        note = "<p>Best value in bold where the direction is known (accuracy, PSNR, SSIM up; loss, NLL, ECE down).</p>"
        sections.append(Section("metrics", "Final metrics", note + table_html(["metric", *names], rows, bold)))
    differences = config_differences([r.config for r in runs])
    if differences:
        rows = [
            (key, *(json.dumps(v) if isinstance(v, list | dict) else v for v in values))
            for key, values in differences.items()
        ]
        sections.append(Section("config-diff", "Config differences", table_html(["key", *names], rows)))
    curves = [(r.name, curve_panels(r.metrics)) for r in runs if r.metrics]
    if curves:
        sections.append(Section("curves", "Training curves", figure_html(figure_uri(comparison_curves_figure(curves)))))
    dynamics = [r for r in runs if (r.path / "dynamics.jsonl").exists()]
    if len(dynamics) == 2:
        from vitlab.diagnostics.plots import plot_comparison, read_dynamics

        with tempfile.TemporaryDirectory() as tmp:
            path = plot_comparison(
                read_dynamics(dynamics[0].path),
                read_dynamics(dynamics[1].path),
                Path(tmp) / "comparison.png",
                labels=(dynamics[0].name, dynamics[1].name),
            )
            uri = png_uri(path.read_bytes())
        sections.append(
            Section("dynamics", "Attention dynamics", figure_html(uri, "The two runs' heads side by side."))
        )
    reliability = [(r.name, r.png("evaluation/reliability.png")) for r in runs if r.evaluation]
    reliability = [(name, uri) for name, uri in reliability if uri]
    if reliability:
        figures = "".join(figure_html(uri, name) for name, uri in reliability)
        sections.append(Section("calibration", "Reliability diagrams", f'<div class="grid2">{figures}</div>'))
    return sections


# -------------------------------------------------------------------------------------------------------------------
# The page
# -------------------------------------------------------------------------------------------------------------------
CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--panel:#f6f8fa;--accent:#0969da}
*{box-sizing:border-box}
body{margin:0;color:var(--fg);background:#fff;
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
.wrap{max-width:1180px;margin:0 auto;padding:0 24px}
header.top{background:#1f2937;color:#f9fafb;padding:18px 0 16px}
header.top h1{margin:0;font-size:24px;font-weight:600;word-break:break-all}
header.top .sub{color:#cbd5e1;font-size:14px;margin-top:2px}
nav{position:sticky;top:0;z-index:2;background:rgba(255,255,255,.96);border-bottom:1px solid var(--line)}
nav .wrap{display:flex;flex-wrap:wrap;gap:4px 18px;padding-top:8px;padding-bottom:8px}
nav a{color:var(--accent);text-decoration:none;font-size:14px}
nav a:hover{text-decoration:underline}
main{padding-bottom:48px}
section{padding-top:12px;margin-top:18px;scroll-margin-top:48px}
h2{font-size:20px;font-weight:600;margin:0 0 10px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h3{font-size:16px;margin:18px 0 8px}
p{margin:8px 0;max-width:900px}
code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--panel);
padding:1px 4px;border-radius:4px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px;margin:16px 0 4px}
.card{border:1px solid var(--line);border-radius:8px;padding:8px 12px;background:var(--panel)}
.card .label{font-size:12px;color:var(--muted)}
.card .value{font-size:19px;font-weight:600;overflow-wrap:anywhere}
.scroll{overflow-x:auto;margin:8px 0}
table{border-collapse:collapse;font-size:14px;font-variant-numeric:tabular-nums}
th,td{padding:4px 12px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{background:var(--panel);font-weight:600}
th:first-child,td:first-child{text-align:left}
tbody tr:hover{background:#f0f6ff}
figure{margin:12px 0}
figure img{display:block;max-width:100%;height:auto;border:1px solid var(--line);border-radius:6px;background:#fff}
figcaption{color:var(--muted);font-size:13px;margin-top:4px}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:8px 20px;align-items:start}
details{border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:10px 0}
summary{cursor:pointer;font-weight:600}
pre{overflow:auto;max-height:480px;background:var(--panel);padding:10px 12px;border-radius:6px;
font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
footer{color:var(--muted);font-size:12px;border-top:1px solid var(--line);padding:12px 0 24px}
.kv{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:0 28px;margin:10px 0 14px}
.kv-item{display:flex;justify-content:space-between;gap:12px;padding:4px 2px;border-bottom:1px solid var(--line);
font-size:14px;font-variant-numeric:tabular-nums}
.kv-item span{color:var(--muted);overflow-wrap:anywhere}
.kv.facts{grid-template-columns:1fr}
.kv.facts .kv-item{justify-content:flex-start}
.kv.facts .kv-item span{flex:0 0 130px}
.kv.facts .kv-item b{font-weight:400;overflow-wrap:anywhere}
"""


def page_html(title: str, subtitle: str, sections: Sequence[Section], intro: str = "") -> str:
    """The whole document: heading, a link bar to the sections, the sections, inline CSS."""
    links = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f'<header class="top"><div class="wrap"><h1>{esc(title)}</h1>'
        f'<div class="sub">{esc(subtitle)}</div></div></header>'
        f'<nav><div class="wrap">{links}</div></nav>'
        f'<main class="wrap">{intro}{"".join(s.html() for s in sections)}</main>'
        f'<footer><div class="wrap">vitlab {esc(__version__)} report</div></footer></body></html>\n'
    )


def run_report_html(run: RunRecord, attention_images: int = ATTENTION_IMAGES) -> str:
    """The page of one run."""
    probe = load_image_probe(run, attention_images)
    candidates = [
        config_section(run),
        curves_section(run),
        test_metrics_section(run),
        evaluation_section(run),
        generate_section(run),
        dynamics_section(run),
        attention_section(probe) if probe else None,
        segments_section(run, probe),
        other_outputs_section(run),  # last: it shows what the sections above did not
    ]
    sections = [section for section in candidates if section is not None]
    env = run.env or {}
    revision = (env.get("git") or {}).get("revision")
    dirty = " with uncommitted changes" if (env.get("git") or {}).get("dirty") else ""
    git = f"git {revision[:7]}{dirty}" if revision else ""
    facts = (run.model_name, run.config.data.name, env.get("time", ""), git, str(run.path))
    subtitle = " · ".join(fact for fact in facts if fact)
    return page_html(run.name, subtitle, sections, run_summary(run, probe.model if probe else None))


def comparison_report_html(runs: Sequence[RunRecord]) -> str:
    """The page comparing several runs."""
    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # same folder name under different parents: name them by their parents too
        for run in runs:
            run.name = f"{run.path.resolve().parent.name}/{run.path.resolve().name}"
    return page_html(f"Comparison of {len(runs)} runs", ", ".join(r.name for r in runs), comparison_sections(runs))


def write_report(
    run_dirs: Sequence[str | Path], out: str | Path | None = None, *, attention_images: int = ATTENTION_IMAGES
) -> Path:
    """Write the HTML report of one run (default ``<run>/report.html``) or the comparison of several (default
    ``./report.html``); ``out`` names another file. ``attention_images``: test images whose attention maps (and
    CET-ViT segment maps) are computed, 0 for none. Returns the written path.
    """
    if not run_dirs:
        raise ConfigError("a report needs at least one run directory (the folder `vitlab fit` printed)")
    if attention_images < 0:
        raise ConfigError(f"attention_images must be >= 0 (0 leaves the attention maps out), got {attention_images}")
    runs = [RunRecord.load(d) for d in run_dirs]
    if len(runs) == 1:
        document = run_report_html(runs[0], attention_images)
        default = runs[0].path / REPORT_FILE
    else:
        document = comparison_report_html(runs)
        default = Path.cwd() / REPORT_FILE
    path = Path(out) if out is not None else default
    if path.is_dir():
        path = path / REPORT_FILE
    atomic_write_text(path, document)
    return path

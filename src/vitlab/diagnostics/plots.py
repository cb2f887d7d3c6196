"""Figures of the attention dynamics recorded in a run's ``dynamics.jsonl`` (ViTCAE, Figures 9 and 10).

- :func:`plot_dynamics`: per-head drift curves over epochs (top row) and consensus-cluster counts (bottom row), one
  panel per layer and one line per head; a head's freezing epoch is marked on its drift curve.
- :func:`plot_comparison`: the same figure for two runs side by side, on shared axes (uncontrolled | controlled).
- :func:`plot_temperature`: tau of every head over epochs as a heatmap; a red line runs along a frozen head's row.
- :func:`plot_frozen_epochs`: the epoch at which each head was frozen, as a layer x head map.
- :func:`plot_drift_vs_lr`: mean drift per epoch against the learning rate the epoch trained with, one line per run
  (e.g. both arms of Table I): the confound of the drift, which falls when the rate falls.

All drawing uses matplotlib's Agg backend, so it runs without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure, SubFigure

from vitlab.errors import RunFileError
from vitlab.rundir import DYNAMICS_FILE, read_jsonl, save_figure

_MAX_PANELS_PER_ROW = 6
_KAPPA_FLOOR = 0.9  # kappa >= 1 (the all-ones eigenvector); a little room below keeps the kappa = 1 lines visible


def read_dynamics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``dynamics.jsonl`` (a run directory or the file), one per epoch, in epoch order.

    A resumed run may write an epoch twice; the later line wins.
    """
    path = Path(path)
    if not path.exists():
        raise RunFileError(f"{path} does not exist; pass a run directory (the folder `vitlab fit` printed)")
    if path.is_dir():
        path = path / DYNAMICS_FILE
    if not path.exists():
        raise RunFileError(
            f"{path} does not exist: the run was trained without the dynamics controller (set a 'dynamics' section, "
            "e.g. dynamics.mode=schedule)"
        )
    records = read_jsonl(path, "epoch")
    if not records:
        raise RunFileError(f"{path} holds no records yet: the run has not finished an epoch with the controller")
    return records


def dynamics_arrays(records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Stack records into arrays over ``T`` epochs, ``L`` layers, ``H`` heads: ``epochs [T]``, ``drift [T, L, H]``
    (NaN at epoch 0, which has no previous epoch), ``kappa``, ``tau`` ``[T, L, H]``, ``converged``, ``frozen``
    ``[T, L, H]`` bool, ``threshold [T, L, H]`` (NaN where the rule has none yet)."""
    shape = np.shape(records[0]["tau"])
    nan = np.full(shape, np.nan)
    return {
        "epochs": np.array([r["epoch"] for r in records]),
        "drift": np.stack([nan if r["drift"] is None else np.asarray(r["drift"], float) for r in records]),
        "kappa": np.stack([np.asarray(r["kappa"], float) for r in records]),
        "tau": np.stack([np.asarray(r["tau"], float) for r in records]),
        "converged": np.stack([np.asarray(r["converged"], bool) for r in records]),
        "frozen": np.stack([np.asarray(r["frozen"], bool) for r in records]),
        # the decision's threshold (decay / relative / absolute rules), NaN where a record has none
        "threshold": np.stack([np.array(r.get("threshold") or nan, dtype=float) for r in records]),
    }


def frozen_at_epoch(records: list[dict[str, Any]]) -> np.ndarray:
    """``[L, H]`` float: the first epoch at which each head is frozen, NaN for heads never frozen."""
    arrays = dynamics_arrays(records)
    frozen = arrays["frozen"]
    first = np.where(frozen.any(0), arrays["epochs"][frozen.argmax(0)], np.nan)
    return first.astype(float)


#: the record key of each rule's level (the statistic held against ``threshold``) and its unit, in words
_LEVELS = {"decay": ("decay_level", "drift"), "response": ("response_level", "drift per unit rate")}


def decision(records: list[dict[str, Any]], layer: int, head: int, frozen_at: int | None) -> str | None:
    """Why a head is or is not converged under the decay or response rule, from its records: the largest of its last
    drifts (per unit rate under ``response``) against the threshold (the ratio times its earlier median), and under
    ``response`` the directedness against ``rho`` and its scores against theirs, at the epoch it converged, or at the
    last epoch ("stable, not yet ..." where every clause holds but not yet ``patience`` epochs in a row). ``None``
    for the other rules."""
    at = next((r for r in records if r["converged"][layer][head]), records[-1])
    key, unit = _LEVELS.get(at.get("convergence"), (None, None))
    level, threshold = at.get(key), at.get("threshold")
    if key is None or level is None or threshold is None:
        return None
    level, threshold = level[layer][head], threshold[layer][head]
    if level is None or threshold is None:
        return "too few epochs to judge"
    directed, walk, passes = at.get("directedness"), "", level < threshold
    if at.get("rho") is not None and directed is not None:
        below = directed[layer][head] < at["rho"]
        walk, passes = (
            f", directedness {directed[layer][head]:.2f} {'<' if below else '>='} rho {at['rho']:.2f}",
            passes and below,
        )
    if key == "response_level" and at.get("score_level") and at.get("score_threshold"):  # the score clause
        score, limit = at["score_level"][layer][head], at["score_threshold"][layer][head]
        if score is not None and limit is not None:
            walk += f", scores per unit rate {score:.3g} {'<' if score < limit else '>='} {limit:.3g}"
            passes = passes and score < limit
    if at["converged"][layer][head]:
        what = "frozen" if frozen_at is not None else "converged"
        return f"{what} at epoch {at['epoch']}: recent {unit} <= {level:.3g} < threshold {threshold:.3g}{walk}"
    state = "stable, not yet for patience epochs in a row" if passes else "not settled"  # every clause holds, or not
    return f"{state}: a recent {unit} {level:.3g} {'<' if passes else 'vs'} threshold {threshold:.3g}{walk}"


def head_table(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per head of the final epoch: layer, head, d, d_per_rate, s_per_rate (the score drift per unit rate)
    and rate (None in records written before the response rule or its score clause), kappa, tau, converged,
    frozen_at (epoch or None) and, under the decay and response rules, the decision's reason (:func:`decision`)."""
    final = records[-1]
    frozen_at = frozen_at_epoch(records)
    rows = []
    for layer, taus in enumerate(final["tau"]):
        for head, tau in enumerate(taus):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "d": None if final["drift"] is None else final["drift"][layer][head],
                    # the response rule's view: the drift per unit of the epoch's mean learning rate, and that rate
                    "d_per_rate": None if final.get("drift_per_rate") is None else final["drift_per_rate"][layer][head],
                    "s_per_rate": None if final.get("score_per_rate") is None else final["score_per_rate"][layer][head],
                    "rate": final.get("rate"),
                    "kappa": final["kappa"][layer][head],
                    "tau": tau,
                    "converged": final["converged"][layer][head],
                    "frozen_at": None if np.isnan(frozen_at[layer, head]) else int(frozen_at[layer, head]),
                    "decision": decision(
                        records, layer, head, None if np.isnan(frozen_at[layer, head]) else frozen_at[layer, head]
                    ),
                }
            )
    return rows


# -------------------------------------------------------------------------------------------------------------------
def _layer_label(records: list[dict[str, Any]], layer: int) -> str:
    modules = records[0].get("modules") or []
    name = modules[layer] if layer < len(modules) else f"layer {layer}"
    return f"layer {layer}" + (f"\n{name}" if name != f"layer {layer}" else "")


def _draw_dynamics(
    canvas: Figure | SubFigure,
    records: list[dict[str, Any]],
    drift_limits: tuple[float, float],
    kappa_limits: tuple[float, float],
    max_columns: int,
) -> None:
    """Fig. 9/10 layout on ``canvas``: bands of (drift row, cluster row), at most ``max_columns`` layers per band."""
    arrays = dynamics_arrays(records)
    epochs, drift, kappa = arrays["epochs"], arrays["drift"], arrays["kappa"]
    frozen_at = frozen_at_epoch(records)
    num_layers, num_heads = drift.shape[1:]
    columns = min(num_layers, max_columns)
    bands = -(-num_layers // columns)
    axes = canvas.subplots(2 * bands, columns, squeeze=False, sharex=True)
    colors = plt.get_cmap("tab10" if num_heads <= 10 else "tab20")(np.arange(num_heads) % 20)
    decay = records[-1].get("convergence") == "decay"
    for layer in range(num_layers):
        band, column = divmod(layer, columns)
        top, bottom = axes[2 * band, column], axes[2 * band + 1, column]
        for head in range(num_heads):
            top.plot(epochs[1:], drift[1:, layer, head], color=colors[head], lw=1.2, label=f"head {head}")
            bottom.plot(epochs, kappa[:, layer, head], color=colors[head], lw=1.2, drawstyle="steps-mid")
            if decay:  # the decision beside the drift: stable when the last drifts stay under this line
                top.plot(epochs, arrays["threshold"][:, layer, head], color=colors[head], lw=0.9, ls=":")
            if not np.isnan(frozen_at[layer, head]):  # a frozen head's drift is ~0: mark it at the top edge
                top.plot(frozen_at[layer, head], 0.96 * drift_limits[1], "v", ms=6, color=colors[head])
        top.set_title(_layer_label(records, layer), fontsize=9)
        top.set_ylim(*drift_limits)
        bottom.set_ylim(*kappa_limits)
        bottom.set_xlabel("epoch")
        for ax in (top, bottom):
            ax.grid(alpha=0.3, lw=0.5)
            ax.tick_params(labelsize=8)
        if column == 0:
            top.set_ylabel(f"drift $d$ (W1, {_units(records)})", fontsize=9)
            bottom.set_ylabel(r"clusters $\kappa$", fontsize=9)
    for index in range(num_layers, bands * columns):  # unused panels of the last band
        band, column = divmod(index, columns)
        axes[2 * band, column].set_visible(False)
        axes[2 * band + 1, column].set_visible(False)
    handles = axes[0, 0].get_legend_handles_labels()[0]
    handles.append(plt.Line2D([], [], ls="", marker="v", color="black", label="frozen at"))
    if decay:
        handles.append(plt.Line2D([], [], ls=":", color="black", label="decay threshold"))
    canvas.legend(handles=handles, loc="outside lower center", ncol=min(num_heads + 1, 8), fontsize=8, frameon=False)


def _units(records: list[dict[str, Any]]) -> str:
    return "image sides" if records[0].get("drift_units") == "image" else "patches"


def _limits(*series: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
    values = np.concatenate([np.ravel(s[np.isfinite(s)]) for s in series])
    top = float(values.max()) if values.size else 1.0
    return floor, top * 1.05 + (1e-6 if top == floor else 0.0)


def _run_title(records: list[dict[str, Any]], label: str | None) -> str:
    final = records[-1]
    frozen = int(np.sum(final["frozen"]))
    heads = int(np.size(final["frozen"]))
    summary = f"mode={final['mode']}, non-converged {final['non_converged']}/{heads}, frozen {frozen}/{heads}"
    return f"{label}: {summary}" if label else summary


def plot_dynamics(records: list[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Figures 9/10 of the paper for one run: drift curves (top) and cluster counts (bottom) per layer."""
    arrays = dynamics_arrays(records)
    num_layers = arrays["drift"].shape[1]
    columns = min(num_layers, _MAX_PANELS_PER_ROW)
    bands = -(-num_layers // columns)
    fig = plt.figure(figsize=(2.6 * columns + 0.8, 3.6 * bands + 0.9), layout="constrained")
    kappa_limits = _limits(arrays["kappa"], floor=_KAPPA_FLOOR)
    _draw_dynamics(fig, records, _limits(arrays["drift"]), kappa_limits, max_columns=_MAX_PANELS_PER_ROW)
    fig.suptitle(_run_title(records, title), fontsize=11)
    return _save(fig, path)


def plot_comparison(
    baseline: list[dict[str, Any]],
    controlled: list[dict[str, Any]],
    path: str | Path,
    labels: tuple[str, str] = ("uncontrolled", "controlled"),
) -> Path:
    """Two runs side by side (baseline left) on shared axes: the paper's Figure 9 beside its Figure 10."""
    left, right = dynamics_arrays(baseline), dynamics_arrays(controlled)
    num_layers = max(left["drift"].shape[1], right["drift"].shape[1])
    columns = min(num_layers, _MAX_PANELS_PER_ROW // 2)
    bands = -(-num_layers // columns)
    fig = plt.figure(figsize=(2 * (2.5 * columns + 0.6), 3.6 * bands + 1.1), layout="constrained")
    drift_limits = _limits(left["drift"], right["drift"])
    kappa_limits = _limits(left["kappa"], right["kappa"], floor=_KAPPA_FLOOR)
    for canvas, records, label in zip(fig.subfigures(1, 2, wspace=0.04), (baseline, controlled), labels, strict=True):
        _draw_dynamics(canvas, records, drift_limits, kappa_limits, max_columns=columns)
        canvas.suptitle(_run_title(records, label), fontsize=10)
    return _save(fig, path)


def plot_temperature(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Heatmap of tau for every head (rows ``l.h``) over epochs (columns); frozen stretches drawn as red lines."""
    arrays = dynamics_arrays(records)
    epochs, tau, frozen = arrays["epochs"], arrays["tau"], arrays["frozen"]
    num_epochs, num_layers, num_heads = tau.shape
    rows = tau.reshape(num_epochs, -1).T  # [L*H, T]
    fig, ax = plt.subplots(figsize=(min(2 + 0.25 * num_epochs, 16), 1 + 0.22 * rows.shape[0]), layout="constrained")
    image = ax.imshow(
        rows,
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(epochs[0] - 0.5, epochs[-1] + 0.5, rows.shape[0] - 0.5, -0.5),
    )
    for row, frozen_row in enumerate(frozen.reshape(num_epochs, -1).T):
        if frozen_row.any():
            ax.plot([epochs[frozen_row.argmax()] - 0.5, epochs[-1] + 0.5], [row, row], color="red", lw=1.5)
    ax.set_yticks(range(rows.shape[0]), [f"{layer}.{head}" for layer in range(num_layers) for head in range(num_heads)])
    ax.tick_params(axis="y", labelsize=7)
    for boundary in range(1, num_layers):
        ax.axhline(boundary * num_heads - 0.5, color="black", lw=0.6)
    ax.set_xlabel("epoch")
    ax.set_ylabel("layer.head")
    ax.set_title(r"temperature $\tau$ per head (red line: frozen)", fontsize=10)
    fig.colorbar(image, ax=ax, label=r"$\tau$")
    return _save(fig, path)


def plot_frozen_epochs(records: list[dict[str, Any]], path: str | Path) -> Path:
    """The epoch at which each head was frozen, as a layer x head map (grey: never frozen)."""
    first = frozen_at_epoch(records)
    num_layers, num_heads = first.shape
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * num_heads, 1.0 + 0.45 * num_layers), layout="constrained")
    cmap = plt.get_cmap("magma_r").with_extremes(bad="0.85")
    last = float(records[-1]["epoch"])
    image = ax.imshow(np.ma.masked_invalid(first), cmap=cmap, vmin=0, vmax=max(last, 1.0), aspect="auto")
    for layer in range(num_layers):
        for head in range(num_heads):
            value = first[layer, head]
            text, color = ("-", "black") if np.isnan(value) else (str(int(value)), "white" if value > last / 2 else "k")
            ax.text(head, layer, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(num_heads))
    ax.set_yticks(range(num_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    frozen = int(np.isfinite(first).sum())
    ax.set_title(f"epoch frozen ({frozen}/{first.size} heads)", fontsize=10)
    fig.colorbar(image, ax=ax, label="epoch")
    return _save(fig, path)


def has_learning_rate(records: list[dict[str, Any]]) -> bool:
    """Whether every record names the learning rate its epoch trained with (runs since ``lr`` was recorded)."""
    return all(r.get("lr") is not None for r in records)


def plot_drift_vs_lr(runs: dict[str, list[dict[str, Any]]], path: str | Path) -> Path:
    """Mean drift of the heads that were not frozen before the epoch (top: against the learning rate of the epoch,
    log axes; bottom: both over epochs), one colour per run. ``runs``: label -> records with ``lr`` (see
    :func:`has_learning_rate`); e.g. ``{"uncontrolled": ..., "controlled": ...}``."""
    if not runs:
        raise ValueError("plot_drift_vs_lr needs at least one run")
    missing = [label for label, records in runs.items() if not has_learning_rate(records)]
    if missing:
        raise RunFileError(f"{missing} recorded no learning rate in dynamics.jsonl (runs made before 'lr' was logged)")
    fig, (scatter, curves) = plt.subplots(2, 1, figsize=(6.4, 7.2), layout="constrained")
    rate_axis = curves.twinx()
    colors = plt.get_cmap("tab10")(np.arange(len(runs)) % 10)
    for color, (label, records) in zip(colors, runs.items(), strict=True):
        arrays = dynamics_arrays(records)
        epochs, drift, frozen = arrays["epochs"][1:], arrays["drift"][1:], arrays["frozen"][:-1]
        active = np.where(frozen, np.nan, drift)  # heads frozen before the epoch no longer learn
        mean = np.array([np.nanmean(a) if np.isfinite(a).any() else np.nan for a in active])
        rates = np.array([r["lr"] for r in records[1:]], dtype=float)
        scatter.plot(rates, mean, "o-", color=color, ms=3, lw=0.8, alpha=0.8, label=label)
        curves.plot(epochs, mean, color=color, lw=1.2, label=f"{label}: drift")
        rate_axis.plot(epochs, rates, color=color, lw=1.0, ls="--", label=f"{label}: lr")
    scatter.set_xscale("log")
    scatter.set_yscale("log")
    scatter.set_xlabel("learning rate of the epoch")
    scatter.set_ylabel(f"mean drift of unfrozen heads ({_units(next(iter(runs.values())))})")
    scatter.legend(fontsize=8, frameon=False)
    scatter.grid(alpha=0.3, lw=0.5, which="both")
    curves.set_yscale("log")
    curves.set_xlabel("epoch")
    curves.set_ylabel("mean drift (solid)")
    rate_axis.set_yscale("log")
    rate_axis.set_ylabel("learning rate (dashed)")
    curves.grid(alpha=0.3, lw=0.5)
    fig.suptitle("Drift against learning rate", fontsize=11)
    return _save(fig, path)


def _save(fig: Figure, path: str | Path) -> Path:
    path = save_figure(fig, path, dpi=150)
    plt.close(fig)
    return path


def draw_run(source: str | Path, out_dir: str | Path, baseline: str | Path | None = None) -> list[Path]:
    """Every figure of a run (its directory or ``dynamics.jsonl``) into ``out_dir``; with ``baseline`` (another
    run) also the side-by-side comparison, the baseline on the left. Returns the written paths."""
    records = read_dynamics(source)
    out_dir = Path(out_dir)
    paths = [
        plot_dynamics(records, out_dir / "dynamics.png"),
        plot_temperature(records, out_dir / "temperature.png"),
        plot_frozen_epochs(records, out_dir / "frozen.png"),
    ]
    runs = {_run_name(source): records}
    if baseline is not None:
        labels = (_run_name(baseline), _run_name(source))
        baseline_records = read_dynamics(baseline)
        paths.append(plot_comparison(baseline_records, records, out_dir / "comparison.png", labels))
        runs = {labels[0]: baseline_records, labels[1]: records}
    if all(has_learning_rate(r) for r in runs.values()) and len(records) > 1:
        paths.append(plot_drift_vs_lr(runs, out_dir / "drift_vs_lr.png"))
    return paths


def _run_name(source: str | Path) -> str:
    path = Path(source).resolve()
    return path.name if path.is_dir() else path.parent.name

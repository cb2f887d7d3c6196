"""Collect a report: run directories in, plain data out (what the tests assert on).

A :class:`Page` is a title, a subtitle, a row of key facts (cards) and :class:`Section`\\ s; a section is a list of
blocks (:class:`Text`, :class:`Facts`, :class:`Table`, :class:`Figures`, :class:`Details`). A figure is either a
PNG the run already holds (its bytes) or a :class:`Plot`: the name of a drawing in :mod:`vitlab.report.figures`
and the plain data it draws. Nothing here draws or writes markup; a model runs only through
:mod:`vitlab.diagnostics.images`.

A run's page shows what its directory holds, each section only when the run has it (the sections: docs/report.md,
"What a run's page shows"); a comparison page (:mod:`vitlab.report.comparison`) puts several runs side by side.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError, VitlabError
from vitlab.report.comparison import collect_comparison
from vitlab.report.curves import add_step_series, curve_panels
from vitlab.report.page import (
    ATTENTION_IMAGES,
    DYNAMICS_CAPTIONS,
    MAX_JSON_BYTES,
    SKIPPED_DIRS,
    Details,
    Facts,
    Figure,
    Figures,
    Heading,
    Page,
    Plot,
    Pre,
    Section,
    Table,
    Text,
)
from vitlab.report.record import RunRecord
from vitlab.rundir import (
    DYNAMICS_DIR,
    DYNAMICS_FILE,
    EVALUATION_DIR,
    EVALUATION_FILE,
    EXPORT_CONFIG_FILE,
    LAYERS_FILE,
    locate_model,
    read_json,
)


# -------------------------------------------------------------------------------------------------------------------
# Sections of one run
# -------------------------------------------------------------------------------------------------------------------
def run_cards(run: RunRecord, parameters: int | None) -> list[tuple[str, Any]]:
    """The page heading's key facts."""
    cards: list[tuple[str, Any]] = [
        ("model", run.model_name),
        ("dataset", run.config.data.name),
        ("epochs", len(run.metrics) or None),
    ]
    if parameters is not None:
        cards.append(("parameters", f"{parameters / 1e6:.3g} M"))
    for key in ("test/acc", "test/loss"):
        if run.test_metrics and key in run.test_metrics:
            cards.append((key, run.test_metrics[key]))
    if run.evaluation:
        cards.append(("test ECE", run.evaluation["test"]["ece"]))
    return [(label, value) for label, value in cards if value is not None]


def config_section(run: RunRecord) -> Section:
    blocks: list[Any] = [Details("Resolved config (config.yaml)", [Pre(run.config_text)])]
    if run.env is not None:
        env = run.env
        versions, hardware, git = env.get("versions", {}), env.get("hardware", {}), env.get("git", {})
        rows = [
            ("started", env.get("time")),
            ("command", " ".join(env.get("command", []))),
            ("git revision", f"{git.get('revision') or '?'}{' (uncommitted changes)' if git.get('dirty') else ''}"),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
            ("platform", hardware.get("platform")),
            ("CPUs", hardware.get("cpu_count")),
            ("GPUs", ", ".join(hardware.get("cuda", [])) or "none"),
        ]
        facts = Facts({name: value for name, value in rows if value is not None}, one_column=True)
        blocks.append(Details("Environment (env.json)", [facts, Pre(json.dumps(env, indent=2))]))
    return Section("config", "Config and environment", blocks)


def curves_section(run: RunRecord) -> Section | None:
    panels = add_step_series(curve_panels(run.metrics), run.steps, run.metrics)
    if not panels:
        return None
    note = "Per epoch, from metrics.jsonl: training (solid) and validation (dashed) values of every logged term."
    if run.steps:
        note += " In grey: the training loss and learning rate every trainer.log_every_n_steps steps (steps.jsonl)."
    if "learning rate" not in panels:
        note += " The run logged no learning rate."
    figure = Figure(plot=Plot("curves", {"panels": panels}))
    return Section("curves", "Training curves", [Text(note), Figures([figure])])


def test_metrics_section(run: RunRecord) -> Section | None:
    if not run.test_metrics:
        return None
    return Section(
        "test",
        "Test metrics",
        [Text("The best checkpoint on the test set (test_metrics.json)."), Facts(dict(run.test_metrics))],
    )


def assignment_blocks(assignment: Mapping[str, Any]) -> list[Any]:
    """CET-ViT's per-class reversibility and slot-usage K from ``vitlab evaluate``."""
    corr = assignment.get("correlation")
    text = (
        f"On the test set: mean reversibility {fmt(assignment['reversibility_mean'])}, mean slot-usage K "
        f"{fmt(assignment['slot_usage_k_mean'])}."
    )
    if corr:
        text += (
            f" Reversibility against per-class accuracy over {corr['n']} classes: Pearson r = "
            f"{fmt(corr['pearson_r'])} (p = {fmt(corr['pearson_p'])}, 95% CI "
            f"[{fmt(corr['pearson_ci_low'])}, {fmt(corr['pearson_ci_high'])}]), Spearman rho = "
            f"{fmt(corr['spearman_rho'])} (p = {fmt(corr['spearman_p'])})."
        )
    elif assignment.get("correlation_skipped"):
        text += f" Correlation with accuracy: {assignment['correlation_skipped']}."
    ranked = sorted((e for e in assignment["per_class"] if e["n"]), key=lambda e: -(e["slot_usage_k"] or 0.0))
    rows = [(e["class"], e["n"], e["slot_usage_k"], e["reversibility"], e["accuracy"]) for e in ranked]
    table = Table(["class", "test images", "slot-usage K", "reversibility", "accuracy"], rows)
    return [Text(text), Details("Per class, ranked by slot-usage K", [table], open=len(rows) <= 10)]


def evaluation_section(run: RunRecord) -> Section | None:
    results = run.evaluation
    if run.stale_evaluation:
        run.use(Path(EVALUATION_DIR) / "reliability.png")
        note = f"{EVALUATION_DIR}/{EVALUATION_FILE} was made from an earlier model of this run (during the fit or "
        return Section("evaluation", "Evaluation", [Text(note + "before a --resume); run `vitlab evaluate` again.")])
    if not results:
        return None
    info = results["run"]
    first = f" (first {info['max_batches']} batches)" if info.get("max_batches") else ""
    blocks: list[Any] = [
        Text(
            f"{info['n_test']} test images of {info['dataset']}{first}, from vitlab evaluate "
            f"({EVALUATION_DIR}/{EVALUATION_FILE})."
        )
    ]
    keys = ("top1", "top5", "nll", "ece")
    calibrated = results["test_calibrated"]
    rows = [("test", *(results["test"][k] for k in keys))]
    rows.append((f"test, T = {calibrated['temperature']:.3f}", *(calibrated[k] for k in keys)))
    if results.get("tta"):
        rows.append((f"TTA, {len(info['tta_views'])} views", *(results["tta"][k] for k in keys)))
    blocks.append(Table(["", "top-1", "top-5", "NLL", "ECE"], rows))
    cal = results["calibration"]
    blocks.append(
        Text(
            f"Temperature scaling: T = {fmt(cal['temperature'])} fitted on {cal['n_fit']} validation images; on the "
            f"other {cal['n_eval']}, ECE {fmt(cal['ece_before'])} → {fmt(cal['ece_after'])}, "
            f"NLL {fmt(cal['nll_before'])} → {fmt(cal['nll_after'])}."
        )
    )
    figures = []
    reliability = run.png(Path(EVALUATION_DIR) / results.get("files", {}).get("reliability", "reliability.png"))
    if reliability:
        caption = "Reliability diagram of the test set, before and after scaling."
        figures.append(Figure(caption, png=reliability, wide=False))
    if results.get("per_class"):
        plot = Plot("per_class", {"per_class": results["per_class"]})
        figures.append(Figure("Per-class test accuracy.", plot=plot, wide=False))
    blocks.append(Figures(figures))
    corruptions = results.get("corruptions") or {}
    if corruptions:
        severities = [str(s) for s in info["severities"]]
        rows = [(name, *(e["by_severity"][s] for s in severities), e["mean"]) for name, e in corruptions.items()]
        rows.append(("mean over corrupted", *[None] * len(severities), results["mean_corrupted"]))
        rows.append(("clean", *[None] * len(severities), results["test"]["top1"]))
        blocks += [Heading("Corruptions (top-1 by severity)"), Table(["corruption", *severities, "mean"], rows)]
    return Section("evaluation", "Evaluation", blocks)


def dynamics_section(run: RunRecord) -> Section | None:
    """``dynamics.jsonl``: the figures of ``dynamics/`` (drawn when the run has none) and the final head table."""
    from vitlab.diagnostics.plots import head_table, read_dynamics

    if not (run.path / DYNAMICS_FILE).exists():
        return None
    run.use(DYNAMICS_FILE)
    records = read_dynamics(run.path / DYNAMICS_FILE)
    known = list(DYNAMICS_CAPTIONS)
    files = sorted(
        (run.path / DYNAMICS_DIR).glob("*.png"), key=lambda p: (known.index(p.name) if p.name in known else 99, p.name)
    )
    figures = []
    for file in files:
        png = run.png(file.relative_to(run.path))
        if png:
            wide = file.name in ("dynamics.png", "comparison.png")
            figures.append(Figure(DYNAMICS_CAPTIONS.get(file.name, file.name), png=png, wide=wide))
    if not figures:  # drawn from the records, as the controller would have
        plot = Plot("dynamics_run", {"path": str(run.path / DYNAMICS_FILE)})
        figures.append(Figure(plot=plot))
    final = records[-1]
    heads = sum(len(layer) for layer in final["frozen"])
    frozen = sum(bool(head) for layer in final["frozen"] for head in layer)
    text = (
        f"Mode {final['mode']}, {len(records)} records (epoch 0 = before training). At the last epoch: "
        f"{final['non_converged']}/{heads} heads not converged, {frozen}/{heads} frozen."
    )
    keys = ("layer", "head", "d", "d_per_rate", "s_per_rate", "rate", "kappa", "tau", "converged", "frozen_at")
    rows = [(*(r[k] for k in keys), r["decision"] or "") for r in head_table(records)]
    columns = ["layer", "head", "drift d", "d per unit lr", "scores per unit lr", "mean lr", "clusters κ", "tau"]
    table = Table([*columns, "converged", "frozen at epoch", "why"], rows)
    return Section(
        "dynamics", "Attention dynamics", [Text(text), Figures(figures), Details("Heads at the last epoch", [table])]
    )


def frozen_layers_section(run: RunRecord) -> Section | None:
    """``layers.jsonl`` (``dynamics.freeze: layers``): the epoch each encoder block froze at and the saving."""
    from vitlab.diagnostics.frozen_layers import layer_summary

    summary = layer_summary(run.path)
    if summary is None:
        return None
    run.use(LAYERS_FILE)
    text = (
        f"Signal {summary['signal']}: {summary['frozen_layers']}/{summary['blocks']} encoder blocks frozen at the "
        f"last epoch, {100 * summary['frozen_share']:.0f}% of the blocks' FLOPs."
    )
    steps = [(k, round(1e3 * s, 2)) for k, s in summary["step_seconds"].items()]
    blocks = [Text(text), Table(["block", "frozen at epoch"], [(r["block"], r["frozen_at"]) for r in summary["rows"]])]
    if steps:
        blocks.append(Table(["blocks frozen", "ms per training step"], steps))
    return Section("frozen_layers", "Frozen encoder blocks", blocks)


def other_outputs_section(run: RunRecord) -> Section | None:
    """PNG and JSON files of the run directory that no other section showed (probe outputs, for instance)."""
    found = []
    for root, dirs, files in os.walk(run.path):
        folder = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (folder == run.path and d in SKIPPED_DIRS))
        found += [folder / f for f in sorted(files) if f.endswith((".png", ".json")) and not f.startswith(".")]
    found = [f for f in found if f.resolve() not in run.used_files]
    images, texts = [], []
    for file in found:
        relative = file.relative_to(run.path)
        if file.suffix == ".png":
            png = run.png(relative)
            if png:
                images.append(Figure(str(relative), png=png, wide=False))
        elif file.stat().st_size <= MAX_JSON_BYTES:
            text = file.read_text(errors="replace")
            with contextlib.suppress(json.JSONDecodeError):  # a file another tool is still writing: shown as it is
                text = json.dumps(json.loads(text), indent=2)
            texts.append(Details(str(relative), [Pre(text)]))
        else:
            texts.append(Text(f"{relative}: {file.stat().st_size // 1024} KB, not shown."))
    if not images and not texts:
        return None
    return Section("other", "Other outputs", [Figures(images), *texts])


def image_sections(run: RunRecord, count: int) -> tuple[Section | None, list[Any], int | None, Section | None]:
    """The attention section and the segment-map blocks of ``count`` test images, the model's parameter count and
    the explanation section (:mod:`vitlab.report.explanations`). The run's model and data are loaded and run by
    :mod:`vitlab.diagnostics.images` (nothing, with a warning, when either cannot be had)."""
    try:
        source = locate_model(run.path).source
    except VitlabError:
        return None, [], None, None
    if count < 1:
        return None, [], None, None
    from vitlab.diagnostics.images import load_test_images
    from vitlab.export import load_model
    from vitlab.models.sizing import parameter_count

    try:
        model = load_model(source).eval()
        info = read_json(source / EXPORT_CONFIG_FILE).get("data", {}) if source.is_dir() else {}
        images = load_test_images(run.config.data, count, info.get("mean"), info.get("std"))
    except (VitlabError, OSError) as e:
        warnings.warn(f"report: attention and segment maps of {run.path} left out: {e}", stacklevel=2)
        return None, [], None, None
    from vitlab.report.explanations import explanation_section

    attention, blocks = _attention_section(model, images), _segment_blocks(model, images)
    return attention, blocks, parameter_count(model), explanation_section(run, model, images)


def _attention_section(model: Any, images: Any) -> Section | None:
    """The CLS token's attention maps per layer over the test images (None for a model without them)."""
    from vitlab.diagnostics.images import attention_maps

    layer_maps = attention_maps(model, images.inputs)
    if not layer_maps:
        return None
    grid = next(iter(layer_maps.values())).shape[1:]
    caption = (
        f"Attention of the CLS token to each patch, per layer, averaged over the heads, on the {grid[0]}x{grid[1]} "
        "patch grid over the image; each map is scaled to its own minimum and maximum (bright: high)."
    )
    maps = {name: value.numpy() for name, value in layer_maps.items()}
    plot = Plot("attention", {"pixels": images.pixels.numpy(), "labels": images.labels, "layer_maps": maps})
    return Section("attention", "Attention maps", [Text(caption), Figures([Figure(plot=plot)])])


def _segment_blocks(model: Any, images: Any) -> list[Any]:
    """The segment maps of a model with a slot assignment ``S`` (``[]`` without one): each patch in its slot's
    colour."""
    from vitlab.diagnostics.images import slot_assignment

    assignment = slot_assignment(model, images.inputs)
    if assignment is None:
        return []
    text = (
        f"Each patch coloured by the slot it is assigned to most (argmax over the {assignment.S.shape[-1]} slots "
        "of S), with the colours of vitlab probe slot-k; K is the slot-usage K of the image: the slots holding "
        "more than 5% of the assignment mass."
    )
    slot_k = assignment.slot_k if assignment.slot_k is not None else [None] * len(images.labels)
    titles = [label if k is None else f"{label}, K = {int(k)}" for label, k in zip(images.labels, slot_k, strict=True)]
    data = {"pixels": images.pixels, "S": assignment.S, "grid": assignment.grid, "titles": titles}
    return [Text(text), Figures([Figure(plot=Plot("segments", data))])]


def family_sections(run: RunRecord) -> list[Section | None]:
    """The sections the families add (``Family.report_sections``: callables ``run -> Section | None``)."""
    from vitlab.family import families, resolve

    return [resolve(ref)(run) for family in families() for ref in family.report_sections]


def collect_run(run_dir: str | Path | RunRecord, attention_images: int = ATTENTION_IMAGES) -> Page:
    """The page of one run."""
    run = run_dir if isinstance(run_dir, RunRecord) else RunRecord.load(run_dir)
    attention, segment_blocks, parameters, explanations = image_sections(run, attention_images)
    if (run.evaluation or {}).get("assignment"):
        segment_blocks += [Heading("Per class, from vitlab evaluate"), *assignment_blocks(run.evaluation["assignment"])]
    segments = Section("segments", "Token groups and slot-usage K", segment_blocks) if segment_blocks else None
    candidates = [
        config_section(run),
        curves_section(run),
        test_metrics_section(run),
        evaluation_section(run),
        *family_sections(run),
        dynamics_section(run),
        frozen_layers_section(run),
        attention,
        explanations,
        segments,
        other_outputs_section(run),  # last: it shows what the sections above did not
    ]
    env = run.env or {}
    revision = (env.get("git") or {}).get("revision")
    dirty = " with uncommitted changes" if (env.get("git") or {}).get("dirty") else ""
    git = f"git {revision[:7]}{dirty}" if revision else ""
    facts = (run.model_name, run.config.data.name, env.get("time", ""), git, str(run.path))
    subtitle = " · ".join(fact for fact in facts if fact)
    sections = [section for section in candidates if section is not None]
    return Page(run.name, subtitle, sections, run_cards(run, parameters))


def collect(run_dirs: Sequence[str | Path], attention_images: int = ATTENTION_IMAGES) -> Page:
    """The page of one run, or the comparison of several."""
    if not run_dirs:
        raise ConfigError("a report needs at least one run directory (the folder `vitlab fit` printed)")
    if attention_images < 0:
        raise ConfigError(f"attention_images must be >= 0 (0 leaves the attention maps out), got {attention_images}")
    runs = [RunRecord.load(d) for d in run_dirs]
    return collect_run(runs[0], attention_images) if len(runs) == 1 else collect_comparison(runs)


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

"""The run report's explanation section: a few test images with every method that applies side by side, and the
faithfulness table of ``vitlab explain --evaluate`` when the run has one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from vitlab.explain import explain, explainer_for
from vitlab.explain.adapters import OVERVIEW_METHODS, MethodRefused
from vitlab.explain.run import EVALUATION_JSON, EXPLAIN_DIR
from vitlab.report.page import Figure, Figures, Plot, Section, Table, Text
from vitlab.rundir import RunDir, read_json

if TYPE_CHECKING:
    from vitlab.diagnostics.images import TestImages
    from vitlab.report.record import RunRecord


def explanation_section(run: RunRecord, model: nn.Module, images: TestImages) -> Section | None:
    """Maps of the applicable overview methods on ``images`` (each explaining the predicted class)."""
    explainer = explainer_for(model)
    maps: dict[str, Any] = {}
    missing = []
    refused = dict(explainer.refused)
    for method in explainer.applicable(OVERVIEW_METHODS):
        try:
            maps[method] = explain(model, images.inputs, method=method).maps.numpy()
        except ImportError:
            missing.append(method)
        except MethodRefused as e:  # the LRP rules refuse an operation only when they meet it
            refused[method] = str(e).removeprefix(f"{method} does not apply to {explainer.kind}: ")
    caption = (
        "Which pixels the predicted class rests on. Attention, rollout (Abnar & Zuidema 2020) and gradient-weighted "
        "rollout (Chefer et al. 2021) are patch maps (bright: high); LRP (HiLRP: rules by operation type, AttnLRP) and "
        "integrated gradients are signed (red: for the class, blue: against, on a scale symmetric about zero); "
        "Grad-CAM reads the last token grid."
    )
    blocks: list[Any] = [Text(caption)]
    if maps:
        plot = Plot("explanations", {"pixels": images.pixels, "labels": images.labels, "maps": maps})
        blocks.append(Figures([Figure(plot=plot)]))
    notes = [f"{method}: {reason}" for method, reason in refused.items()]
    notes += [f"{method}: not installed (pip install 'vitlab[explain]')" for method in missing]
    if notes:
        blocks.append(Text("Left out. " + " ".join(notes)))
    blocks += faithfulness_blocks(run)
    return Section("explanations", "Explanations", blocks)


def faithfulness_blocks(run: RunRecord) -> list[Any]:
    """The table of ``explain/explain_evaluation.json`` when it was made from the run's model as it is now; a note
    when it was made from an earlier one (during the fit or before a ``--resume``); nothing without one."""
    evaluation = run.path / EXPLAIN_DIR / EVALUATION_JSON
    if not evaluation.is_file():
        return []
    results = read_json(evaluation)
    if not RunDir(run.path).is_current(results.get("run_model")):
        stale = f"{EXPLAIN_DIR}/{EVALUATION_JSON} was made from an earlier model of this run (during the fit or "
        return [Text(stale + "before a --resume) and is not shown; run `vitlab explain RUN --evaluate` again.")]
    run.use(f"{EXPLAIN_DIR}/{EVALUATION_JSON}")
    header = ["method", "deletion AUC", "random", "insertion AUC", "random", "rank corr. randomised", "conservation"]
    rows = []
    for method, r in results["methods"].items():
        s = r["summary"]
        rows.append(
            (
                method,
                s["deletion_auc"],
                s["random_deletion_auc"],
                s["insertion_auc"],
                s["random_insertion_auc"],
                s["randomisation_spearman"],
                s.get("conservation", "-"),
            )
        )
    text = f"vitlab explain --evaluate on {results['images']} test images (patches of {results['patch']} px)."
    return [Text(text), Table(header, rows)]

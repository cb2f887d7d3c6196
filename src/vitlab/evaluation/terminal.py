"""The evaluation suite's results as the terminal table ``vitlab evaluate`` prints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _metric_row(label: str, metrics: Mapping[str, float]) -> str:
    return f"  {label:<24s}" + "".join(f"{metrics[key]:>9.4f}" for key in ("top1", "top5", "nll", "ece"))


def format_evaluation(results: Mapping[str, Any], max_classes: int = 20) -> str:
    """A readable text report of :func:`evaluate_run`'s results (classes beyond ``max_classes``: worst and best 5)."""
    run = results["run"]
    calibration = results["calibration"]
    lines = [
        f"{run['model']} ({run['architecture']}) on {run['dataset']}: {run['n_test']} test images, "
        f"{run['n_val']} validation images",
        f"  {'':<24s}{'top-1':>9s}{'top-5':>9s}{'NLL':>9s}{'ECE':>9s}",
        _metric_row("test", results["test"]),
        _metric_row(f"test, T = {results['test_calibrated']['temperature']:.3f}", results["test_calibrated"]),
    ]
    if results["tta"] is not None:
        lines.append(_metric_row(f"TTA ({len(run['tta_views'])} views)", results["tta"]))
        lines.append(f"  TTA views: {', '.join(run['tta_views'])}")
    lines.append(
        f"calibration (T fitted on {calibration['n_fit']} validation images, evaluated on the other "
        f"{calibration['n_eval']}): ECE {calibration['ece_before']:.4f} -> {calibration['ece_after']:.4f}, "
        f"NLL {calibration['nll_before']:.4f} -> {calibration['nll_after']:.4f}"
    )
    if results["corruptions"]:
        severities = run["severities"]
        lines.append("corruptions, top-1 by severity:")
        lines.append(f"  {'':<18s}" + "".join(f"{s:>8d}" for s in severities) + f"{'mean':>9s}")
        for name, entry in results["corruptions"].items():
            values = "".join(f"{entry['by_severity'][str(s)]:>8.4f}" for s in severities)
            lines.append(f"  {name:<18s}{values}{entry['mean']:>9.4f}")
        lines.append(f"  mean over corrupted: {results['mean_corrupted']:.4f} (clean {results['test']['top1']:.4f})")
    lines.append("per-class accuracy:" + _class_lines(results["per_class"], "accuracy", max_classes))
    assignment = results["assignment"]
    if assignment is not None:
        lines.append(
            f"assignment S: mean reversibility {assignment['reversibility_mean']:.4f}, mean slot-usage K "
            f"{assignment['slot_usage_k_mean']:.2f}"
        )
        corr = assignment["correlation"]
        if corr is None:
            lines.append(f"  reversibility vs accuracy: {assignment['correlation_skipped']}")
        else:
            lines.append(
                f"  reversibility vs accuracy over {corr['n']} classes: Pearson r = {corr['pearson_r']:.3f} "
                f"(p = {corr['pearson_p']:.3g}, 95% CI [{corr['pearson_ci_low']:.2f}, {corr['pearson_ci_high']:.2f}]),"
                f" Spearman rho = {corr['spearman_rho']:.3f} (p = {corr['spearman_p']:.3g})"
            )
        lines.append(
            "  slot-usage K per class, ranked:" + _class_lines(assignment["per_class"], "slot_usage_k", max_classes)
        )
    return "\n".join(lines)


def _class_lines(per_class: list[Mapping[str, Any]], key: str, max_classes: int) -> str:
    entries = sorted((e for e in per_class if e[key] is not None), key=lambda e: -e[key])
    shown = [*entries[:5], None, *entries[-5:]] if len(entries) > max_classes else entries
    cells = ["..." if e is None else f"{e['class']}: {e[key]:.3g} (n={e['n']})" for e in shown]
    return "".join(f"\n    {cell}" for cell in cells)

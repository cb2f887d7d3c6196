"""The report's curves read the way the console does: the epoch axis counts epochs completed (the per-step curve
starts at 0, not -1), and a learning rate that never changes is drawn against zero with distinct tick labels."""

from __future__ import annotations

from vitlab.report.curves import PER_STEP, add_step_series, curve_panels
from vitlab.report.figures import curves_figure


def _rows(epochs: int, lr: float) -> list[dict]:
    return [{"epoch": e, "step": 4 * (e + 1), "train/loss": 2.0 - 0.1 * e, "train/lr": lr} for e in range(epochs)]


def test_the_epoch_axis_counts_epochs_completed_and_steps_start_at_zero():
    rows = _rows(3, 2e-3)
    steps = [{"epoch": s // 4, "step": s, "loss": 2.0, "lr": 2e-3} for s in range(1, 12, 2)]
    panels = add_step_series(curve_panels(rows), steps, rows)
    figure = curves_figure(panels)
    loss_axis = next(ax for ax in figure.axes if ax.get_title() == "loss")
    lines = {line.get_label(): line.get_xdata() for line in loss_axis.get_lines()}
    assert list(lines["train"]) == [1.0, 2.0, 3.0], "the first epoch's mean is drawn at epoch 1, as the console says"
    assert min(lines["train" + PER_STEP]) >= 0 and max(lines["train" + PER_STEP]) <= 3


def test_a_constant_learning_rate_reads_against_zero():
    figure = curves_figure(curve_panels(_rows(4, 2e-3)))
    axis = next(ax for ax in figure.axes if ax.get_title() == "learning rate")
    figure.canvas.draw()
    labels = [tick.get_text() for tick in axis.get_yticklabels() if tick.get_text()]
    assert axis.get_ylim()[0] == 0 and len(set(labels)) == len(labels) > 2, labels

"""Old results never pass as the run's: an evaluation made during a fit or before a ``--resume`` is labelled in the
report and left out of ``final_metrics`` (so ``compare`` never averages it), and ``run.overwrite`` takes the old
model's ``explain/`` with it."""

import lightning.pytorch as pl

from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.config import build_config
from vitlab.evaluation import evaluate_run
from vitlab.evaluation.compare import run_metrics
from vitlab.explain.run import EVALUATION_JSON, EXPLAIN_DIR
from vitlab.report.collect import evaluation_section
from vitlab.report.explanations import faithfulness_blocks
from vitlab.report.record import RunRecord
from vitlab.rundir import RunDir
from vitlab.training.run import fit

QUICK = {"tta_views": 0, "corruptions": False, "max_batches": 1}


def _fit(run_dir, *extra: str) -> list[str]:
    return ["fit", "--config", "vit/digits", f"run.dir={run_dir}", *TINY, *extra]


def test_results_made_before_a_resume_are_stale_and_compare_leaves_them_out(tmp_path):
    run_dir = tmp_path / "run"
    assert main(_fit(run_dir, "trainer.max_epochs=1")) == 0
    evaluate_run(run_dir, **QUICK)
    assert main(["explain", str(run_dir), "--evaluate", "--num-images", "2"]) == 0
    assert "explain --evaluate on" in faithfulness_blocks(RunRecord.load(run_dir))[0].text
    assert "eval/test/top1" in run_metrics(run_dir) and not RunRecord.load(run_dir).stale_evaluation
    assert main(["fit", "--resume", str(run_dir), "trainer.max_epochs=2"]) == 0
    assert not [key for key in run_metrics(run_dir) if key.startswith("eval/")], "an earlier model's numbers"
    record = RunRecord.load(run_dir)
    assert record.stale_evaluation and record.evaluation is None
    assert "earlier model of this run" in evaluation_section(record).blocks[0].text
    assert "earlier model of this run" in faithfulness_blocks(record)[0].text
    evaluate_run(run_dir, **QUICK)
    assert "eval/test/top1" in run_metrics(run_dir) and not RunRecord.load(run_dir).stale_evaluation


class _EvaluateMidway(pl.Callback):
    """``vitlab evaluate RUN`` while the fit is still at work (its second epoch)."""

    def __init__(self, run_dir) -> None:
        self.run_dir = run_dir

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            evaluate_run(self.run_dir, **QUICK)


def test_an_evaluation_made_during_the_fit_is_stale(tmp_path):
    run_dir = tmp_path / "run"
    cfg = build_config("vit/digits", [f"run.dir={run_dir}", "trainer.max_epochs=2", *TINY])
    fit(cfg, callbacks=[_EvaluateMidway(run_dir)])
    assert RunDir(run_dir).evaluation() is not None and RunDir(run_dir).current_evaluation() is None
    assert not [key for key in RunDir(run_dir).final_metrics() if key.startswith("eval/")]


def test_overwriting_a_run_takes_the_old_models_explanations_with_it(tmp_path):
    run_dir = tmp_path / "run"
    assert main(_fit(run_dir, "trainer.max_epochs=1")) == 0
    assert main(["explain", str(run_dir), "--evaluate", "--num-images", "2"]) == 0
    assert (run_dir / EXPLAIN_DIR / EVALUATION_JSON).is_file()
    assert main(_fit(run_dir, "trainer.max_epochs=1", "run.overwrite=true", "run.report=true")) == 0
    assert not (run_dir / EXPLAIN_DIR).exists()
    assert "explain --evaluate on" not in (run_dir / "report.html").read_text()

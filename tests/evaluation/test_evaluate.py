"""The evaluation drivers: ``evaluate_run`` on tiny exported models against direct computations, ``compare_runs``
against numpy / scipy, and the ``vitlab evaluate`` / ``vitlab compare`` commands."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

import vitlab
from run_fixtures import make_run, write_checkpoint
from vitlab.cli.main import main
from vitlab.config import DataConfig
from vitlab.data import build_datamodule
from vitlab.errors import ConfigError
from vitlab.evaluation import classifier_logits, compare_runs, evaluate_run
from vitlab.evaluation.calibration import calibration_split_eval, expected_calibration_error
from vitlab.evaluation.compare import comparison_json, comparison_markdown
from vitlab.evaluation.corruptions import CORRUPTIONS, scale_contrast
from vitlab.evaluation.outputs import build_tta_views, logits_and_assignment, translate

BATCH = 32
MAX_BATCHES = 2


def reference_batches(split: str, batches: int = MAX_BATCHES, batch_size: int = BATCH):
    """The first normalised batches of a digits split, straight from the data module."""
    dm = build_datamodule(DataConfig(name="digits", batch_size=batch_size))
    dm.setup()
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    xs, ys = zip(*[batch for _, batch in zip(range(batches), loader, strict=False)], strict=True)
    return torch.cat(xs), torch.cat(ys), dm


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs"), preset="vit_pico")
    results = evaluate_run(run, max_batches=MAX_BATCHES, tta_views=2, hflip=True)
    return run, results


def test_evaluate_matches_direct_computation(vit_run):
    run, results = vit_run
    model = vitlab.load_model(run)
    x, y, _ = reference_batches("test")
    with torch.no_grad():
        logits = model(x).double()
        flipped = model(x.flip(-1)).double()
    assert results["run"]["n_test"] == len(y) == BATCH * MAX_BATCHES
    test = results["test"]
    assert test["top1"] == pytest.approx((logits.argmax(-1) == y).double().mean().item())
    assert test["nll"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert test["ece"] == pytest.approx(expected_calibration_error(logits, y), abs=1e-6)
    top5 = (logits.topk(5).indices == y[:, None]).any(-1).double().mean().item()
    assert test["top1"] <= test["top5"] == pytest.approx(top5)

    # Temperature fitted on half of the validation logits; applied to the test logits.
    x_val, y_val, _ = reference_batches("val")
    with torch.no_grad():
        val_logits = model(x_val).double()
    expected = calibration_split_eval(val_logits, y_val, seed=0)
    assert results["calibration"]["temperature"] == pytest.approx(expected["temperature"], rel=1e-4)
    assert results["calibration"]["n_fit"] + results["calibration"]["n_eval"] == len(y_val)
    temperature = results["test_calibrated"]["temperature"]
    assert results["test_calibrated"]["nll"] == pytest.approx(F.cross_entropy(logits / temperature, y).item(), rel=1e-4)

    # Two TTA views, identity and flip: the mean of their softmax probabilities.
    probs = (logits.softmax(-1) + flipped.softmax(-1)) / 2
    assert results["run"]["tta_views"] == ["identity", "hflip"]
    assert results["tta"]["top1"] == pytest.approx((probs.argmax(-1) == y).double().mean().item())
    assert results["tta"]["nll"] == pytest.approx(-probs.gather(1, y[:, None]).log().mean().item(), rel=1e-5)

    per_class = results["per_class"]
    assert [entry["index"] for entry in per_class] == list(range(10))
    for entry in per_class:
        members = y == entry["index"]
        assert entry["n"] == int(members.sum())
        if entry["n"]:
            assert entry["accuracy"] == pytest.approx((logits.argmax(-1)[members] == entry["index"]).double().mean())
        else:
            assert entry["accuracy"] is None
    assert results["assignment"] is None  # a plain ViT has no assignment matrix


def test_corruption_table(vit_run):
    run, results = vit_run
    corruptions = results["corruptions"]
    assert list(corruptions) == list(CORRUPTIONS)
    for entry in corruptions.values():
        assert list(entry["by_severity"]) == ["1", "2", "3", "4", "5"]
        n_test = results["run"]["n_test"]  # an accuracy is a count of correct test images over n_test
        assert all(value * n_test == pytest.approx(round(value * n_test)) for value in entry["by_severity"].values())
        assert entry["mean"] == pytest.approx(np.mean(list(entry["by_severity"].values())))
    assert results["mean_corrupted"] == pytest.approx(np.mean([entry["mean"] for entry in corruptions.values()]))

    # Contrast is deterministic: redo severity 5 (factor 0.15) by hand in pixel space.
    model = vitlab.load_model(run)
    x, y, dm = reference_batches("test")
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    with torch.no_grad():
        corrupted = (scale_contrast((x * std + mean).clamp(0, 1), 0.15) - mean) / std
        accuracy = (model(corrupted).argmax(-1) == y).double().mean().item()
    assert corruptions["contrast"]["by_severity"]["5"] == pytest.approx(accuracy)


def test_outputs_written(vit_run):
    run, results = vit_run
    out = run / "evaluation"
    # Strict JSON: no NaN anywhere.
    stored = json.loads((out / "evaluation.json").read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    assert stored["test"] == results["test"]
    png = out / results["files"]["reliability"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_from_checkpoint(vit_run, tmp_path):
    run, results = vit_run
    write_checkpoint(run)
    from_checkpoint = evaluate_run(
        run / "checkpoints" / "best.ckpt", max_batches=MAX_BATCHES, tta_views=0, corruptions=False, out_dir=tmp_path
    )
    assert from_checkpoint["test"] == pytest.approx(results["test"])
    assert from_checkpoint["calibration"]["temperature"] == pytest.approx(results["calibration"]["temperature"])
    assert (tmp_path / "evaluation.json").exists()


def test_cet_vit_assignment_per_class(tmp_path):
    run = make_run(tmp_path, preset="cet_vit_pico", batch_size=64)
    results = evaluate_run(run, max_batches=1, tta_views=0, corruptions=False)
    assert results["tta"] is None and results["corruptions"] == {} and results["mean_corrupted"] is None

    model = vitlab.load_model(run)
    x, y, _ = reference_batches("test", batches=1, batch_size=64)
    with torch.no_grad():
        _, aux = model.forward_with_aux(x)
    assignment = results["assignment"]
    assert assignment["reversibility_mean"] == pytest.approx(aux.ei["reversibility"].mean().item(), rel=1e-4)
    assert assignment["slot_usage_k_mean"] == pytest.approx(aux.slot_usage_k.double().mean().item())
    for entry in assignment["per_class"]:
        members = y == entry["index"]
        if entry["n"]:
            assert entry["reversibility"] == pytest.approx(aux.ei["reversibility"][members].mean().item(), rel=1e-4)
            assert entry["slot_usage_k"] == pytest.approx(aux.slot_usage_k[members].double().mean().item())
    ranked_k = {e["class"]: e["slot_usage_k"] for e in assignment["per_class"]}
    ranking = [ranked_k[name] for name in assignment["ranked_by_slot_usage_k"]]
    assert ranking == sorted(ranking, reverse=True)
    if assignment["correlation"] is None:
        assert "undefined" in assignment["correlation_skipped"]
    else:
        corr = assignment["correlation"]
        present = [e for e in assignment["per_class"] if e["n"]]
        r, _ = stats.pearsonr([e["reversibility"] for e in present], [e["accuracy"] for e in present])
        assert corr["pearson_r"] == pytest.approx(r)
        assert corr["pearson_ci_low"] <= corr["pearson_ci_high"]


def test_translate_hand_worked():
    image = torch.arange(1.0, 10.0).view(1, 1, 3, 3)
    assert translate(image, 1, 0)[0, 0].tolist() == [[0, 0, 0], [1, 2, 3], [4, 5, 6]]
    assert translate(image, -1, 1)[0, 0].tolist() == [[0, 4, 5], [0, 7, 8], [0, 0, 0]]
    with pytest.raises(ValueError, match="leaves nothing"):
        translate(image, 3, 0)


def test_tta_views():
    assert [v.name for v in build_tta_views(5, hflip=True, shift=2)] == [
        "identity",
        "hflip",
        "shift(+2,+2)",
        "shift(-2,-2)",
        "shift(+2,-2)",
    ]
    views = build_tta_views(5, hflip=False, shift=1)
    assert "hflip" not in [v.name for v in views] and views[0].is_identity
    image = torch.rand(2, 3, 4, 4)
    assert torch.equal(build_tta_views(2, hflip=True, shift=1)[1](image), image.flip(-1))
    with pytest.raises(ValueError, match=r"tta_views must be in 0..5"):
        build_tta_views(6, hflip=False, shift=1)


@dataclass
class _Output:
    logits: torch.Tensor


class _Stub(nn.Module):
    def __init__(self, wrap):
        super().__init__()
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(x.flatten(1)[:, :3])


def test_classifier_logits_reads_every_output_form():
    x = torch.randn(2, 1, 2, 2)
    expected = x.flatten(1)[:, :3]
    for wrap in (lambda t: t, _Output, lambda t: (t, {"S": None})):
        assert torch.equal(classifier_logits(_Stub(wrap), x), expected)
    with pytest.raises(TypeError, match="cannot find class logits"):
        classifier_logits(_Stub(lambda t: {"logits": t}), x)


def test_assignment_from_dict_aux():
    class WithAux(nn.Module):
        def forward_with_aux(self, x):
            return x.sum((2, 3)), {"S": torch.ones(x.shape[0], 4, 2) / 2}

    logits, S = logits_and_assignment(WithAux(), torch.ones(3, 2, 2, 2))
    assert logits.shape == (3, 2) and S.shape == (3, 4, 2)
    logits, S = logits_and_assignment(_Stub(lambda t: t), torch.ones(3, 1, 2, 2))
    assert S is None


def test_evaluate_rejects_bad_input(vit_run, tmp_path):
    run, _ = vit_run
    with pytest.raises(ConfigError, match="neither a run directory"):
        evaluate_run(tmp_path)
    with pytest.raises(ValueError, match="severities must be integers in 1..5"):
        evaluate_run(run, severities=(0, 6))
    with pytest.raises(ConfigError, match="trained with img_size=8"):
        evaluate_run(run, data_overrides={"img_size": 16}, max_batches=1)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--tta-views", "9"], "tta_views must be in 0..5"),
        (["--tta-views", "-1"], "tta_views must be a count >= 0"),
        (["--tta-shift", "0"], "pass --tta-shift 1 or more"),
        (["--max-batches", "0"], "pass --max-batches 1 or more"),
        (["--seed", "-1"], "--seed must be a whole number in 0..4294967295"),
        (["--seed", str(2**64)], "--seed must be a whole number in 0..4294967295"),
    ],
)
def test_evaluate_refuses_out_of_range_options_in_one_line_before_writing(vit_run, tmp_path, capsys, option, message):
    run, _ = vit_run
    out = tmp_path / "evaluation"
    assert main(["evaluate", str(run), "--no-corruptions", "--out", str(out), *option]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("vitlab evaluate: error:")]
    assert "Traceback (most recent" not in err and len(errors) == 1 and message in errors[0], err
    assert not out.exists()


# -------------------------------------------------------------------------------------------------------------------
ACCURACY = {"vit_pico": [0.90, 0.92, 0.91], "cet_vit_pico": [0.85, 0.86, 0.80]}


def fake_run(root: Path, model: str, seed: int, acc: float, lr: float = 1e-3) -> Path:
    """A run without a model, with test metrics only: what `vitlab compare` reads."""
    test_metrics = {"test/acc": acc, "test/loss": 1 - acc}
    return make_run(
        root, f"{model}-{seed}-{lr}", preset=model, seed=seed, lr=lr, export=False, test_metrics=test_metrics
    )


@pytest.fixture
def fake_runs(tmp_path):
    return [fake_run(tmp_path, model, seed, acc) for model, accs in ACCURACY.items() for seed, acc in enumerate(accs)]


def test_compare_runs_statistics(fake_runs):
    comparison = compare_runs(fake_runs)
    assert list(comparison["groups"]) == ["vit_pico", "cet_vit_pico"]
    for model, accs in ACCURACY.items():
        group = comparison["groups"][model]
        assert group["seeds"] == [0, 1, 2]
        assert group["metrics"]["test/acc"]["mean"] == pytest.approx(np.mean(accs))
        assert group["metrics"]["test/acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
        assert group["metrics"]["test/loss"]["mean"] == pytest.approx(1 - np.mean(accs))
    (test,) = comparison["tests"]
    reference = stats.ttest_ind(ACCURACY["vit_pico"], ACCURACY["cet_vit_pico"], equal_var=False)
    assert (test["a"], test["b"]) == ("vit_pico", "cet_vit_pico")
    assert test["t"] == pytest.approx(reference.statistic) and test["p"] == pytest.approx(reference.pvalue)
    markdown = comparison_markdown(comparison)
    assert "| test/acc | 0.91 ± 0.01 | 0.8367 ± 0.032 |" in markdown
    assert f"{reference.pvalue:.3g}" in markdown


def test_compare_by_config_key_and_all_pairs(tmp_path, fake_runs):
    runs = [*fake_runs, fake_run(tmp_path, "vit_pico", 5, 0.5, lr=5e-4)]
    comparison = compare_runs(runs, group_by="optim.lr", pairs="all")
    assert sorted(comparison["groups"]) == ["0.0005", "0.001"]
    assert comparison["groups"]["0.0005"]["metrics"]["test/acc"]["n"] == 1
    assert "skipped" in comparison["tests"][0]  # one run cannot be t-tested
    assert json.loads(comparison_json(comparison))["groups"]["0.0005"]["metrics"]["test/acc"]["std"] is None
    with pytest.raises(ConfigError, match="has no key 'model.nonexistent'"):
        compare_runs(runs, group_by="model.nonexistent")
    with pytest.raises(ConfigError, match="no run has the metric 'test/top9'"):
        compare_runs(runs, metric="test/top9")


def test_compare_reads_evaluation(vit_run, fake_runs):
    run, results = vit_run
    comparison = compare_runs([run, *fake_runs], metric="test/acc")
    metrics = comparison["groups"]["vit_pico"]["metrics"]
    assert metrics["eval/test/top1"]["mean"] == pytest.approx(results["test"]["top1"])
    assert metrics["eval/corruptions/contrast/mean"]["n"] == 1
    assert metrics["test/acc"]["n"] == 3  # the evaluated run has no test_metrics.json


# -------------------------------------------------------------------------------------------------------------------
def test_cli_evaluate(vit_run, tmp_path, capsys):
    run, _ = vit_run
    out = tmp_path / "eval"
    args = ["evaluate", str(run), "--max-batches", "1", "--no-corruptions", "--tta-views", "3", "--out", str(out)]
    assert main([*args, "--data", "batch_size=16"]) == 0
    printed = capsys.readouterr().out
    assert "top-1" in printed and "TTA (3 views)" in printed and str(out / "evaluation.json") in printed
    stored = json.loads((out / "evaluation.json").read_text())
    assert stored["run"]["n_test"] == 16
    assert stored["run"]["tta_views"] == ["identity", "shift(+1,+1)", "shift(-1,-1)"]  # digits are not flip-invariant
    assert main([*args, "data.batch_size=8"]) == 0
    assert json.loads((out / "evaluation.json").read_text())["run"]["n_test"] == 8
    capsys.readouterr()
    assert main([*args, "optim.lr=0.1"]) == 2
    assert "only data overrides" in capsys.readouterr().err


def test_cli_compare(fake_runs, tmp_path, capsys):
    out = tmp_path / "report" / "compare.md"
    assert main(["compare", *map(str, fake_runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## Welch's t-test on test/acc" in printed and "| test/acc |" in printed
    assert out.read_text() in printed
    assert json.loads(out.with_suffix(".json").read_text())["metric"] == "test/acc"


def test_compare_reads_training_times(fake_runs):
    for i, run in enumerate(fake_runs):
        (run / "timing.json").write_text(json.dumps({"time/backward_total_s": 10.0 + i, "epochs": 3}))
    comparison = compare_runs(fake_runs)
    backward = comparison["groups"]["vit_pico"]["metrics"]["time/backward_total_s"]
    assert backward["mean"] == pytest.approx(11.0) and backward["n"] == 3
    assert "epochs" not in comparison["groups"]["vit_pico"]["metrics"]  # only the time/ totals are metrics


def test_evaluate_with_token_merging_at_inference(vit_run):
    """``model_overrides`` rebuilds the trained model with options that keep its weights: ToMe at inference."""
    run, results = vit_run
    kwargs = dict(max_batches=MAX_BATCHES, tta_views=0, corruptions=False)
    same = evaluate_run(run, model_overrides={"tome_r": 0}, **kwargs)
    assert same["test"]["top1"] == pytest.approx(results["test"]["top1"])
    assert same["test"]["nll"] == pytest.approx(results["test"]["nll"], abs=1e-6)
    merged = evaluate_run(run, model_overrides={"tome_r": 4}, **kwargs)
    assert merged["run"]["model_overrides"] == {"tome_r": 4}
    assert Path(merged["run"]["out_dir"]) == run / "evaluation-tome_r=4"
    assert (run / "evaluation-tome_r=4" / "evaluation.json").is_file()
    assert merged["test"]["nll"] != pytest.approx(results["test"]["nll"], abs=1e-6)  # merging changed the outputs
    with pytest.raises(ConfigError, match="embed_dim=32 changes the weights of vit_pico"):
        evaluate_run(run, model_overrides={"embed_dim": 32}, **kwargs)


def test_cli_evaluate_model_option(vit_run, capsys):
    run, _ = vit_run
    argv = ["evaluate", str(run), "--model", "tome_r=2", "--max-batches", "1", "--tta-views", "0", "--no-corruptions"]
    assert main(argv) == 0
    assert json.loads((run / "evaluation-tome_r=2" / "evaluation.json").read_text())["run"]["model_overrides"] == {
        "tome_r": 2
    }

"""The probes of spec cetvit.md section 7: gradient flow, distance from init, the card's reversibility table,
slot-usage K and segment maps, and the ``vitlab probe`` sub-commands."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from vitlab.cli.main import main
from vitlab.config import DataConfig, RunConfig, build_config, to_dict
from vitlab.data import build_datamodule
from vitlab.diagnostics.probes import gradient_flow, init_distance
from vitlab.diagnostics.segments import colour_segments, draw_segment_maps, overlay, segment_map, slot_palette
from vitlab.export import export_model
from vitlab.families.cet_vit.ei import reversibility
from vitlab.families.cet_vit.probes import (
    balanced_one_hot,
    common_mode_mixture,
    mixture_for_reversibility,
    reversibility_table,
    slot_usage_summary,
)
from vitlab.models.builder import create_model
from vitlab.training.run import build_task
from vitlab.training.tasks import ClassificationTask

NUM_CLASSES = 3


class WithDeadParts(nn.Module):
    """A classifier with the CET-ViT card's failure mode: ``estimator`` runs in the forward pass but its output is
    never used (grad None), and ``gate`` multiplies a term by zero (all-zero gradient). ``frozen`` is not trained."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, NUM_CLASSES)
        self.estimator = nn.Linear(8, 2)
        self.gate = nn.Parameter(torch.ones(8))
        self.frozen = nn.Parameter(torch.ones(8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x).relu()
        self.last_estimate = self.estimator(h)  # computed, never used
        return self.head(h + 0.0 * self.gate + self.frozen)


def _classification_task(model: nn.Module) -> ClassificationTask:
    return ClassificationTask(model, cfg=RunConfig(), hparams={"data_info": {"num_classes": NUM_CLASSES}})


def _batch(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.arange(n) % NUM_CLASSES


# -------------------------------------------------------------------------------------------------------------------
def test_gradient_flow_finds_the_unused_module_and_the_zeroed_term():
    task = _classification_task(WithDeadParts()).eval()
    report = gradient_flow(task, _batch())
    assert report["no_grad"] == ["estimator.weight", "estimator.bias"]
    assert report["zero_grad"] == ["gate"]
    assert report["dead"] == ["estimator.weight", "estimator.bias", "gate"]
    assert report["frozen"] == ["frozen"]
    assert set(report["grad_norms"]) == {"body.weight", "body.bias", "head.weight", "head.bias", "gate"}
    assert report["grad_norms"]["head.weight"] > 0 and report["grad_norms"]["gate"] == 0
    assert report["num_trainable"] == 7 and report["num_tensors"] == 8
    expected_loss = F.cross_entropy(task.model(_batch()[0]), _batch()[1]).item()
    assert report["loss"] == pytest.approx(expected_loss, rel=1e-6)
    # the task is left as it was found: eval mode, no gradients
    assert not task.training and all(p.grad is None for p in task.parameters())


def test_gradient_flow_reaches_every_parameter_of_cet_vit_with_the_dynamic_k_estimator():
    cfg = build_config(None, ["model.name=cet_vit_pico", "model.dynamic_k=gumbel", "loss.lambda_ei=0.05"])
    torch.manual_seed(0)
    kwargs = dict(img_size=16, patch_size=2, num_classes=NUM_CLASSES, dynamic_k="gumbel")
    model = create_model("cet_vit_pico", **kwargs)
    info = {"num_classes": NUM_CLASSES}
    task = build_task(cfg, model, {"config": to_dict(cfg), "model_kwargs": kwargs, "data_info": info})
    report = gradient_flow(task, (torch.randn(4, 3, 16, 16), torch.arange(4) % NUM_CLASSES))
    assert report["dead"] == [] and report["frozen"] == []
    estimator = [name for name in report["grad_norms"] if name.startswith("k_estimator.")]
    assert len(estimator) == len(list(model.k_estimator.parameters())) > 0
    assert all(report["grad_norms"][name] > 0 for name in estimator)
    assert report["num_trainable"] == len(list(model.parameters()))


def test_gradient_flow_needs_a_task():
    with pytest.raises(TypeError, match="build_task"):
        gradient_flow(nn.Linear(2, 2), _batch())


# -------------------------------------------------------------------------------------------------------------------
class ConstantInit(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((10,), value))


def test_init_distance_hand_case():
    """Fresh inits fill the tensor with the seed (0..4): mean 2, spread std([0..4]) = 1.5811; std 0, spread 0."""
    fresh = lambda seed: ConstantInit(float(seed))  # noqa: E731
    report = init_distance(ConstantInit(2.0), fresh, n_seeds=5, k=3.0)
    (row,) = report["tensors"]
    assert row["init_mean"] == pytest.approx(2.0) and row["init_mean_spread"] == pytest.approx(1.5811, abs=1e-4)
    assert row["z_mean"] == pytest.approx(0.0) and row["z_std"] == pytest.approx(0.0)
    assert report["indistinguishable"] == ["weight"]
    far = init_distance(ConstantInit(10.0), fresh, n_seeds=5, k=3.0)["tensors"][0]
    assert far["z_mean"] == pytest.approx(8 / 1.5811, rel=1e-4) and not far["indistinguishable"]
    near = init_distance(ConstantInit(6.0), fresh, n_seeds=5, k=3.0)["tensors"][0]  # z = 2.53 <= 3
    assert near["indistinguishable"]


class TwoBranches(nn.Module):
    """``used`` is trained; ``unused`` (a branch whose output is dropped) and ``norm`` (its LayerNorm) are not."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Sequential()
        self.used.add_module("hidden", nn.Linear(16, 32))
        self.used.add_module("act", nn.ReLU())
        self.used.add_module("out", nn.Linear(32, 1))
        self.unused = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.norm(self.unused(x))
        return self.used(x)


def test_init_distance_flags_the_untouched_branch_and_not_the_trained_one():
    def make_fresh(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return TwoBranches()

    model = make_fresh(123)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = x[:, :4].sum(-1, keepdim=True).tanh() * 3
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(60):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    report = init_distance(model, make_fresh, n_seeds=5)
    assert report["indistinguishable"] == ["unused.weight", "unused.bias", "norm.weight", "norm.bias"]
    moved = {row["name"]: row for row in report["tensors"] if not row["indistinguishable"]}
    assert set(moved) == {"used.hidden.weight", "used.hidden.bias", "used.out.weight", "used.out.bias"}
    assert all(max(row["z_mean"], row["z_std"]) > 3 for row in moved.values())


def test_init_distance_rejects_another_architecture():
    with pytest.raises(ValueError, match="same architecture"):
        init_distance(nn.Linear(3, 2), lambda seed: nn.Linear(3, 4))
    with pytest.raises(ValueError, match="at least 2"):
        init_distance(nn.Linear(3, 2), lambda seed: nn.Linear(3, 2), n_seeds=1)


# -------------------------------------------------------------------------------------------------------------------
def test_reversibility_table_reproduces_the_card():
    """Card, Disclosure 2: concentrated ~0.99 (fires), diffuse one-hot ~0.04, realistic top-3 ~0.05 (neither fires),
    and both ReLU terms zero at the operating point 0.24."""
    rows = {row["name"]: row for row in reversibility_table()}
    assert rows["concentrated"]["reversibility"] == pytest.approx(0.99, abs=0.015)
    assert rows["diffuse_one_hot"]["reversibility"] == pytest.approx(0.04, abs=0.005)
    assert rows["realistic_top3"]["reversibility"] == pytest.approx(0.05, abs=0.006)
    assert rows["balanced_one_hot"]["reversibility"] == pytest.approx(1 / 32, rel=1e-4)
    assert rows["operating_point"]["reversibility"] == pytest.approx(0.24, rel=1e-4)
    assert rows["concentrated"]["rev_fires"] and rows["concentrated"]["entropy_fires"]
    for name in ("diffuse_one_hot", "balanced_one_hot", "realistic_top3", "operating_point"):
        assert not rows[name]["rev_fires"] and not rows[name]["entropy_fires"], name
        assert rows[name]["rev_penalty"] == 0 and rows[name]["entropy_penalty"] == 0
    # the penalties are the ReLUs of the readings
    c = rows["concentrated"]
    assert c["rev_penalty"] == pytest.approx(c["reversibility"] - 0.45, abs=1e-6)
    assert c["entropy_penalty"] == pytest.approx(0.5 - c["norm_entropy"], abs=1e-6)
    assert {row["card_reversibility"] for row in rows.values()} == {0.99, 0.04, None, 0.05, 0.24}


@pytest.mark.parametrize("target", [1 / 8, 0.24, 0.6, 1.0])
def test_common_mode_mixture_hits_the_asked_reversibility(target):
    S = common_mode_mixture(mixture_for_reversibility(target, 8), 32, 8)
    assert S.sum(-1).allclose(torch.ones(1, 32))
    assert reversibility(S).item() == pytest.approx(target, rel=1e-4)
    assert balanced_one_hot(6, 3).tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]] * 2


def test_bad_synthetic_parameters_are_named():
    with pytest.raises(ValueError, match=r"\[1/K, 1\]"):
        mixture_for_reversibility(0.01, 32)
    with pytest.raises(ValueError, match="divide"):
        common_mode_mixture(0.5, 10, 4)


# -------------------------------------------------------------------------------------------------------------------
def test_slot_usage_summary_hand_case():
    slot_k = torch.tensor([3, 5, 5, 2, 4])
    labels = torch.tensor([0, 1, 1, 0, 2])
    predictions = torch.tensor([0, 1, 0, 1, 2])
    summary = slot_usage_summary(slot_k, labels, ["plane", "car", "bird", "cat"], predictions)
    assert summary["num_images"] == 5 and summary["mean"] == pytest.approx(3.8)
    assert summary["std"] == pytest.approx(np.std([3, 5, 5, 2, 4]))
    assert summary["distribution"] == {2: 1, 3: 1, 4: 1, 5: 2}
    assert summary["accuracy"] == pytest.approx(3 / 5)
    ranked = [(entry["class"], entry["slot_usage_k"], entry["n"], entry["accuracy"]) for entry in summary["per_class"]]
    assert ranked == [("car", 5.0, 2, 0.5), ("bird", 4.0, 1, 1.0), ("plane", 2.5, 2, 0.5)]  # "cat" has no images
    with pytest.raises(ValueError, match=r"\[M\]"):
        slot_usage_summary(slot_k, labels[:3], ["a"])


def test_segment_map_colours_and_overlay():
    # 4 tokens on a 2x2 grid, 3 slots: top slots 2, 0 / 1, 2
    S = torch.tensor([[[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.0, 0.1, 0.9]]])
    segments = segment_map(S, (2, 2))
    assert segments.tolist() == [[[2, 0], [1, 2]]]
    colours = colour_segments(segments, 3, (4, 4))  # each token covers a 2x2 pixel patch
    palette = slot_palette(3)
    assert colours.shape == (1, 4, 4, 3)
    np.testing.assert_allclose(colours[0, :2, :2], np.broadcast_to(palette[2], (2, 2, 3)))
    np.testing.assert_allclose(colours[0, 2:, :2], np.broadcast_to(palette[1], (2, 2, 3)))
    assert len({tuple(c) for c in slot_palette(32)}) == 32 and len({tuple(c) for c in slot_palette(80)}) == 80
    image = np.full((1, 4, 4, 3), 0.2)
    np.testing.assert_allclose(overlay(image, colours, 0.25), 0.75 * 0.2 + 0.25 * colours)
    with pytest.raises(ValueError, match="grid"):
        segment_map(S, (3, 2))
    figure = draw_segment_maps(torch.rand(1, 1, 4, 4), S, (2, 2), titles=["seven"])
    assert len(figure.axes) == 3 and figure.axes[0].get_title() == "seven"


# -------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cet_run(tmp_path_factory):
    """A CET-ViT (with the Dynamic-K estimator) trained for one short epoch on digits, exported."""
    run_dir = tmp_path_factory.mktemp("probe") / "run"
    overrides = ["trainer.max_epochs=1", "data.limit_train=128", "trainer.limit_val_batches=1"]
    assert (
        main(
            [
                "fit",
                "--config",
                "cet_vit/digits",
                f"run.dir={run_dir}",
                "run.test=false",
                *overrides,
                "trainer.enable_progress_bar=false",
            ]
        )
        == 0
    )
    return run_dir


def test_cli_slot_k_writes_the_json_and_the_segment_png(cet_run, tmp_path, capsys):
    out = tmp_path / "probes"
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert main(["probe", "slot-k", str(cet_run), "--num-images", "3", "--out", str(out), "--class-names", *names]) == 0
    test_size = len(build_datamodule(DataConfig(name="digits")).test_dataloader().dataset)  # the whole test split
    printed = capsys.readouterr().out
    assert f"slot-usage K over {test_size} images" in printed and "classes ranked by mean K" in printed
    summary = json.loads((out / "slot_k.json").read_text())
    per_image = torch.tensor(summary["per_image"])
    assert summary["num_images"] == len(per_image) == test_size
    assert summary["mean"] == pytest.approx(per_image.double().mean().item())
    assert sum(summary["distribution"].values()) == test_size
    assert all(1 <= int(k) <= 8 for k in summary["distribution"])  # 8 slots (cet_vit/digits)
    means = [entry["slot_usage_k"] for entry in summary["per_class"]]
    assert means == sorted(means, reverse=True) and sum(entry["n"] for entry in summary["per_class"]) == test_size
    accuracy = sum(entry["accuracy"] * entry["n"] for entry in summary["per_class"]) / test_size
    assert summary["accuracy"] == pytest.approx(accuracy)  # the per-class accuracies weighted by class size
    assert sorted(entry["class"] for entry in summary["per_class"]) == sorted(names)
    picture = np.asarray(Image.open(out / "segments.png").convert("RGB"))
    assert picture.shape[0] > 100 and picture.shape[1] > 100
    assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 10  # drawn, not blank


def test_cli_slot_k_checks_the_class_names(cet_run, tmp_path, capsys):
    assert main(["probe", "slot-k", str(cet_run), "--out", str(tmp_path), "--class-names", "a", "b"]) == 2
    assert "gives 2 names for the 10 classes" in capsys.readouterr().err


def test_cli_slot_k_refuses_a_model_without_an_assignment(tmp_path, capsys):
    vit = create_model("vit_nano", img_size=8, in_chans=1, num_classes=10, patch_size=2, depth=1)
    export = export_model(vit, tmp_path / "export", {"data": {"dataset": "digits"}})
    assert main(["probe", "slot-k", str(export)]) == 2
    assert "no slot assignment S" in capsys.readouterr().err


def test_cli_gradients_from_a_config_and_from_a_run(cet_run, tmp_path, capsys):
    report_file = tmp_path / "gradients.json"
    args = ["probe", "gradients", "--config", "cet_vit/digits", "data.batch_size=8", "--json", str(report_file)]
    assert main(args) == 0
    report = json.loads(report_file.read_text())
    assert report["dead"] == [] and report["model"] == "cet_vit_pico"
    assert any(name.startswith("k_estimator.") for name in report["grad_norms"])
    assert "every parameter gets a gradient" in capsys.readouterr().out
    assert main(["probe", "gradients", str(cet_run), "data.batch_size=8"]) == 0
    assert "every parameter gets a gradient" in capsys.readouterr().out


def test_cli_init_distance_exit_code_follows_the_flags(cet_run, capsys):
    rc = main(["probe", "init-distance", str(cet_run), "--seeds", "3", "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert report["n_seeds"] == 3 and report["model"] == "cet_vit_pico"
    assert len(report["tensors"]) == len(list(create_model("cet_vit_pico", **_kwargs(cet_run)).parameters()))
    assert rc == (1 if report["indistinguishable"] else 0)


def _kwargs(run_dir):
    return json.loads((run_dir / "export" / "config.json").read_text())["kwargs"]


def test_cli_reversibility_prints_the_table_and_the_json(capsys):
    assert main(["probe", "reversibility", "--tokens", "64", "--slots", "8", "--batch", "4"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("assignment S") and "operating_point" in table
    assert main(["probe", "reversibility", "--tokens", "64", "--slots", "8", "--batch", "4", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == reversibility_table(64, 8, 4, 0)
    assert main(["probe", "reversibility", "model.depth=2"]) == 2
    assert "takes no config overrides" in capsys.readouterr().err

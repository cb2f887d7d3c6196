"""``vitlab fit`` of a torchvision classifier by name (``model.name=tv:NAME``): trained with the dynamics probe where
vitlab reads its attention, exported (safetensors and ONNX) and rebuilt by name; weights from a state dict saved by
torchvision; what is refused before the run folder exists."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torchvision
from sklearn.datasets import load_digits

import vitlab
from tests.refusals import assert_refused
from vitlab.cli.main import main

FAST = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "run.report=false"]
TINY_VIT = ["model.patch_size=2", "model.num_layers=2", "model.num_heads=2", "model.hidden_dim=16", "model.mlp_dim=32"]
TINY_SWIN = [
    "model.patch_size=[2,2]",
    "model.embed_dim=8",
    "model.depths=[1,1]",
    "model.num_heads=[1,2]",
    "model.window_size=[2,2]",
]
PROBE = ["dynamics.mode=fixed", "dynamics.freeze=false", "dynamics.probe_size=16", "dynamics.kappa_images=4"]


def _fit(tmp_path, *overrides: str) -> tuple[int, object]:
    run_dir = tmp_path / "run"
    return main(["fit", "--config", "vit/digits", *overrides, *FAST, f"run.dir={run_dir}"]), run_dir


def _digits(config: dict, count: int = 16) -> torch.Tensor:
    """The first ``count`` digits ``[B, 1, 8, 8]``, normalised as the export's config says."""
    images = torch.tensor(load_digits().images[:count], dtype=torch.float32)[:, None] / 16
    return (images - config["data"]["mean"][0]) / config["data"]["std"][0]


@pytest.mark.parametrize(
    ("name", "options"),
    [("vision_transformer", [*TINY_VIT, *PROBE]), ("swin_transformer", TINY_SWIN)],  # Swin: windowed, no probe
)
def test_a_torchvision_model_trains_exports_and_is_rebuilt_by_name(tmp_path, name, options):
    code, run_dir = _fit(tmp_path, f"model.name=tv:{name}", *options)
    assert code == 0
    if name == "vision_transformer":
        records = [json.loads(line) for line in (run_dir / "dynamics.jsonl").read_text().splitlines()]
        assert records[1]["modules"] == [f"encoder.layers.encoder_layer_{i}.self_attention" for i in (0, 1)]
        drift = torch.tensor(records[1]["drift"])
        assert drift.shape == (2, 2) and torch.isfinite(drift).all() and (drift > 0).all()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "onnx"), "--format", "onnx"]) == 0
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["model"] == f"tv:{name}" and config["kwargs"]["in_chans"] == 1
    model = vitlab.load_model(tmp_path / "onnx")
    assert isinstance(model, getattr(torchvision.models, config["architecture"]))
    images = _digits(config)
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"images": images.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(images).numpy(), atol=1e-4)


def test_a_torchvision_state_dict_is_fine_tuned_with_its_head_and_channels_refitted(tmp_path, caplog):
    """A state dict as torchvision saves it (RGB, 7 classes) into a model of the digits (gray, 10 classes): the
    first convolution summed over RGB (timm's adapt_input_conv), the head fresh, every other tensor the file's."""
    torch.manual_seed(0)
    saved = torchvision.models.VisionTransformer(
        image_size=8, patch_size=2, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=7
    ).state_dict()
    torch.save(saved, tmp_path / "vit.pth")
    sizes = dict(patch_size=2, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    model = vitlab.create_model(
        "tv:vision_transformer", img_size=8, in_chans=1, num_classes=10, pretrained=str(tmp_path / "vit.pth"), **sizes
    )
    loaded = model.state_dict()
    for key, value in saved.items():
        if key == "conv_proj.weight":
            torch.testing.assert_close(loaded[key], value.sum(1, keepdim=True))
        elif not key.startswith("heads."):
            assert torch.equal(loaded[key], value), key
    assert loaded["heads.head.weight"].shape == (10, 16)
    weights = f"model.pretrained={tmp_path / 'vit.pth'}"
    with caplog.at_level(logging.INFO):
        code, _ = _fit(tmp_path, "model.name=tv:vision_transformer", *TINY_VIT, weights, "run.export=false")
    assert code == 0
    # Lightning's rank_zero_info: a log record, on stderr through whichever handler the first command set up
    assert "conv_proj adapted from 3 to 1 input channels; heads.head reset for 10 classes" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name=tv:vit_b_61"], "torchvision has no classifier 'vit_b_61'. Did you mean tv:vit_b_16"),
        (["model.name=tv:vision_transformer", *TINY_VIT, "model.foo=3"], "does not take model.foo"),
        (["model.name=tv:vit_b_16", "model.patch_size=2"], "vit_b_16 fixes model.patch_size: remove it; tv:vision_tr"),
        (["model.name=tv:vision_transformer", "model.patch_size=2"], "needs model.num_layers, model.num_heads"),
        (
            ["model.name=tv:vision_transformer", *TINY_VIT, "model.patch_size=3"],
            "image size 8 is not divisible by the patch size 3; set model.patch_size to a divisor of 8",
        ),
        (["model.name=tv:vision_transformer", *TINY_VIT, "model.num_layers=0"], "model.num_layers must be at least 1"),
        (
            ["model.name=tv:swin_transformer", *TINY_SWIN, *PROBE],
            "SwinTransformer has no patch grid (grid_size), and the dynamics controller measures",
        ),
        (
            ["model.name=tv:vision_transformer", *TINY_VIT, "model.pretrained=/nonexistent/vit.pth"],
            "model.pretrained='/nonexistent/vit.pth': no such file or folder",
        ),
    ],
)
def test_a_torchvision_model_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, overrides, message):
    code, run_dir = _fit(tmp_path, *overrides)
    assert_refused(code, capsys.readouterr().err, message, run_dir)


def test_weights_of_another_torchvision_architecture_are_refused_in_one_line(tmp_path, capsys):
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), tmp_path / "resnet.pth")
    code, run_dir = _fit(
        tmp_path, "model.name=tv:vision_transformer", *TINY_VIT, f"model.pretrained={tmp_path / 'resnet.pth'}"
    )
    err = capsys.readouterr().err
    assert code == 2 and not run_dir.exists()
    assert "holds no tv:vision_transformer (conv_proj.weight; its keys: bn1.bias" in err

"""``vitlab fit`` of an HF transformers image classifier by name (``model.name=hf:TYPE``) or from a
``save_pretrained`` folder (``hf:PATH``, ``model.pretrained=PATH``); the commands that rebuild it by name; and what is
refused before the run folder exists. Tiny configs, random weights, no hub."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

import vitlab
from tests.refusals import assert_refused
from vitlab.cli.main import main
from vitlab.export_formats import validation_images
from vitlab.models import create_model

FAST = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "run.test=false", "run.export=false"]
PROBE = ["dynamics.mode=fixed", "dynamics.freeze=false", "dynamics.probe_size=16", "dynamics.kappa_images=4"]
VIT = ["model.patch_size=2", "model.depth=2", "model.embed_dim=16", "model.num_heads=2"]
ARCHITECTURES = {
    "vit": [*VIT, "model.intermediate_size=32", *PROBE],
    "deit": [*VIT, "model.intermediate_size=32", *PROBE],  # a CLS and a distillation token
    "dinov2": [*VIT, "model.mlp_ratio=2", *PROBE],
    "swin": [  # windowed attention only: the probe has no CLS row to read
        "model.patch_size=2",
        "model.embed_dim=8",
        "model.depths=[1,1]",
        "model.num_heads=[1,2]",
        "model.window_size=2",
        "dynamics=null",
    ],
}


def _fit(tmp_path, *overrides: str) -> tuple[int, object]:
    run_dir = tmp_path / "run"
    return main(["fit", "--config", "vit/digits", *FAST, "run.report=false", *overrides, f"run.dir={run_dir}"]), run_dir


@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_an_hf_model_trains_by_name_exports_and_is_rebuilt_by_name(tmp_path, kind):
    code, run_dir = _fit(tmp_path, f"model.name=hf:{kind}", *ARCHITECTURES[kind])
    assert code == 0
    if "dynamics=null" not in ARCHITECTURES[kind]:
        last = json.loads((run_dir / "dynamics.jsonl").read_text().splitlines()[-1])
        drift = torch.tensor(last["drift"])
        assert len(last["modules"]) == 2 and drift.shape == (2, 2) and (drift > 0).all()
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    model = vitlab.load_model(run_dir / "export")
    assert type(model.hf).__name__.endswith("ForImageClassification") and model.hf.config.model_type == kind
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    meta = json.loads((run_dir / "export" / "config.json").read_text())
    images = validation_images(model, config["data"], meta["data"])
    assert images is not None and images.shape[1:] == (1, 8, 8)  # digits
    session = ort.InferenceSession(str(run_dir / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = model(images).numpy()
    assert np.abs(session.run(None, {"images": images.numpy()})[0] - want).max() <= 1e-4
    assert main(["test", str(run_dir)]) == 0


def test_an_hf_run_is_evaluated_predicted_and_reported_by_name(tmp_path, capsys):
    code, run_dir = _fit(tmp_path, "model.name=hf:vit", *VIT, "run.export=true", *PROBE)
    assert code == 0
    out = tmp_path / "out"
    assert main(["evaluate", str(run_dir), "--out", str(out / "evaluate"), "--no-corruptions"]) == 0
    images = validation_images(
        vitlab.load_model(run_dir), yaml.safe_load((run_dir / "config.yaml").read_text())["data"], {}
    )
    from PIL import Image

    picture = tmp_path / "digit.png"
    Image.fromarray(((images[0, 0].numpy() - images.min().item()) * 40).clip(0, 255).astype(np.uint8)).save(picture)
    assert main(["predict", str(run_dir), str(picture), "--out", str(out / "predictions.csv")]) == 0
    assert main(["report", str(run_dir), "--out", str(out / "report.html")]) == 0
    assert (out / "report.html").stat().st_size > 0


def _saved_vit(folder, **options):
    """A tiny HF ViT written by ``save_pretrained``, 3 classes."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(1)
    shape = dict(image_size=8, patch_size=2, num_hidden_layers=2, hidden_size=16, num_attention_heads=2)
    config = ViTConfig(**{**shape, "intermediate_size": 24, "num_channels": 1, "num_labels": 3, **options})
    model = ViTForImageClassification(config)
    model.save_pretrained(folder)
    return model


def test_a_save_pretrained_folder_is_loaded_with_its_classifier_resized(tmp_path):
    saved = _saved_vit(tmp_path / "folder").state_dict()
    model = create_model("hf:vit", pretrained=str(tmp_path / "folder"), img_size=8, in_chans=1, num_classes=10)
    assert model.pretrained_summary.endswith("classifier re-sized from 3 to 10 classes")
    assert model.init_kwargs["intermediate_size"] == 24  # the folder's network, recorded to rebuild it by name
    for key, value in model.hf.state_dict().items():
        if key.startswith("classifier."):
            assert value.shape[0] == 10
        else:
            torch.testing.assert_close(value, saved[key], msg=key)


def test_a_folder_is_fine_tuned_by_name_and_rebuilt_without_it(tmp_path, caplog):
    folder = tmp_path / "folder"
    _saved_vit(folder)
    with caplog.at_level(logging.INFO, logger="vitlab.models.hf_weights"):
        code, run_dir = _fit(tmp_path, f"model.name=hf:{folder}", "run.export=true")
    assert code == 0
    assert f"loaded pretrained weights from {folder}; classifier re-sized from 3 to 10 classes" in caplog.messages
    model_section = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    assert model_section == {"name": "hf:vit", "pretrained": str(folder)}
    shutil.rmtree(folder)
    for source in (run_dir / "export", run_dir / "checkpoints" / "last.ckpt"):
        model = vitlab.load_model(source)
        assert model.hf.config.intermediate_size == 24 and model.num_classes == 10


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name=hf:vitt"], "transformers has no model_type 'vitt'. Did you mean hf:vit"),
        (["model.name=hf:bert"], "transformers has no image classifier 'bert'"),
        (["model.name='hf:'"], "model.name=hf: names no HF transformers model; write hf:TYPE"),
        (["model.name=hf:vit", "model.foo=3"], "transformers' ViTConfig (hf:vit) has no option 'foo'"),
        (["model.name=hf:swin", "model.depth=2"], "has no option 'depth' (num_hidden_layers). Did you mean depths"),
        (["model.name=hf:vit", "model.embed_dim=16", "model.hidden_size=16"], "both set ViTConfig.hidden_size"),
        (["model.name=hf:vit", "model.patch_size=3"], "image size 8 is not divisible by the patch size 3"),
        (["model.name=hf:google/vit-base-patch16-224"], "no folder on this disk, and vitlab never downloads"),
    ],
)
def test_an_hf_model_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, overrides, message):
    code, run_dir = _fit(tmp_path, *overrides)
    assert_refused(code, capsys.readouterr().err, message, run_dir)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "config.json").unlink(), "has no readable config.json"),
        (lambda f: (f / "model.safetensors").unlink(), "cannot be read (OSError"),
        (lambda f: (f / "model.safetensors").write_bytes(b"not weights"), "cannot be read"),
        (lambda f: _saved_vit(f, image_size=16), "The folder's config differs in image_size=16 (the model's 8)"),
    ],
)
def test_a_folder_that_is_not_a_fitting_save_pretrained_one_is_refused_in_one_line(tmp_path, capsys, damage, message):
    folder = tmp_path / "folder"
    _saved_vit(folder)
    damage(folder)
    code, run_dir = _fit(tmp_path, f"model.name=hf:{folder}")
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name=hf:deit", "model.pretrained={folder}"], "holds a vit model, not hf:deit; set model.name=hf:vit"),
        (["model.name=hf:{folder}", "model.pretrained={folder}"], "set one of them"),
    ],
)
def test_a_folder_under_another_name_or_twice_is_refused_in_one_line(tmp_path, capsys, overrides, message):
    folder = tmp_path / "folder"
    _saved_vit(folder)
    code, run_dir = _fit(tmp_path, *(o.format(folder=folder) for o in overrides))
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not run_dir.exists()

"""Deployment: ONNX and torch.export files, `vitlab predict`, `vitlab list-configs`, the `--seed` shortcut."""

import csv
import json
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

import vitlab
import vitlab.export
from run_fixtures import make_run, write_checkpoint
from vitlab.cli.main import main
from vitlab.evaluation.predict import load_predictor
from vitlab.export import export_model
from vitlab.export_formats import ClassifierGraph, ExportFormatError, write_format
from vitlab.manifest import MANIFEST_FILE

KWARGS = dict(img_size=16, patch_size=4, in_chans=3, num_classes=3)
INFO = {
    "dataset": "npz",
    "num_classes": 3,
    "in_chans": 3,
    "img_size": 16,
    "mean": [0.5, 0.4, 0.3],
    "std": [0.25, 0.25, 0.25],
    "class_names": ["cat", "dog", "owl"],
}


@pytest.fixture
def checkpoint(tmp_path):
    """A vit_pico checkpoint in the layout `vitlab fit` writes (run/checkpoints/best.ckpt), without training."""
    torch.manual_seed(0)
    model = vitlab.create_model("vit_pico", **KWARGS)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    hp = {"config": {"model": {"name": "vit_pico"}}, "model_kwargs": model.init_kwargs, "data_info": INFO}
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hp}, run / "checkpoints" / "best.ckpt")
    return run, model.eval()


def test_onnx_agrees_with_onnxruntime_on_another_batch_size(tmp_path):
    model = vitlab.create_model("vit_pico", **KWARGS).eval()
    path, diff = write_format(model, export_model(model, tmp_path / "export"), "onnx")
    assert diff <= 1e-4 and path.stat().st_mode & 0o044  # readable by others, as the umask allows
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 5):  # exported with a batch of 2
        x = torch.randn(batch, 3, 16, 16)
        got = session.run(["logits"], {"images": x.numpy()})[0]
        assert got.shape == (batch, 3)
        assert np.abs(got - model(x).detach().numpy()).max() <= 1e-4
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == [MANIFEST_FILE]  # no staging file left


def test_torch_export_program_and_vitcae_classifier(tmp_path):
    cae = vitlab.create_model("vitcae_pico", **KWARGS).eval()
    path, _ = write_format(cae, tmp_path, "torch-export")
    program = torch.export.load(str(path)).module()
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(program(x), cae(x).logits, atol=1e-5, rtol=1e-5)


def test_a_model_that_cannot_be_traced_says_why(tmp_path, monkeypatch):
    model = vitlab.create_model("vit_pico", **KWARGS).eval()

    def data_dependent(x):  # Python control flow on a tensor value: torch.export cannot capture it
        return model.head(x[:, 0]) if float(x.sum()) > 0 else -model.head(x[:, 0])

    monkeypatch.setattr(model, "forward_head", data_dependent)
    with pytest.raises(ExportFormatError, match=r"vit_pico \(VisionTransformer\) cannot be written as torch-export"):
        write_format(model, tmp_path, "torch-export")
    assert not list(tmp_path.iterdir())


def test_cli_export_format_onnx(checkpoint, capsys):
    run, model = checkpoint
    assert main(["export", str(run), "--format", "onnx"]) == 0
    assert "model.onnx" in capsys.readouterr().out
    session = ort.InferenceSession(str(run / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 16, 16)
    want = ClassifierGraph(model)(x).detach().numpy()
    assert np.abs(session.run(None, {"images": x.numpy()})[0] - want).max() <= 1e-4


def _write_images(folder, count):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        size = (20 + i, 16) if i % 2 else (16, 16)  # also a non-square image: resized and centre-cropped
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / f"img{i}.png")


def test_export_force_removes_its_earlier_onnx_and_refuses_to_replace_a_users(checkpoint, capsys):
    run, _ = checkpoint
    onnx, weights = run / "export" / "model.onnx", run / "export" / "model.safetensors"
    assert main(["export", str(run), "--format", "onnx"]) == 0 and onnx.is_file()
    assert main(["export", str(run), "--force"]) == 0
    assert not onnx.exists() and weights.is_file(), "the earlier export's model.onnx would pass for this model"

    onnx.write_bytes(b"the user's own model")
    before = {p.name: p.read_bytes() for p in onnx.parent.iterdir()}
    capsys.readouterr()
    assert main(["export", str(run), "--force", "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "model.onnx, which vitlab did not write" in err.splitlines()[0] and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in onnx.parent.iterdir()} == before, "nothing is written on a refusal"
    assert main(["export", str(run), "--force"]) == 0 and onnx.read_bytes() == b"the user's own model"


def test_predict_folder_to_csv_and_skips_bad_files(checkpoint, tmp_path, capsys):
    run, model = checkpoint
    images = tmp_path / "images"
    _write_images(images / "sub", 5)
    (images / "broken.png").write_bytes(b"not an image at all")
    (images / "notes.txt").write_text("not an image, not looked at")
    out = tmp_path / "pred.csv"
    code = main(["predict", str(run), str(images), "--topk", "2", "--batch-size", "2", "--out", str(out)])
    assert code == 0
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "broken.png" in captured.err and "notes.txt" not in captured.err
    table = list(csv.DictReader(out.open()))
    assert [r["path"].split("/")[-1] for r in table] == [f"img{i}.png" for i in range(5)]
    assert set(table[0]) == {"path", "top1", "prob1", "top2", "prob2"}
    # the same numbers as the model on the evaluation preprocessing (resize + centre crop, the run's mean/std)
    from vitlab.evaluation.predict import normalise, read_image

    x = normalise(torch.stack([read_image(images / "sub" / f"img{i}.png", INFO) for i in range(5)]), INFO)
    probs = model(x).softmax(-1).detach()
    for row, p in zip(table, probs, strict=True):
        assert row["top1"] == INFO["class_names"][int(p.argmax())]
        assert abs(float(row["prob1"]) - float(p.max())) < 1e-5
        assert float(row["prob1"]) >= float(row["prob2"])


def test_predict_json_lines_from_an_export_and_only_bad_files(checkpoint, tmp_path, capsys):
    run, _ = checkpoint
    assert main(["export", str(run)]) == 0
    _write_images(tmp_path / "one", 1)
    out = tmp_path / "pred.jsonl"
    assert main(["predict", str(run / "export"), str(tmp_path / "one" / "img0.png"), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["top3"] in INFO["class_names"] and "top4" not in record  # k capped at the 3 classes
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 truncated")
    assert main(["predict", str(run), str(bad)]) == 2
    assert "none of the 1 files given is a readable image" in capsys.readouterr().err


def test_list_configs_and_seed_shortcut(capsys):
    assert main(["list-configs", "vitcae"]) == 0
    out = capsys.readouterr().out
    assert "vitcae/digits" in out and "vit/digits " not in out
    assert main(["--seed", "7", "fit", "--config", "vit/digits", "--print-config"]) == 0
    assert "seed: 7" in capsys.readouterr().out
    assert main(["fit", "--config", "vit/digits", "--seed", "11", "--print-config"]) == 0
    assert "seed: 11" in capsys.readouterr().out


def test_predict_reads_a_checkpoint_once(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    expected = write_checkpoint(run)
    reads = []
    real = vitlab.export.torch.load
    monkeypatch.setattr(vitlab.export.torch, "load", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    model, info = load_predictor(run / "checkpoints" / "best.ckpt")
    assert len(reads) == 1 and not model.training and info["num_classes"] == expected.head.out_features
    x = torch.randn(2, info["in_chans"], info["img_size"], info["img_size"])
    assert torch.equal(model(x), expected.eval()(x))


@pytest.mark.parametrize(
    ("names", "message"),
    [(["cat", "dog"], "names 2 classes, the model has 3"), (["cat", "cat", "owl"], "names 'cat' 2 times")],
)
def test_predict_refuses_class_names_that_do_not_name_the_heads_classes(checkpoint, tmp_path, capsys, names, message):
    run, _ = checkpoint
    assert main(["export", str(run)]) == 0
    config = run / "export" / "config.json"
    meta = json.loads(config.read_text())
    meta["data"]["class_names"] = names
    config.write_text(json.dumps(meta))
    _write_images(tmp_path / "one", 1)
    capsys.readouterr()
    assert main(["predict", str(run / "export"), str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert (
        f"the class_names of {config} {message}" in err and "export the model again" in err and "Traceback" not in err
    )


def test_export_of_a_checkpoint_outside_a_run_asks_for_out(checkpoint, tmp_path, capsys):
    run, _ = checkpoint
    assert main(["export", str(run / "checkpoints" / "best.ckpt")]) == 0
    assert (run / "export" / "model.safetensors").is_file()  # the run that owns checkpoints/
    lone = tmp_path / "dir" / "x.ckpt"
    lone.parent.mkdir()
    (run / "checkpoints" / "best.ckpt").rename(lone)
    capsys.readouterr()
    assert main(["export", str(lone)]) == 2
    err = capsys.readouterr().err
    assert f"{lone} is not in a run's checkpoints/ folder" in err and "pass --out FOLDER" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "run"]  # nothing written beside dir/
    assert main(["export", str(lone), "--out", str(tmp_path / "out")]) == 0


def test_predict_reads_16_bit_images_as_their_8_bit_levels_and_names_a_float_image(checkpoint, tmp_path, capsys):
    from vitlab.evaluation.predict import read_image  # explain reads its images with it too

    eight = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(eight).save(tmp_path / "eight.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "sixteen.png")  # mode I;16
    assert Image.open(tmp_path / "sixteen.png").mode == "I;16"
    assert torch.equal(read_image(tmp_path / "sixteen.png", INFO), read_image(tmp_path / "eight.png", INFO))
    Image.fromarray(eight.astype(np.float32)).save(tmp_path / "float.tiff")
    run, _ = checkpoint
    assert main(["predict", str(run), str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "skipped" in err and "float.tiff" in err and "(PIL mode F) has no agreed range" in err


def _flat_and_blocky(chans=3, size=16):
    """Images of one colour or of four large blocks: many patches alike, so CET-ViT leaves slots empty."""
    flat = torch.tensor([0.0, 2.0, -2.0]).view(3, 1, 1, 1).expand(3, chans, size, size)
    blocks = torch.randn(2, chans, 2, 2, generator=torch.Generator().manual_seed(1))
    return torch.cat([flat, 2 * blocks.repeat_interleave(size // 2, -1).repeat_interleave(size // 2, -2)])


@pytest.mark.parametrize("inputs", ["flat and blocky", "the export check's"])
def test_the_classifier_graph_of_predict_and_export_is_the_models_forward_when_slots_are_empty(inputs):
    from vitlab.export_formats import check_inputs

    torch.manual_seed(0)
    model = vitlab.create_model("cet_vit_nano_global", **KWARGS).eval()
    x = _flat_and_blocky() if inputs == "flat and blocky" else check_inputs(model)
    with torch.no_grad():
        _, aux = model.forward_with_aux(x, compute_ei=False)
        assert (~aux.occupied).any(), "the inputs must reach the path under test: slots no token picks"
        torch.testing.assert_close(ClassifierGraph(model)(x), model(x), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_onnx_of_a_cet_vit_that_masks_empty_slots_gives_its_forward_on_images_that_empty_slots(tmp_path):
    torch.manual_seed(0)
    model = vitlab.create_model("cet_vit_nano_global", **KWARGS).eval()
    x = _flat_and_blocky()
    with torch.no_grad():
        want = model(x)
        _, aux = model.forward_with_aux(x, compute_ei=False)
    assert (~aux.occupied).any(), "the inputs must reach the path under test: slots no token picks"
    path, _ = write_format(model, tmp_path, "onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_export_check_refuses_a_graph_that_differs_only_where_random_images_do_not_reach(tmp_path, monkeypatch):
    import vitlab.export_formats as formats

    model = vitlab.create_model("vit_pico", **KWARGS).eval()
    real = formats.ClassifierGraph.forward

    def wrong_on_flat_images(self, images):  # a branch only images with flat regions reach
        flat = (images.flatten(1).std(1) < 0.5).to(images.dtype)[:, None]
        return real(self, images) + flat

    monkeypatch.setattr(formats.ClassifierGraph, "forward", wrong_on_flat_images)
    with pytest.raises(ExportFormatError, match="differs from the model by 1.00e"):
        write_format(model, tmp_path, "torch-export")
    assert not list(tmp_path.iterdir())


def test_cli_export_checks_the_file_on_the_runs_validation_images(checkpoint, tmp_path, capsys):
    run, _ = checkpoint
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8), np.arange(40) % 3
    np.savez(data, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
    ckpt = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["config"]["data"] = {"name": "npz", "path": str(data), "val_fraction": 0.25}
    torch.save(ckpt, run / "checkpoints" / "best.ckpt")
    assert main(["export", str(run), "--format", "torch-export"]) == 0
    assert "on 10 of the run's validation images and 9 built inputs" in capsys.readouterr().out
    (run / "export").rename(tmp_path / "first")
    data.unlink()  # the data moved away: the built inputs alone
    assert main(["export", str(run), "--format", "torch-export"]) == 0
    assert "on 9 built inputs (no run data)" in capsys.readouterr().out


def test_export_onnx_without_onnxscript_names_the_library_before_writing(checkpoint, monkeypatch, capsys):
    run, _ = checkpoint
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript raises ImportError
    assert main(["export", str(run), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "onnxscript is not installed: pip install 'vitlab[onnx]'" in err and "could not capture" not in err
    assert len(err.strip().splitlines()) == 1 and not (run / "export").exists()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("mean", [float("nan"), 0.4, 0.3], "data.mean[0] = nan, not a finite number"),
        ("std", [0.0, 0.25, 0.25], "data.std = [0.0, 0.25, 0.25], which must be > 0"),
        ("std", [0.25], "data.std = [0.25], not one number per input channel (3)"),
        ("num_classes", 5, "data.num_classes = 5, but the model has 3"),
    ],
)
def test_an_export_whose_config_numbers_are_wrong_is_refused_naming_the_key(
    checkpoint, tmp_path, capsys, key, value, message
):
    run, _ = checkpoint
    assert main(["export", str(run)]) == 0
    config = run / "export" / "config.json"
    meta = json.loads(config.read_text())
    meta["data"][key] = value
    config.write_text(json.dumps(meta))  # json writes NaN as the bare token NaN, which it reads back
    _write_images(tmp_path / "one", 1)
    capsys.readouterr()
    assert main(["predict", str(run / "export"), str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "export the model again" in err and len(err.splitlines()) == 1

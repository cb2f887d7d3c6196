"""``vitlab explain`` end to end on a run trained by the test: overlays and maps for files, and --evaluate."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest

from run_fixtures import TINY, write_png
from vitlab.cli.main import main
from vitlab.explain.run import EXPLAIN_LOCK


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("explain") / "vit-digits"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY]) == 0
    return run_dir


def test_explain_files_writes_overlays_and_maps_then_refuses_to_overwrite(trained_run, tmp_path, capsys) -> None:
    for i in range(2):
        write_png(tmp_path / "images" / f"img{i}.png", shape=(8 + i, 8))
    out = tmp_path / "explained"
    args = ["explain", str(trained_run), str(tmp_path / "images"), "--method", "lrp", "--out", str(out)]
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["img0_lrp.png", "img1_lrp.png", "maps.npz"]
    saved = np.load(out / "maps.npz")
    assert saved["maps"].shape == (2, 8, 8)
    assert saved["conservation"].max() <= 1e-3
    assert main(args) == 2
    assert "exists; pass --force to replace it" in capsys.readouterr().err
    assert main([*args, "--force", "--target", "3"]) == 0
    assert np.load(out / "maps.npz")["target"].tolist() == [3, 3]


def test_explain_names_same_named_images_by_their_folders_and_skips_an_unreadable_one(trained_run, tmp_path, capsys):
    for folder in ("a", "b"):
        write_png(tmp_path / "images" / folder / "cat.png")
    write_png(tmp_path / "images" / "b" / "dog.png")
    (tmp_path / "images" / "b" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "explained"
    assert main(["explain", str(trained_run), str(tmp_path / "images"), "--method", "rollout", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["a__cat_png_rollout.png", "b__cat_png_rollout.png", "dog_rollout.png", "maps.npz"]
    assert len(np.load(out / "maps.npz")["files"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"skipped {tmp_path / 'images' / 'b' / 'broken.png'}: not a readable image")
    assert err[1] == "1 of 4 files skipped"


def test_explain_refuses_an_out_that_is_a_file_in_one_line(trained_run, tmp_path, capsys) -> None:
    write_png(tmp_path / "a.png")
    (tmp_path / "out.txt").write_text("mine")
    args = ["explain", str(trained_run), str(tmp_path / "a.png"), "--method", "rollout", "--out"]
    assert main([*args, str(tmp_path / "out.txt")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("vitlab explain: error:")]
    assert "Traceback (most recent" not in err and len(errors) == 1 and "is a file, not a folder" in errors[0]
    assert (tmp_path / "out.txt").read_text() == "mine"
    assert main(["explain", str(trained_run), "--evaluate", "--out", str(tmp_path / "out.txt")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_explain_keeps_no_figure_open(trained_run, tmp_path) -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
    for i in range(3):
        write_png(tmp_path / "images" / f"img{i}.png")
    args = ["explain", str(trained_run), str(tmp_path / "images"), "--method", "rollout", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    assert plt.get_fignums() == [], "each figure is freed once saved"


def test_explain_evaluate_writes_the_table_figures_and_per_image_values(trained_run, tmp_path, capsys) -> None:
    out = tmp_path / "evaluation"
    args = ["explain", str(trained_run), "--evaluate", "--num-images", "4", "--methods", "rollout", "lrp"]
    assert main([*args, "--out", str(out)]) == 0
    assert "| rollout |" in capsys.readouterr().out
    results = json.loads((out / "explain_evaluation.json").read_text())
    assert set(results["methods"]) == {"rollout", "lrp"}
    lrp = results["methods"]["lrp"]
    assert len(lrp["per_image"]["deletion_auc"]) == 4
    assert max(lrp["per_image"]["conservation"]) <= 1e-3
    assert set(results["environment"]["git"]) == {"revision", "dirty"}  # the revision is None outside a git checkout
    for name in ("explain_faithfulness.png", "explain_overlays.png", "explain_evaluation.md"):
        assert (out / name).stat().st_size > 0


def test_explain_refuses_bad_requests_in_one_line_before_writing(trained_run, tmp_path, capsys) -> None:
    write_png(tmp_path / "a.png")
    out = tmp_path / "o"
    assert main(["explain", str(trained_run), str(tmp_path / "a.png"), "--out", str(out)]) == 2
    assert "name IMAGES, --method and --out" in capsys.readouterr().err
    image = str(tmp_path / "a.png")
    assert main(["explain", str(trained_run), image, "--method", "lrp", "--target", "12", "--out", str(out)]) == 2
    assert "target classes must lie in [0, 10)" in capsys.readouterr().err
    assert not out.exists()


def test_class_names_caption_the_overlays_and_must_name_every_class(trained_run, tmp_path, capsys, monkeypatch) -> None:
    import vitlab.explain.run as run

    captions: list[list[str]] = []
    real = run.overlay_grid
    monkeypatch.setattr(run, "overlay_grid", lambda x, maps, caps: captions.append(list(caps)) or real(x, maps, caps))
    write_png(tmp_path / "images" / "a.png")
    out = tmp_path / "named"
    names = ",".join(f"c{i}" for i in range(10))
    image = str(tmp_path / "images")
    assert main(["explain", str(trained_run), image, "--method", "lrp", "--out", str(out), "--class-names", names]) == 0
    assert captions[-1][0].startswith("class c")
    assert (
        main(
            [
                "explain",
                str(trained_run),
                image,
                "--method",
                "lrp",
                "--out",
                str(tmp_path / "x"),
                "--class-names",
                "a,b",
            ]
        )
        == 2
    )
    assert "--class-names names 2 classes, the model has 10" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_second_explain_into_the_same_folder_at_once_is_refused(trained_run, tmp_path, capsys) -> None:
    write_png(tmp_path / "images" / "img0.png")
    out = tmp_path / "explained"
    out.mkdir()
    lock = out / EXPLAIN_LOCK
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live explain holds the folder
    args = ["explain", str(trained_run), str(tmp_path / "images"), "--method", "attention", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()[0]
    assert "explain folder" in err and "is being written by vitlab process" in err and str(lock) in err
    assert [p.name for p in out.iterdir()] == [EXPLAIN_LOCK], "nothing written beside a live lock"
    lock.unlink()
    assert main(args) == 0 and (out / "maps.npz").is_file() and not lock.exists()


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_explain_takes_a_timm_model_by_name_with_a_local_weights_file(tmp_path, capsys, suffix: str) -> None:
    import timm
    import torch
    from safetensors.torch import save_file

    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32)
    weights = tmp_path / f"deit{suffix}"
    if suffix == ".safetensors":
        save_file(model.state_dict(), weights)
    else:
        torch.save({"state_dict": model.state_dict()}, weights)
    write_png(tmp_path / "a.png", shape=(20, 24))
    out = tmp_path / "o"
    args = ["explain", "--model", "timm:deit_tiny_patch16_224", str(tmp_path / "a.png"), "--method", "lrp"]
    assert main([*args, "--weights", str(weights), "--img-size", "32", "--out", str(out)]) == 0
    saved = np.load(out / "maps.npz")
    assert saved["maps"].shape == (1, 32, 32)
    assert saved["conservation"].max() <= 1e-3
    assert main([*args, "--img-size", "32", "--out", str(tmp_path / "x")]) == 2
    assert "needs --weights FILE" in capsys.readouterr().err
    assert main([*args, "--weights", str(weights), "--out", str(tmp_path / "x")]) == 2
    assert "do not fit timm:deit_tiny_patch16_224" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("weights", "img_size", "expected"),
    [
        (b"garbage, not a safetensors file", "32", "deit.safetensors cannot be read (SafetensorError: "),
        (None, "0", "--img-size must be at least 1, got 0; pass the model's input size, or leave it out"),
        (None, "17", "--img-size 17 is not a multiple of timm:deit_tiny_patch16_224's patch size 16; pass a multiple"),
    ],
    ids=["garbage-weights", "img-size-0", "img-size-17"],
)
def test_a_timm_model_with_bad_weights_or_size_is_one_line_naming_the_problem(
    tmp_path, capsys, weights, img_size, expected
):
    import timm
    from safetensors.torch import save_file

    path = tmp_path / "deit.safetensors"
    if weights is None:
        save_file(timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32).state_dict(), path)
    else:
        path.write_bytes(weights)
    write_png(tmp_path / "a.png", shape=(20, 24))
    argv = ["explain", "--model", "timm:deit_tiny_patch16_224", str(tmp_path / "a.png"), "--method", "lrp"]
    assert main([*argv, "--weights", str(path), "--img-size", img_size, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert expected in err.splitlines()[0] and "Traceback" not in err and not (tmp_path / "o").exists()


def test_a_method_the_rules_refuse_is_refused_before_any_work(trained_run, tmp_path, capsys, monkeypatch) -> None:
    """The logits plus their own sign (an operation held constant in a sum): no declaration says LRP does not apply,
    its rules find it; ``--method lrp`` and ``--evaluate --methods lrp`` are one line before any folder exists."""
    from vitlab.models.vit import VisionTransformer

    head = VisionTransformer.forward_head
    monkeypatch.setattr(VisionTransformer, "forward_head", lambda self, x, **kw: (y := head(self, x, **kw)) + y.sign())
    write_png(tmp_path / "a.png")
    out = tmp_path / "o"
    assert main(["explain", str(trained_run), str(tmp_path / "a.png"), "--method", "lrp", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "lrp does not apply to vit: the output of sign" in err and len(err.strip().splitlines()) == 1
    assert (
        main(["explain", str(trained_run), "--evaluate", "--methods", "lrp", "--num-images", "2", "--out", str(out)])
        == 2
    )
    assert "lrp does not apply to vit: the output of sign" in capsys.readouterr().err
    assert not out.exists()

"""Image files are read as a viewer shows them (EXIF orientation applied) by every reader, training, ``predict`` and
``explain``; an image PIL refuses (a decompression bomb included) is one line: a skip where files are given, exit 2
where data is loaded strictly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_fixtures import write_imagefolder
from run_fixtures import TINY, make_run
from vitlab.cli.main import main
from vitlab.data import DataConfig, build_datamodule
from vitlab.data.config import DataError
from vitlab.data.sources import read_image_file
from vitlab.evaluation.predict import load_predictor, predict
from vitlab.explain.run import explain_files

ORIENTATION = 0x0112  # the EXIF tag
#: an upright picture, 16 rows x 8 columns, bright above and dark below, in 8x8 blocks that JPEG keeps exactly
UPRIGHT = np.concatenate([np.full((8, 8), 230, np.uint8), np.full((8, 8), 20, np.uint8)])


def _jpegs(folder: Path) -> tuple[Path, Path, Path]:
    """The upright picture, the same stored rotated with Orientation=6 ("rotate 90 degrees clockwise to show", as a
    phone stores a portrait photo), and those rotated pixels without the tag."""
    folder.mkdir(parents=True, exist_ok=True)
    upright, rotated, untagged = folder / "upright.jpg", folder / "rotated.jpg", folder / "untagged.jpg"
    Image.fromarray(UPRIGHT).save(upright, quality=100)
    stored = Image.fromarray(UPRIGHT).transpose(Image.Transpose.ROTATE_90)  # what the camera stores: 8 rows x 16
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    stored.save(rotated, quality=100, exif=exif)
    stored.save(untagged, quality=100)
    return upright, rotated, untagged


def test_a_jpeg_stored_rotated_is_read_upright(tmp_path):
    upright, rotated, untagged = _jpegs(tmp_path)
    with Image.open(rotated) as raw:
        assert raw.size == (16, 8), "the file's own pixels lie on their side"
    shown = read_image_file(rotated, "L")
    assert shown.shape == (1, 16, 8)
    assert (shown.int() - read_image_file(upright, "L").int()).abs().max() <= 2
    assert read_image_file(untagged, "L").shape == (1, 8, 16)


def test_predict_and_explain_see_the_rotated_jpeg_as_the_upright_one(tmp_path):
    upright, rotated, untagged = _jpegs(tmp_path / "images")
    run = make_run(tmp_path, seed=3)
    model, info = load_predictor(run)
    probs = {Path(p.path).name: np.array(p.probs) for p in predict(model, info, [upright, rotated, untagged], topk=3)}
    seen_upright = np.abs(probs["rotated.jpg"] - probs["upright.jpg"]).max()
    seen_on_its_side = np.abs(probs["untagged.jpg"] - probs["upright.jpg"]).max()
    assert seen_upright < seen_on_its_side / 100, "the untrained model does tell the orientations apart"
    explain_files(run, [upright, rotated], method="rollout", out_dir=tmp_path / "maps")
    maps = np.load(tmp_path / "maps" / "maps.npz")["maps"]
    assert np.abs(maps[0] - maps[1]).max() < 1e-3


def test_imagefolder_training_reads_the_rotated_jpeg_upright(tmp_path):
    for name in ("a", "b"):
        for i in range(3):
            _jpegs(tmp_path / "pets" / name / str(i))
    datamodule = build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "pets"), root=str(tmp_path)))
    datamodule.setup("fit")
    pool = datamodule.train_set.pool
    read = {pool.paths[i].name: pool[i][0] for i in range(len(pool))}
    assert read["rotated.jpg"].shape == read["upright.jpg"].shape == (1, 8, 8)


@pytest.fixture
def bomb_limit(monkeypatch):
    """PIL's decompression-bomb limit lowered to 64 pixels (refused above 128), so that a 16x16 image is one."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64)


def test_a_decompression_bomb_is_one_line_and_a_skip_in_predict_and_explain(tmp_path, capsys, bomb_limit):
    run = make_run(tmp_path)
    images = tmp_path / "images"
    write_imagefolder(images, {"": 1}, size=(8, 8), gray=True)  # 64 pixels: read
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(images / "bomb.png")
    for argv in (
        ["predict", str(run), str(images)],
        ["explain", str(run), str(images), "--method", "rollout", "--out", str(tmp_path / "x")],
    ):
        assert main(argv) == 0
        err = capsys.readouterr().err
        line = next(line for line in err.splitlines() if "bomb.png" in line)
        assert line.startswith(f"skipped {images / 'bomb.png'}: not a readable image") and "Traceback" not in err
        assert "exceeds limit of 128 pixels" in line and "PIL.Image.MAX_IMAGE_PIXELS" in line
        assert "1 of 3 files skipped" in err


def test_a_decompression_bomb_in_training_data_is_named_with_its_limit(tmp_path, capsys, bomb_limit):
    write_imagefolder(tmp_path / "pets", {"": 4}, size=(8, 8), gray=True)
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "pets" / "cat" / "bomb.png")
    with pytest.raises(DataError, match=r"bomb.png \(DataError: Image size \(256 pixels\) exceeds limit of 128 pixels"):
        build_datamodule(DataConfig(name="imagefolder", path=str(tmp_path / "pets"), strict_images=True)).setup("fit")
    argv = ["fit", "--config", "vit/digits", "data.name=imagefolder", f"data.path={tmp_path / 'pets'}", *TINY]
    assert main([*argv, "data.strict_images=true", f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "decompression bomb" in err and not (tmp_path / "run").exists()

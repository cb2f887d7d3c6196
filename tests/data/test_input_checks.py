"""Everything a run needs is checked before its folder is made: the data (images and labels agree in count, dtype,
range and layout; classes are non-empty and at least two; every split has an image), the model (its classes cover
the labels), the memory of a first batch, and the config (YAML syntax, defaults, every section typed). Each bad
input is one line on stderr, exit code 2, and no run folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_fixtures import random_images, write_imagefolder
from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.config import ConfigError, build_config, load_yaml
from vitlab.data import DataConfig, build_datamodule

FIT = ["fit", "--config", "vit/digits", "trainer.max_epochs=1", *TINY]


def _refused(capsys, tmp_path: Path, *overrides: str) -> str:
    """Run ``vitlab fit`` with ``overrides``; assert it is refused in one clean line and made no run folder."""
    run_dir = tmp_path / "run"
    rc = main([*FIT, f"run.dir={run_dir}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert not run_dir.exists(), "a refused run made its folder"
    lines = [line for line in err.splitlines() if line.startswith("vitlab fit: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _npz(path: Path, *, x_train=None, y_train=None, x_test=None, y_test=None, **extra) -> str:
    x = random_images(40, 8, 8, None, seed=0)
    y = np.arange(40) % 4
    arrays = {
        "x_train": x if x_train is None else x_train,
        "y_train": y if y_train is None else y_train,
        "x_test": x[:20] if x_test is None else x_test,
        "y_test": y[:20] if y_test is None else y_test,
    }
    np.savez(path, **arrays, **extra)
    return f"data.path={path}"


# -- npz ---------------------------------------------------------------------------------------------------------------
def test_npz_images_and_labels_must_match_in_count(tmp_path, capsys):
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "a.npz", y_train=np.arange(30) % 4))
    assert "40 images in x_train but 30 labels in y_train" in line
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "b.npz", y_train=np.arange(50) % 4))
    assert "40 images in x_train but 50 labels" in line


def test_npz_float_labels_are_whole_numbers_or_refused(tmp_path, capsys):
    probabilities = np.random.default_rng(0).random(40)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "p.npz", y_train=probabilities))
    assert "floats that are not whole numbers" in line and "argmax" in line
    whole = (np.arange(40) % 4).astype(np.float32)
    dm = build_datamodule(DataConfig(name="npz", path=str(_npz(tmp_path / "w.npz", y_train=whole)[10:])))
    dm.setup()
    assert dm.num_classes == 4 and dm.train_set.pool.labels.dtype.is_floating_point is False


def test_npz_label_ranges_are_checked(tmp_path, capsys):
    sparse = (np.arange(40) % 4) * 100  # labels 0, 100, 200, 300: a 301-way head
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "s.npz", y_train=sparse, y_test=sparse[:20]))
    assert "uses 4 of the labels 0..300" in line and "np.unique" in line
    unseen = np.arange(20) % 5  # label 4 is in no training image
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "u.npz", y_test=unseen))
    assert "y_test has 1 label(s) outside the training classes 0..3 (4)" in line
    named = _npz(tmp_path / "n.npz", y_train=np.arange(40) % 3, class_names=np.array(["a", "b", "c", "d"]))
    dm = build_datamodule(DataConfig(name="npz", path=named[10:]))
    dm.setup()
    assert dm.num_classes == 4, "class_names keeps a class the training set lacks"


def test_npz_class_names_must_be_distinct(tmp_path, capsys):
    twice = _npz(tmp_path / "t.npz", class_names=np.array(["a", "b", "a", "c"]))
    line = _refused(capsys, tmp_path, "data.name=npz", twice)
    assert "the class_names of" in line and "names 'a' 2 times; give each class its own name" in line


def test_model_num_classes_must_cover_the_labels(tmp_path, capsys):
    line = _refused(capsys, tmp_path, "model.num_classes=5")
    assert "model.num_classes=5 but the data has 10 classes" in line


def test_npz_channels_are_gray_or_rgb_and_the_same_in_every_split(tmp_path, capsys):
    gray, rgb = random_images(40, 8, 8, None, seed=0), random_images(20, 8, 8, 3, seed=1)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "m.npz", x_train=gray, x_test=rgb))
    assert "the splits differ in channels (x_train 1, x_test 3)" in line
    four = random_images(40, 8, 8, 4, seed=0)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "f.npz", x_train=four, x_test=four[:20]))
    assert "x_train has 4 channels" in line and "x[..., :3]" in line


def test_npz_layout_problems_are_named(tmp_path, capsys):
    nchw = random_images(40, 8, 8, 3, seed=0).transpose(0, 3, 1, 2)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "c.npz", x_train=nchw, x_test=nchw[:20]))
    assert "looks like NCHW" in line and "transpose(0, 2, 3, 1)" in line
    (tmp_path / "text.npz").write_text("not a zip")
    line = _refused(capsys, tmp_path, "data.name=npz", f"data.path={tmp_path / 'text.npz'}")
    assert "is not an .npz file" in line and "pickled" not in line
    (tmp_path / "folder.npz").mkdir()
    line = _refused(capsys, tmp_path, "data.name=npz", f"data.path={tmp_path / 'folder.npz'}")
    assert "is a folder" in line


def test_npz_of_python_objects_and_of_the_wrong_shape_say_what_to_save_instead(tmp_path, capsys):
    names = np.array(["cat", "dog", "owl", "emu"], dtype=object)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "o.npz", class_names=names))
    assert "class_names of" in line and "array of Python objects (dtype=object)" in line
    assert "np.array(names, dtype=str)" in line
    flat = random_images(40, 8, 8, None, seed=0).reshape(40, 64)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "s.npz", x_train=flat, x_test=flat[:20]))
    assert "got shape [40, 64] (2 axes)" in line and "uint8" not in line, "a shape problem is not a dtype problem"


def test_npz_naming_a_class_without_training_images_says_so_once(tmp_path, capsys):
    labels = np.arange(40) % 3  # classes 0, 1, 2 of the four named
    names = np.array(["cat", "dog", "owl", "emu"])
    cfg = DataConfig(
        name="npz", path=_npz(tmp_path / "n.npz", y_train=labels, y_test=labels[:20], class_names=names)[10:]
    )
    for _ in range(2):
        datamodule = build_datamodule(cfg)
        datamodule.setup("fit")
    assert datamodule.num_classes == 4
    lines = [line for line in capsys.readouterr().err.splitlines() if "classes its class_names names" in line]
    assert lines == [
        f"npz {tmp_path / 'n.npz'}: y_train uses 3 of the 4 classes its class_names names; the model gets a 4-way "
        "head, as the file says, and never learns the classes without a training image (to train a 3-way one, drop "
        "their names and remap the labels)"
    ]


# -- image folders and tiny data ---------------------------------------------------------------------------------------
def test_image_folder_classes_are_non_empty_and_at_least_two(tmp_path, capsys):
    write_imagefolder(tmp_path / "pets", {"": 6}, size=(8, 8), gray=True)
    (tmp_path / "pets" / "empty").mkdir()
    line = _refused(capsys, tmp_path, "data.name=imagefolder", f"data.path={tmp_path / 'pets'}")
    assert f"{tmp_path / 'pets' / 'empty'} holds no readable image" in line
    write_imagefolder(tmp_path / "one", {"": 6}, classes=("cat",), size=(8, 8), gray=True)
    line = _refused(capsys, tmp_path, "data.name=imagefolder", f"data.path={tmp_path / 'one'}")
    assert "has one class folder (cat)" in line and "at least two" in line


def test_tiny_data_without_validation_or_test_images_is_refused(tmp_path, capsys):
    write_imagefolder(tmp_path / "two", {"": 1}, size=(8, 8), gray=True)
    line = _refused(capsys, tmp_path, "data.name=imagefolder", f"data.path={tmp_path / 'two'}")
    assert "gives 2 training, 0 validation and 0 test images" in line or "leaves none to train on" in line
    write_imagefolder(tmp_path / "few", {"": 3}, size=(8, 8), gray=True)
    line = _refused(capsys, tmp_path, "data.name=imagefolder", f"data.path={tmp_path / 'few'}")
    assert "0 validation" in line and "data.val_fraction" in line


def test_a_single_class_npz_is_refused(tmp_path, capsys):
    zeros = np.zeros(40, np.int64)
    line = _refused(capsys, tmp_path, "data.name=npz", _npz(tmp_path / "z.npz", y_train=zeros, y_test=zeros[:20]))
    assert "at least two classes" in line


# -- config and resources ----------------------------------------------------------------------------------------------
def test_max_epochs_zero_is_refused(tmp_path, capsys):
    line = _refused(capsys, tmp_path, "trainer.max_epochs=0")
    assert "trainer.max_epochs must be >= 1" in line and "vitlab test RUN" in line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optim.lr=-1e-3", "optim.lr must be > 0"),
        ("optim.schedule=cosin", "optim.schedule must be one of"),
        ("optim.label_smoothing=1.5", "optim.label_smoothing must be in [0, 1)"),
        ("data.img_size=100000", "more than this machine's"),
        ("trainer.strategy=ddpp", "the trainer.* settings are not valid for Lightning"),
    ],
)
def test_bad_settings_are_one_line(tmp_path, capsys, override, expected):
    assert expected in _refused(capsys, tmp_path, override)


def test_yaml_syntax_errors_name_the_file_and_line(tmp_path, capsys):
    (tmp_path / "tab.yaml").write_text("trainer:\n\tmax_epochs: 2\n")
    (tmp_path / "bracket.yaml").write_text("model: {name: vit_pico\n")
    for name, expected in (("tab.yaml", "tabs"), ("bracket.yaml", "line")):
        rc = main(["fit", "--config", str(tmp_path / name), f"run.dir={tmp_path / 'run'}"])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and f"{tmp_path / name}, line" in err and expected in err, err
    assert not (tmp_path / "run").exists()


def test_defaults_that_include_themselves_are_one_line(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"defaults include themselves \(a.yaml -> b.yaml -> a.yaml\)"):
        load_yaml(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="include themselves"):
        build_config(str(tmp_path / "b.yaml"))


def test_evaluate_severities_outside_one_to_five_are_one_line(tmp_path, capsys):
    rc = main(["evaluate", str(tmp_path), "--severities", "9"])
    err = capsys.readouterr().err
    assert rc == 2 and "--severities takes corruption severities 1..5, got 9" in err and "Traceback" not in err


def test_no_validation_set_trains_quietly_with_the_last_epoch_as_best(tmp_path, capfd):
    run_dir = tmp_path / "run"
    assert main([*FIT, f"run.dir={run_dir}", "data.val_fraction=0", "trainer.max_epochs=2", "run.export=false"]) == 0
    out, err = capfd.readouterr()
    assert "no validation set (data.val_fraction=0): best.ckpt is the last epoch's" in out
    for noise in ("could not find the monitored key", "Total length of `DataLoader`", "Warning"):
        assert noise not in out + err, noise
    assert (run_dir / "checkpoints" / "best.ckpt").is_file() and (run_dir / "test_metrics.json").is_file()
    line = _refused(capfd, tmp_path / "plateau", "data.val_fraction=0", "optim.schedule=plateau")
    assert "leaves no validation set" in line

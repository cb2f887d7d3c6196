"""``data.name=hf``: a Hugging Face ``datasets`` folder (``save_to_disk``) or parquet files train as any dataset does,
with the image and label columns found by feature type or name, class names from the ``ClassLabel``, images decoded
per item; every bad input is one line, exit code 2, and no run folder."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from data_fixtures import random_images
from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.data import DataConfig, build_datamodule
from vitlab.data.config import DataError
from vitlab.data.datasets import load_dataset

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

FIT = ["fit", "--config", "vit/digits", "trainer.max_epochs=1", *TINY]
NAMES = ["cat", "dog", "fox", "owl"]


def _pngs(count: int, seed: int = 0, channels: int | None = None) -> list[Image.Image]:
    return [Image.fromarray(x) for x in random_images(count, 8, 8, channels, seed)]


def _dataset(count: int = 40, *, seed: int = 0, names: list[str] | None = NAMES, **columns: list) -> datasets.Dataset:
    """``count`` 8x8 gray PNGs in an ``Image`` column ``image`` and labels ``0..3`` in a ``ClassLabel`` column
    ``label`` (a plain integer column when ``names`` is None); ``columns`` replace or add columns."""
    values = {"image": _pngs(count, seed), "label": [i % 4 for i in range(count)], **columns}
    dataset = datasets.Dataset.from_dict(values)  # PIL images make an Image column
    return dataset.cast_column("label", datasets.ClassLabel(names=names)) if names else dataset


def _refused(capsys, tmp_path: Path, *overrides: str) -> str:
    """``vitlab fit`` with ``overrides`` is refused in one clean line and makes no run folder; that line."""
    run_dir = tmp_path / "run"
    rc = main([*FIT, f"run.dir={run_dir}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert not run_dir.exists(), "a refused run made its folder"
    lines = [line for line in err.splitlines() if line.startswith("vitlab fit: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_saved_dataset_dict_trains_tests_and_keeps_its_class_names(tmp_path):
    folder = tmp_path / "pets"
    datasets.DatasetDict(train=_dataset(), test=_dataset(12, seed=1)).save_to_disk(str(folder))
    run_dir = tmp_path / "run"
    assert main([*FIT, f"data.name=hf:{folder}", f"run.dir={run_dir}"]) == 0
    config = (run_dir / "config.yaml").read_text()
    assert "name: hf\n" in config and f"path: {folder}\n" in config, "the run's config names the files once"
    exported = json.loads((run_dir / "export" / "config.json").read_text())
    assert exported["data"]["class_names"] == NAMES
    assert main(["test", str(run_dir)]) == 0, "the run's config reloads the data by name"
    dm = build_datamodule(DataConfig(name="hf", path=str(folder)))
    dm.setup()
    assert len(dm.test_set) == 12, "the dataset's own test split is the test set"


def test_parquet_files_train_with_labels_given_as_strings(tmp_path):
    species = [NAMES[i % 4] for i in range(40)]
    _dataset(names=None, label=species).to_parquet(str(tmp_path / "pets.parquet"))
    run_dir = tmp_path / "run"
    assert main([*FIT, "data.name=hf", f"data.path={tmp_path / 'pets.parquet'}", f"run.dir={run_dir}"]) == 0
    assert json.loads((run_dir / "export" / "config.json").read_text())["data"]["class_names"] == sorted(NAMES)


def test_a_parquet_folder_in_the_hub_layout_gives_its_splits(tmp_path):
    (tmp_path / "data").mkdir()
    _dataset().to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    _dataset(8, seed=2).to_parquet(str(tmp_path / "data" / "validation-00000-of-00001.parquet"))
    _dataset(12, seed=1).to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"))
    source = load_dataset(DataConfig(name="hf", path=str(tmp_path)))
    assert (len(source.train), len(source.val), len(source.test)) == (40, 8, 12)
    assert source.class_names == NAMES, "the ClassLabel survives parquet (the schema's metadata)"
    image, label = source.test[3]
    expected = np.asarray(_pngs(12, seed=1)[3])
    assert label == 3 and (image[0].numpy() == expected).all()
    as_rgb = load_dataset(DataConfig(name="hf", path=str(tmp_path), in_chans=3))
    assert as_rgb.train.in_chans == 3 and as_rgb.train[0][0].shape == (3, 8, 8), "data.in_chans converts them"


def test_columns_are_found_by_name_or_chosen(tmp_path):
    pixels = list(random_images(40, 8, 8, 3, seed=0))
    plain = datasets.Dataset.from_dict({"pixel_values": pixels, "labels": [i % 2 for i in range(40)]})
    plain.save_to_disk(str(tmp_path / "plain"))
    source = load_dataset(DataConfig(name="hf", path=str(tmp_path / "plain")))
    assert source.train.in_chans == 3 and source.class_names == ["0", "1"]
    assert (source.train[5][0].numpy() == pixels[5].transpose(2, 0, 1)).all(), "a uint8 array column is the image"
    odd = _dataset().rename_columns({"image": "photo", "label": "species"})
    odd = odd.cast_column("species", datasets.Value("int64")).add_column("kind", [i % 2 for i in range(40)])
    odd.save_to_disk(str(tmp_path / "odd"))
    chosen = DataConfig(name="hf", path=str(tmp_path / "odd"), label_column="kind")
    assert load_dataset(chosen).class_names == ["0", "1"]
    with pytest.raises(DataError, match="no label column .* Name it with data.label_column="):
        load_dataset(DataConfig(name="hf", path=str(tmp_path / "odd"), image_column="photo", label_column=None))


def test_images_are_decoded_per_item_from_memory_mapped_files(tmp_path):
    png = _pngs(1)[0]
    buffer = io.BytesIO()
    png.save(buffer, format="PNG")
    truncated = {"bytes": buffer.getvalue()[:60], "path": None}  # its header reads, its pixels do not
    rows = _dataset().cast_column("image", datasets.Image(decode=False)).to_list()
    rows[7]["image"] = truncated
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(tmp_path / "pets"))
    source = load_dataset(DataConfig(name="hf", path=str(tmp_path / "pets")))
    assert isinstance(source.train.cells.data, datasets.table.MemoryMappedTable), "the Arrow file is not read in"
    assert len(source.train) == 40, "set-up reads the headers only"
    with pytest.raises(DataError, match="cannot read the image of row 7"):
        source.train[7]


def test_unreadable_images_are_skipped_with_a_line_or_refused_when_strict(tmp_path, capsys):
    rows = _dataset().cast_column("image", datasets.Image(decode=False)).to_list()
    rows[3]["image"] = {"bytes": b"not an image", "path": None}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(tmp_path / "pets"))
    source = load_dataset(DataConfig(name="hf", path=str(tmp_path / "pets")))
    assert len(source.train) == 39 and 3 not in source.train.rows.tolist()
    assert "skipped 1 unreadable image of 40 (e.g. row 3: UnidentifiedImageError" in capsys.readouterr().err
    line = _refused(capsys, tmp_path, f"data.name=hf:{tmp_path / 'pets'}", "data.strict_images=true")
    assert "cannot read the image of row 3 (UnidentifiedImageError" in line and "data.strict_images=false" in line


def _save(tmp_path: Path, name: str, data: datasets.Dataset | datasets.DatasetDict) -> str:
    data.save_to_disk(str(tmp_path / name))
    return f"data.name=hf:{tmp_path / name}"


def test_bad_hf_data_is_one_line_before_the_run_folder(tmp_path, capsys):
    line = _refused(capsys, tmp_path, "data.name=hf")
    assert "hf: no dataset given. Point data.path= at a folder written by Dataset.save_to_disk" in line
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("text")
    assert "is neither a save_to_disk folder" in _refused(capsys, tmp_path, f"data.name=hf:{tmp_path / 'notes'}")
    (tmp_path / "text.parquet").write_text("not parquet")
    assert "cannot read" in _refused(capsys, tmp_path, f"data.name=hf:{tmp_path / 'text.parquet'}")
    edited = _save(tmp_path, "edited", _dataset())
    (tmp_path / "edited" / "state.json").write_text("{")
    line = _refused(capsys, tmp_path, edited)
    assert "cannot read" in line and "as a save_to_disk folder" in line
    line = _refused(capsys, tmp_path, f"data.name=hf:{tmp_path}/x", f"data.path={tmp_path}/y")
    assert "give one of them: data.name=hf:PATH, or data.name=hf with data.path=PATH" in line
    pets = _save(tmp_path, "pets", _dataset())
    line = _refused(capsys, tmp_path, pets, "data.image_column=imgae")
    assert "no column data.image_column='imgae'. Did you mean 'image'? Columns: image, label" in line
    assert "data.label_column=" in _refused(capsys, tmp_path, pets, "data.target=Male")
    unsplit = _save(tmp_path, "unsplit", datasets.DatasetDict(everything=_dataset()))
    assert "has the splits everything but no train split" in _refused(capsys, tmp_path, unsplit)
    unlabelled = datasets.DatasetDict(train=_dataset(), test=_dataset(8).map(lambda r: {"label": -1}))
    line = _refused(capsys, tmp_path, _save(tmp_path, "unlabelled", unlabelled))
    assert "the test split has 8 rows labelled -1 (ClassLabel's 'no label')" in line


def test_labels_and_arrays_vitlab_cannot_train_on_are_named(tmp_path, capsys):
    sparse = _dataset(names=None).map(lambda r: {"label": r["label"] * 100})
    line = _refused(capsys, tmp_path, _save(tmp_path, "sparse", sparse))
    assert "the train split uses 4 of the labels 0..300, which would make a 301-way head" in line
    train = _dataset(names=None, label=[NAMES[i % 2] for i in range(40)])
    unseen = datasets.DatasetDict(train=train, test=_dataset(8, names=None, label=["owl"] * 8))
    line = _refused(capsys, tmp_path, _save(tmp_path, "unseen", unseen))
    assert "the test split has the label 'owl', which no training image has" in line
    floats = datasets.Dataset.from_dict(
        {"pixel_values": list(np.zeros((40, 8, 8))), "label": [i % 2 for i in range(40)]}
    )
    line = _refused(capsys, tmp_path, _save(tmp_path, "floats", floats))
    assert "the image column 'pixel_values' holds" in line and "np.uint8 arrays" in line


def test_without_the_datasets_library_the_line_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    pets = _save(tmp_path, "pets", _dataset())
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    assert "pip install 'vitlab[hf]'" in _refused(capsys, tmp_path, pets)

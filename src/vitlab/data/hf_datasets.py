"""The ``hf`` dataset: a Hugging Face ``datasets`` folder (``Dataset.save_to_disk``, ``DatasetDict.save_to_disk``)
or parquet files, with an image column and a label column. Every image's header is read at set-up (a file PIL
cannot identify is named, before a run claims its folder); its pixels are decoded when the item is asked for, so a
``save_to_disk`` folder (Arrow files, memory-mapped) larger than memory trains as well as a small one."""

from __future__ import annotations

import contextlib
import difflib
import functools
import io
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from vitlab.data.config import DataConfig, DataError
from vitlab.data.sources import (
    DatasetNotFoundError,
    DatasetSource,
    _class_indices,
    _locate,
    class_names_problem,
    image_pixels,
    open_image,
)
from vitlab.data.transforms import resize_to_square

INSTALL_HINT = "pip install 'vitlab[hf]'"
IMAGE_COLUMNS = ("image", "img", "pixel_values")
LABEL_COLUMNS = ("label", "labels", "fine_label")
#: the split names vitlab reads (those ``datasets`` writes), and the split each becomes
SPLITS = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"}
_LAYOUT = (
    "Point data.path= at a folder written by Dataset.save_to_disk or DatasetDict.save_to_disk, a .parquet file, "
    "or a folder of them (train-*.parquet, test-*.parquet, or data/train-*.parquet as on the hub)."
)
_reported_bad_rows: set[str] = set()


def _datasets() -> Any:
    """The ``datasets`` library, or a one-line :class:`DataError` that says how to install it."""
    try:
        import datasets
    except ImportError as e:
        raise DataError(
            f"data.name=hf reads Hugging Face datasets, which needs the datasets library: {INSTALL_HINT}"
        ) from e
    return datasets


def _parquet_files(folder: Path) -> dict[str, list[str]]:
    """Split name -> parquet files of ``folder``, by the naming conventions ``datasets.load_dataset`` follows."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    patterns = get_data_patterns(str(folder))
    files = DataFilesDict.from_patterns(patterns, base_path=str(folder))
    return {str(split): [f for f in paths if f.endswith(".parquet")] for split, paths in files.items()}


def _read_splits(path: Path) -> dict[str, Any]:
    """Split name -> ``datasets.Dataset`` of a ``save_to_disk`` folder (memory-mapped) or of parquet files (their
    columns read into memory, the images still encoded)."""
    datasets = _datasets()
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as e:  # a missing or truncated Arrow file, a hand-edited state.json: the folder, in one line
            raise DataError(f"hf: cannot read {path} as a save_to_disk folder ({type(e).__name__}: {e})") from e
        return {"train": loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)
    if path.is_file() and path.suffix == ".parquet":
        files = {"train": [str(path)]}
    elif path.is_dir():
        files = {split: paths for split, paths in _parquet_files(path).items() if paths}
    else:
        files = {}
    if not files:
        raise DataError(
            f"hf: {path} is neither a save_to_disk folder (state.json, dataset_dict.json) nor parquet. {_LAYOUT}"
        )
    import pyarrow.parquet as pq
    from datasets.table import InMemoryTable, concat_tables

    def table(paths: list[str]) -> Any:
        try:
            return concat_tables([InMemoryTable(pq.read_table(p, memory_map=True)) for p in paths])
        except Exception as e:  # pyarrow's ArrowInvalid and friends: a file that is not parquet, or schemas apart
            raise DataError(f"hf: cannot read {', '.join(paths)} as parquet ({type(e).__name__}: {e})") from e

    return {split: datasets.Dataset(table(paths)) for split, paths in files.items()}


def _pick_splits(splits: dict[str, Any], where: str) -> dict[str, Any]:
    """``{"train": ..., "val": ..., "test": ...}`` (val, test optional) from the splits as ``datasets`` names them."""
    picked: dict[str, Any] = {}
    for name, split in splits.items():
        role = SPLITS.get(name.lower())
        if role is not None and role not in picked:
            picked[role] = split
    if "train" not in picked:
        raise DataError(
            f"{where} has the splits {', '.join(splits)} but no train split; vitlab trains on the split named train "
            f"(and reads validation and test beside it): rename one, e.g. DatasetDict(train=ds[{next(iter(splits))!r}])"
        )
    return picked


def _column(features: dict, given: str | None, kind: str, names: tuple[str, ...], feature_type: str, where: str) -> str:
    """The image or label column: ``data.<kind>_column`` when given, else the first of ``feature_type`` (``Image``,
    ``ClassLabel``), else the first of the common ``names``."""
    columns = list(features)
    if given is not None:
        if given in columns:
            return given
        close = difflib.get_close_matches(given, columns, n=1)
        suggestion = f" Did you mean {close[0]!r}?" if close else ""
        raise DataError(f"{where}: no column data.{kind}_column={given!r}.{suggestion} Columns: {', '.join(columns)}")
    typed = [name for name, feature in features.items() if type(feature).__name__ == feature_type]
    common = [name for name in names if name in columns]
    if typed or common:
        return (typed or common)[0]
    raise DataError(
        f"{where}: no {kind} column (a {feature_type} feature, or one named {', '.join(names)}); columns: "
        f"{', '.join(columns)}. Name it with data.{kind}_column="
    )


def _leaf_dtype(feature: Any) -> str | None:
    """The element type of an array column (``List(List(Value('uint8')))``, ``Array3D(dtype='uint8')``)."""
    while hasattr(feature, "feature"):
        feature = feature.feature
    return getattr(feature, "dtype", None)


def _encoded(value: dict) -> io.BytesIO | str:
    """The file of an ``Image`` cell (``{"bytes", "path"}``): its bytes, else the path it names."""
    return io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]


def _array(value: Any) -> np.ndarray:
    """A uint8 array cell ``[H, W]``, ``[H, W, 1]`` or ``[H, W, 3]`` as ``[H, W]`` or ``[H, W, 3]``."""
    array = np.asarray(value, dtype=np.uint8)
    array = array[..., 0] if array.ndim == 3 and array.shape[2] == 1 else array
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 3)):
        raise DataError(f"an image array of shape {list(array.shape)}; vitlab reads HW (gray) or HWC with C=3 (RGB)")
    return array


def _mode_and_size(value: Any) -> tuple[str, int]:
    """``(PIL mode, shorter side)`` of a cell from its header alone (no EXIF: PIL decodes a PNG to find it, and a
    rotation keeps the shorter side)."""
    if not isinstance(value, dict):
        array = _array(value)
        return ("L" if array.ndim == 2 else "RGB"), min(array.shape[:2])
    with Image.open(_encoded(value)) as image:
        return image.mode, min(image.size)


@contextlib.contextmanager
def _cell_image(value: Any) -> Iterator[Image.Image]:
    """The PIL image of a cell: an ``Image`` cell as a viewer shows it (:func:`open_image`), or a uint8 array."""
    if not isinstance(value, dict):
        yield Image.fromarray(_array(value))
        return
    with open_image(_encoded(value)) as image:
        yield image


def _image_cells(split: Any, column: str, where: str) -> Any:
    """``split`` reduced to its image column, left encoded (``Image(decode=False)``: ``{"bytes", "path"}`` cells)."""
    datasets = _datasets()
    feature = split.features[column]
    cells = split.select_columns([column])
    if isinstance(feature, datasets.Image):
        return cells.cast_column(column, datasets.Image(decode=False))
    if _leaf_dtype(feature) != "uint8":
        raise DataError(
            f"{where}: the image column {column!r} holds {feature}; vitlab reads images (a datasets.Image column) "
            "or uint8 arrays HW / HWC: store PIL images, or np.uint8 arrays, or name another with data.image_column="
        )
    return cells


def _reason(error: Exception) -> str:
    """Why a cell's image cannot be read, in a few words (PIL names a bytes buffer by its address)."""
    if isinstance(error, UnidentifiedImageError):
        return "UnidentifiedImageError: bytes of no image format PIL knows"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'unreadable'}"


def _scan(cells: Any, column: str, strict: bool, where: str) -> tuple[list[int], list[tuple[str, int]]]:
    """The rows whose image PIL can open (its header: the pixels are decoded per item), and ``(mode, shorter side)``
    of each. An unreadable one is named and skipped (one line with the count), or is a :class:`DataError` when
    ``strict``."""
    kept, shapes, bad = [], [], []
    row = 0
    for batch in cells.iter(batch_size=1024):
        for value in batch[column]:
            try:
                shapes.append(_mode_and_size(value))
                kept.append(row)
            except Exception as e:  # PIL's many error types on broken bytes; the row is what the user needs
                reason = _reason(e)
                if strict:
                    raise DataError(
                        f"{where}: cannot read the image of row {row} ({reason}); fix or drop the row (ds.filter), "
                        "or set data.strict_images=false to skip unreadable images"
                    ) from e
                bad.append((row, reason))
            row += 1
    if bad and where not in _reported_bad_rows:
        _reported_bad_rows.add(where)
        print(
            f"{where}: skipped {len(bad)} unreadable image{'s' * (len(bad) > 1)} of {row} (e.g. row {bad[0][0]}: "
            f"{bad[0][1]}); set data.strict_images=true to stop on them instead",
            file=sys.stderr,
        )
    return kept, shapes


def _raw_labels(split: Any, column: str, where: str) -> np.ndarray:
    labels = split.data.column(column).to_numpy()
    if labels.dtype == object and len(labels) and not isinstance(labels[0], str):
        raise DataError(
            f"{where}: the label column {column!r} holds {split.features[column]}, not one class per image; name a "
            "column of class indices or names with data.label_column="
        )
    return labels


def _named_by_strings(raw: dict[str, np.ndarray], where: str) -> tuple[dict[str, Tensor], list[str]]:
    """Labels given as class names: the sorted names of the training labels, and each split's indices into them."""
    names = sorted({str(name) for name in raw["train"]})
    index = {name: i for i, name in enumerate(names)}
    for role, labels in raw.items():
        unseen = sorted({str(name) for name in labels} - set(names))
        if unseen:
            raise DataError(
                f"{where}: the {role} split has the label {unseen[0]!r}, which no training image has; the model "
                "cannot predict a class it never saw: make its labels training classes"
            )
    return {
        role: torch.tensor([index[str(n)] for n in labels], dtype=torch.int64) for role, labels in raw.items()
    }, names


def _labels(splits: dict[str, Any], column: str, where: str) -> tuple[dict[str, Tensor], list[str], bool]:
    """Each split's labels as class indices ``int64 [N]``, the class names and whether the data names them: a
    ``ClassLabel``'s names, the sorted names of a column of strings, else ``0..K-1`` for integer labels."""
    feature = splits["train"].features[column]
    raw = {role: _raw_labels(split, column, f"{where} {role} split") for role, split in splits.items()}
    if raw["train"].dtype == object or raw["train"].dtype.kind == "U":
        return (*_named_by_strings(raw, where), True)
    named = type(feature).__name__ == "ClassLabel"
    for role, labels in raw.items():
        if named and (labels == -1).any():
            raise DataError(
                f"{where}: the {role} split has {(labels == -1).sum()} rows labelled -1 (ClassLabel's 'no label'); "
                f"vitlab trains and tests on labelled images: drop them (ds.filter(lambda r: r[{column!r}] >= 0))"
            )
    indices = {role: _class_indices(labels, f"{where} {role} split") for role, labels in raw.items()}
    if named:
        return indices, list(feature.names), True
    count = int(indices["train"].max()) + 1 if len(indices["train"]) else 0
    return indices, [str(label) for label in range(count)], False


def _check_labels(labels: dict[str, Tensor], names: list[str], named: bool, where: str) -> None:
    """Every training label names a class, every class has a training image unless the data names it, and the
    validation and test labels are training classes."""
    num_classes, train = len(names), labels["train"]
    problem = class_names_problem(names, num_classes)
    if problem:
        raise DataError(f"{where}: the class names {problem}; give each class its own name")
    if len(train) and train.max() >= num_classes:
        raise DataError(
            f"{where}: the train split has label {int(train.max())} but its ClassLabel names {num_classes} classes; "
            "give every class a name (datasets.ClassLabel(names=[...]))"
        )
    present = torch.unique(train)
    if not named and len(present) < num_classes:
        raise DataError(
            f"{where}: the train split uses {len(present)} of the labels 0..{num_classes - 1}, which would make a "
            f"{num_classes}-way head; remap them to 0..{len(present) - 1} (ds.class_encode_column), or store a "
            "ClassLabel feature naming every class"
        )
    for role in ("val", "test"):
        if role in labels and len(labels[role]) and labels[role].max() >= num_classes:
            raise DataError(
                f"{where}: the {'validation' if role == 'val' else role} split has label {int(labels[role].max())}, "
                f"outside the training classes 0..{num_classes - 1}; the model cannot predict a class it never saw"
            )


class HFImagePool(Dataset):
    """The rows ``rows: int64 [N]`` of a ``datasets.Dataset`` of encoded images (:func:`_image_cells`), decoded on
    access to ``mode`` (``"L"``: 1 channel, ``"RGB"``: 3) and served at square size ``size``; labels
    ``int64 [N]``."""

    def __init__(self, cells: Any, column: str, rows: Tensor, labels: Tensor, *, mode: str, size: int) -> None:
        self.cells = cells
        self.column = column
        self.rows = rows
        self.labels = labels.to(torch.int64)
        self.mode = mode
        self.size = size
        self.in_chans = 1 if mode == "L" else 3

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        row = int(self.rows[index])
        try:
            with _cell_image(self.cells[row][self.column]) as image:
                pixels = image_pixels(image, self.mode)
        except Exception as e:  # a file whose header reads but whose pixels do not (a truncated PNG)
            raise DataError(f"cannot read the image of row {row} ({_reason(e)}); fix or drop it") from e
        return resize_to_square(pixels, self.size), int(self.labels[index])


def load_hf_dataset(cfg: DataConfig, download: bool) -> DatasetSource:
    """A ``save_to_disk`` folder or parquet files at ``data.path`` (:func:`_read_splits`): the splits ``train``,
    ``validation`` and ``test`` as ``datasets`` names them, the image and label columns found by feature type or
    common name (``data.image_column``, ``data.label_column`` to choose), the class names from a ``ClassLabel``."""
    if cfg.path is None:
        raise DataError(f"hf: no dataset given. {_LAYOUT}")
    path = _locate(cfg.path, cfg.root, "hf", _LAYOUT)
    if cfg.target is not None:
        raise DataError(
            f"hf: data.target={cfg.target!r} picks a column of multi-label celeba and npz files; for hf name the label "
            "column with data.label_column="
        )
    if cfg.in_chans not in (None, 1, 3):
        raise DataError(f"data.in_chans must be 1 (gray), 3 (RGB) or null (the images' own), got {cfg.in_chans}")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    columns = (cfg.image_column, cfg.label_column)
    return _load(str(path.resolve()), stamp, columns, cfg.in_chans, cfg.img_size, cfg.strict_images)


@functools.lru_cache(maxsize=4)
def _load(
    path: str,
    stamp: tuple,
    columns: tuple[str | None, str | None],
    in_chans: int | None,
    img_size: int | None,
    strict: bool,
) -> DatasetSource:
    """:func:`load_hf_dataset` once per state of the files (the data is read twice per run: for the model's shape,
    then for the splits)."""
    where = f"hf {path}"
    splits = _pick_splits(_read_splits(Path(path)), where)
    features = splits["train"].features
    image_column = _column(features, columns[0], "image", IMAGE_COLUMNS, "Image", where)
    label_column = _column(features, columns[1], "label", LABEL_COLUMNS, "ClassLabel", where)
    for role, split in splits.items():
        missing = [c for c in (image_column, label_column) if c not in split.features]
        if missing:
            raise DataError(f"{where}: the {role} split has no column {missing[0]!r}, which the train split has")
    labels, names, named = _labels(splits, label_column, where)
    _check_labels(labels, names, named, where)
    cells = {role: _image_cells(split, image_column, where) for role, split in splits.items()}
    scanned = {role: _scan(cells[role], image_column, strict, f"{where} {role} split") for role in splits}
    rows, shapes = scanned["train"]
    if not rows:
        raise DatasetNotFoundError(f"{where}: the train split holds no readable image. {_LAYOUT}")
    if in_chans is not None:
        mode = "L" if in_chans == 1 else "RGB"
    else:
        gray = sum(image_mode in _GRAY_MODES for image_mode, _ in shapes)
        mode = "L" if gray > len(shapes) - gray else "RGB"
    size = img_size or Counter(shorter for _, shorter in shapes).most_common(1)[0][0]

    def pool(role: str) -> HFImagePool | None:
        if role not in splits:
            return None
        kept = torch.tensor(scanned[role][0], dtype=torch.int64)
        return HFImagePool(cells[role], image_column, kept, labels[role][kept], mode=mode, size=size)

    return DatasetSource(pool("train"), pool("val"), pool("test"), names)

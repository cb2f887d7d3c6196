"""Image datasets by name, read from their real on-disk formats.

A loader returns a :class:`DatasetSource`: an image pool for each split the dataset ships, and its class names.
A pool holds its labels as int64 ``[N]`` and yields ``(image: uint8 [C, S, S], label: int)`` at the final square
size ``S``. In-memory sets (digits, MNIST-like, CIFAR, SVHN, npz) keep all images as one uint8 tensor; folder sets
(CelebA, Tiny ImageNet, imagefolder) decode their files on access.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torchvision.datasets as tvd
from PIL import Image
from sklearn.datasets import load_digits
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.datasets.mnist import read_image_file, read_label_file
from torchvision.datasets.utils import download_and_extract_archive, extract_archive
from torchvision.transforms.v2.functional import pil_to_tensor

from vitlab.data.config import DATASETS as DATASETS  # the names live with the config, which loads no torch
from vitlab.data.config import DataConfig, DataError, check_dataset_name
from vitlab.data.transforms import resize_to_square

DOWNLOADABLE = ["mnist", "fashion-mnist", "cifar10", "cifar100", "svhn", "celeba", "tiny-imagenet"]
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
CELEBA_DEFAULT_TARGET = "Male"
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


class DatasetNotFoundError(DataError, FileNotFoundError):
    """Dataset files are missing; the message names where they were looked for and how to get them."""


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset. ``img_size`` is the final square size (after ``cfg.img_size``);
    ``mean``/``std`` are None where they are computed from the training images at setup."""

    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


# Native sizes and normalisation constants of the named sets. Digits: over all 1,797 images after x*16 -> uint8.
# CelebA: the official training partition; its aligned images are 178x218, centre-cropped to 178x178.
_KNOWN_INFO = {
    "digits": DatasetInfo(10, 1, 8, (0.3061,), (0.3769,)),
    "mnist": DatasetInfo(10, 1, 28, (0.1307,), (0.3081,)),
    "fashion-mnist": DatasetInfo(10, 1, 28, (0.2860,), (0.3530,)),
    "cifar10": DatasetInfo(10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": DatasetInfo(100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": DatasetInfo(10, 3, 32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "celeba": DatasetInfo(2, 3, 178, (0.5068, 0.4262, 0.3835), (0.3103, 0.2903, 0.2896)),
    "tiny-imagenet": DatasetInfo(200, 3, 64),
}


class TensorImagePool(Dataset):
    """In-memory images ``uint8 [N, C, H, W]`` with labels ``int64 [N]``, served at square size ``size``."""

    def __init__(self, images: Tensor, labels: Tensor, *, size: int) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise DataError(f"images must be uint8 [N, C, H, W], got {images.dtype} {list(images.shape)}")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.size = size
        self.in_chans = images.shape[1]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return resize_to_square(self.images[index], self.size), int(self.labels[index])


class ImageFilePool(Dataset):
    """Image files decoded on access to ``mode`` (``"L"``: 1 channel, ``"RGB"``: 3) and served at square size
    ``size``; labels ``int64 [N]``."""

    def __init__(self, paths: list[Path], labels: Tensor, *, mode: str, size: int) -> None:
        self.paths = paths
        self.labels = labels.to(torch.int64)
        self.mode = mode
        self.size = size
        self.in_chans = 1 if mode == "L" else 3

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        try:
            with Image.open(self.paths[index]) as image:
                pixels = pil_to_tensor(image.convert(self.mode))
        except Exception as e:  # PIL's many error types; the user needs the file's name, not PIL's traceback
            raise DataError(
                f"cannot read image {self.paths[index]} ({type(e).__name__}: {e}); remove or replace it"
            ) from e
        return resize_to_square(pixels, self.size), int(self.labels[index])


ImagePool = TensorImagePool | ImageFilePool


@dataclass
class DatasetSource:
    """The splits a dataset ships; a split that is None is carved off ``train`` by the data module."""

    train: ImagePool
    val: ImagePool | None
    test: ImagePool | None
    class_names: list[str]


def dataset_info(cfg: DataConfig) -> DatasetInfo:
    """Number of classes, channels, final image size (and normalisation where known) of ``cfg``'s dataset. Free
    for the named sets; ``npz`` and ``imagefolder`` are read (the file, or the folder listing and one image)."""
    name = check_dataset_name(cfg.name)
    if cfg.img_size is not None and cfg.img_size < 1:
        raise DataError(f"data.img_size must be a positive integer or null (native size), got {cfg.img_size}")
    if name in _KNOWN_INFO:
        info = replace(_KNOWN_INFO[name], img_size=cfg.img_size or _KNOWN_INFO[name].img_size)
    else:
        source = load_dataset(cfg)
        info = DatasetInfo(len(source.class_names), in_chans=source.train.in_chans, img_size=source.train.size)
    if cfg.in_chans is not None and cfg.in_chans != info.in_chans:
        raise DataError(
            f"data.in_chans={cfg.in_chans} but {name} images have {info.in_chans} channel(s); data.in_chans converts "
            "imagefolder images only: unset it"
        )
    return info


def load_dataset(cfg: DataConfig, *, download: bool = False) -> DatasetSource:
    """Read ``cfg``'s dataset from disk (downloading it first when ``download`` and the set supports it)."""
    name = check_dataset_name(cfg.name)
    return _LOADERS[name](cfg, download)


def download_dataset(cfg: DataConfig) -> None:
    """Download ``cfg``'s dataset into ``cfg.root`` if it is one torchvision (or its host) can download."""
    if check_dataset_name(cfg.name) in DOWNLOADABLE:
        load_dataset(cfg, download=True)


# -------------------------------------------------------------------------------------------------------------------
# Helpers shared by the loaders.


def _native_size(cfg: DataConfig, name: str) -> int:
    return cfg.img_size or _KNOWN_INFO[name].img_size


def _require(paths: list[Path], dataset: str, fix: str) -> None:
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise DatasetNotFoundError(f"{dataset}: files not found: {', '.join(missing)}. {fix}")


def _locate(path: str | None, root: str, dataset: str, fix: str) -> Path:
    """The user's ``path`` as given, else under ``root`` when relative; ``root`` itself when ``path`` is None."""
    root_path = Path(root).expanduser()
    if path is None:
        candidates = [root_path]
    else:
        given = Path(path).expanduser()
        candidates = [given] if given.is_absolute() else [given, root_path / given]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise DatasetNotFoundError(f"{dataset}: nothing at {' or '.join(map(str, candidates))}. {fix}")


def _download_hint(folder: Path, what: str) -> str:
    return f"Put {what} in {folder}, or set data.download=true to download them there."


def _images_nchw(array: np.ndarray, where: str) -> Tensor:
    """uint8 images NHW (gray) or NHWC (RGB) -> ``uint8 [N, C, H, W]``."""
    if array.ndim == 4 and array.shape[1] in (1, 3) and array.shape[3] not in (1, 3):
        raise DataError(
            f"{where} looks like NCHW images {list(array.shape)} (channels second); vitlab reads NHWC: write it as "
            "x.transpose(0, 2, 3, 1)"
        )
    if array.dtype != np.uint8 or array.ndim not in (3, 4):
        raise DataError(
            f"{where} must be uint8 images NHW (gray) or NHWC (RGB), got {array.dtype} {list(array.shape)}; "
            "convert with (x * 255).round().clip(0, 255).astype(np.uint8) if it holds floats in [0, 1]."
        )
    images = torch.from_numpy(np.ascontiguousarray(array))
    return images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2).contiguous()


def _class_indices(y: np.ndarray, where: str) -> Tensor:
    """Labels ``[N]`` as int64 class indices: integers or booleans as they are, floats only when whole numbers."""
    if y.ndim != 1:
        raise DataError(
            f"{where}: labels must be [N] class indices (or a 0/1 matrix [N, K]), got shape {list(y.shape)}"
        )
    if np.issubdtype(y.dtype, np.floating):
        fractional = y[~np.isfinite(y) | (y != np.round(y))]
        if len(fractional):
            raise DataError(
                f"{where}: the labels are floats that are not whole numbers (e.g. {float(fractional[0]):g}); labels "
                "are class indices 0..K-1: for probabilities or one-hot rows write y.argmax(1), for class ids "
                "y.astype(int)"
            )
    elif not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        raise DataError(f"{where}: labels must be integers (class indices 0..K-1), got dtype {y.dtype}")
    labels = torch.from_numpy(y.astype(np.int64))
    if len(labels) and labels.min() < 0:
        raise DataError(f"{where}: negative label {int(labels.min())}; labels must be class indices 0..K-1")
    return labels


def _check_label_range(train: Tensor, test: Tensor, num_classes: int, named: bool, where: str) -> None:
    """Classes 0..K-1 must all occur in the training labels unless the file names them (``class_names``), and the
    test labels must be among them."""
    if train.max() >= num_classes:
        raise DataError(
            f"{where}: y_train has label {int(train.max())} but class_names names {num_classes} classes; give a name "
            "to every class"
        )
    present = torch.unique(train)
    if not named and len(present) < num_classes:
        shown = ", ".join(map(str, present[:5].tolist())) + (", ..." if len(present) > 5 else "")
        raise DataError(
            f"{where}: y_train uses {len(present)} of the labels 0..{num_classes - 1} ({shown}), which would make a "
            f"{num_classes}-way head; remap them to 0..{len(present) - 1} with np.unique(y, return_inverse=True), or "
            "store class_names in the file to keep the empty classes"
        )
    unseen = torch.unique(test[test >= num_classes]).tolist()
    if unseen:
        shown = ", ".join(map(str, unseen[:5])) + (", ..." if len(unseen) > 5 else "")
        raise DataError(
            f"{where}: y_test has {len(unseen)} label(s) outside the training classes 0..{num_classes - 1} "
            f"({shown}); the model cannot predict a class it never saw: make the test labels training classes"
        )


def _attribute_column(names: list[str] | None, num_columns: int, target: str | int | None, where: str) -> int:
    """Index of the column of a multi-label ``y: [N, K]`` that is the class, chosen by name or by index."""
    available = f"one of: {', '.join(names)}" if names else f"an index in 0..{num_columns - 1}"
    if target is None:
        raise DataError(
            f"{where}: y is multi-label with {num_columns} columns; choose the class with data.target=, {available}"
        )
    if isinstance(target, int):
        if not 0 <= target < num_columns:
            raise DataError(f"{where}: data.target={target} is out of range; use {available}")
        return target
    if not names:
        raise DataError(f"{where}: data.target={target!r} is a name but the file has no attr_names; use {available}")
    if target not in names:
        close = difflib.get_close_matches(target, names, n=1)
        suggestion = f" Did you mean {close[0]!r}?" if close else ""
        raise DataError(f"{where}: unknown column data.target={target!r}.{suggestion} Available: {', '.join(names)}")
    return names.index(target)


def _binary_attribute(
    y: np.ndarray, names: list[str] | None, target: str | int | None, where: str
) -> tuple[Tensor, list[str]]:
    """``y: [N, K]`` 0/1 (or -1/1) attributes -> int64 labels ``[N]`` of the chosen column and its class names."""
    column = _attribute_column(names, y.shape[1], target, where)
    name = names[column] if names else f"attribute {column}"
    return torch.from_numpy(y[:, column] > 0).to(torch.int64), [f"not {name}", name]


# -------------------------------------------------------------------------------------------------------------------
# Loaders, one per dataset: (cfg, download) -> DatasetSource.


def _load_digits(cfg: DataConfig, download: bool) -> DatasetSource:
    """scikit-learn's 1,797 8x8 digits (values 0..16, scaled by 16 to uint8); no file, no test split of its own."""
    digits = load_digits()
    images = torch.from_numpy((digits.images * 16).clip(0, 255).astype(np.uint8)).unsqueeze(1)
    pool = TensorImagePool(images, torch.from_numpy(digits.target), size=_native_size(cfg, "digits"))
    return DatasetSource(train=pool, val=None, test=None, class_names=[str(digit) for digit in range(10)])


def cache_dir() -> Path:
    """Where vitlab unpacks archives it cannot unpack beside them: ``$VITLAB_CACHE``, else
    ``$XDG_CACHE_HOME/vitlab``, else ``~/.cache/vitlab``."""
    if os.environ.get("VITLAB_CACHE"):
        return Path(os.environ["VITLAB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vitlab"


def _unpacked(packed: Path) -> Path:
    """The unpacked copy of ``packed`` (``x.gz``): beside it when that folder is writable, else in the cache."""
    beside = packed.with_suffix("")
    if os.access(packed.parent, os.W_OK):
        extract_archive(str(packed), str(packed.parent))  # a folder: torchvision names the file itself
        return beside
    digest = hashlib.sha1(str(packed.resolve()).encode()).hexdigest()[:16]
    target = cache_dir() / "unpacked" / digest / beside.name
    if not target.exists():  # unpacked into a fresh folder, then renamed: never a half-written file in the cache
        target.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpack-"))
        try:
            extract_archive(str(packed), str(stage))
            os.replace(stage / beside.name, target)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return target


def _load_mnist_like(dataset_class: type[tvd.MNIST], name: str, cfg: DataConfig, download: bool) -> DatasetSource:
    """torchvision's MNIST / FashionMNIST IDX files (raw or ``.gz``), in ``data.path`` when it is set (the folder
    that holds them, or one above ``<ClassName>/raw/``), else in ``data.root/<ClassName>/raw/``. A ``.gz`` copy is
    unpacked beside itself, or into :func:`cache_dir` when its folder is read-only."""
    root = Path(cfg.root).expanduser()
    raw = root / dataset_class.__name__ / "raw"
    if download:
        dataset_class(str(root), train=True, download=True)
    if cfg.path is not None:
        given = Path(cfg.path).expanduser()
        folders = [given, given / dataset_class.__name__ / "raw", given / "raw"]
    else:
        folders = [raw]
    filenames = [os.path.splitext(filename)[0] for filename, _ in dataset_class.resources]

    def complete(folder: Path) -> bool:
        return all((folder / f).exists() or (folder / f"{f}.gz").exists() for f in filenames)

    folder = next((f for f in folders if complete(f)), None)
    if folder is None:
        also = f" (also looked in {', '.join(str(f) for f in folders[1:])})" if len(folders) > 1 else ""
        raise DatasetNotFoundError(
            f"{name}: files not found: {', '.join(str(folders[0] / f) for f in filenames)} (raw or .gz){also}. "
            "Put them there, or set data.path= to the folder that holds them, or set data.download=true to "
            f"download them into {raw}."
        )
    files = {f: folder / f if (folder / f).exists() else _unpacked(folder / f"{f}.gz") for f in filenames}
    train_images, train_labels, test_images, test_labels = (
        read_image_file(str(files[filenames[0]])),
        read_label_file(str(files[filenames[1]])),
        read_image_file(str(files[filenames[2]])),
        read_label_file(str(files[filenames[3]])),
    )
    size = _native_size(cfg, name)
    return DatasetSource(
        train=TensorImagePool(train_images.unsqueeze(1), train_labels, size=size),
        val=None,
        test=TensorImagePool(test_images.unsqueeze(1), test_labels, size=size),
        class_names=list(dataset_class.classes),
    )


class _CIFAR10Files(tvd.CIFAR10):
    """CIFAR-10 that checks its batch files exist rather than their md5 (a download still checks the archive's)."""

    train_list: ClassVar = [(filename, None) for filename, _ in tvd.CIFAR10.train_list]
    test_list: ClassVar = [(filename, None) for filename, _ in tvd.CIFAR10.test_list]
    meta: ClassVar = {**tvd.CIFAR10.meta, "md5": None}


class _CIFAR100Files(tvd.CIFAR100):
    """CIFAR-100 that checks its files exist rather than their md5 (a download still checks the archive's)."""

    train_list: ClassVar = [(filename, None) for filename, _ in tvd.CIFAR100.train_list]
    test_list: ClassVar = [(filename, None) for filename, _ in tvd.CIFAR100.test_list]
    meta: ClassVar = {**tvd.CIFAR100.meta, "md5": None}


def _load_cifar(dataset_class: type[tvd.CIFAR10], name: str, cfg: DataConfig, download: bool) -> DatasetSource:
    """torchvision's CIFAR-10/100: the pickled batches in ``root/cifar-10-batches-py/`` (``cifar-100-python/``)."""
    folder = Path(cfg.root).expanduser() / dataset_class.base_folder
    if not download:
        filenames = [filename for filename, _ in dataset_class.train_list + dataset_class.test_list]
        filenames.append(dataset_class.meta["filename"])
        _require([folder / filename for filename in filenames], name, _download_hint(folder, "the batches"))
    train = dataset_class(cfg.root, train=True, download=download)
    test = dataset_class(cfg.root, train=False)
    size = _native_size(cfg, name)

    def pool(split: tvd.CIFAR10) -> TensorImagePool:
        return TensorImagePool(_images_nchw(split.data, name), torch.tensor(split.targets), size=size)

    return DatasetSource(train=pool(train), val=None, test=pool(test), class_names=list(train.classes))


class _SVHNFiles(tvd.SVHN):
    """SVHN that checks its ``.mat`` file exists rather than its md5 (a download still checks it)."""

    def _check_integrity(self) -> bool:
        return os.path.isfile(os.path.join(self.root, self.filename))


def _load_svhn(cfg: DataConfig, download: bool) -> DatasetSource:
    """torchvision's SVHN (cropped digits, label 10 mapped to 0): ``root/train_32x32.mat``, ``root/test_32x32.mat``."""
    root = Path(cfg.root).expanduser()
    if not download:
        files = [root / _SVHNFiles.split_list[split][1] for split in ("train", "test")]
        _require(files, "svhn", _download_hint(root, "train_32x32.mat and test_32x32.mat"))
    size = _native_size(cfg, "svhn")

    def pool(split: str) -> TensorImagePool:
        data = _SVHNFiles(cfg.root, split=split, download=download)
        return TensorImagePool(torch.from_numpy(data.data), torch.from_numpy(data.labels), size=size)

    return DatasetSource(train=pool("train"), val=None, test=pool("test"), class_names=[str(d) for d in range(10)])


def _read_celeba_attributes(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """``list_attr_celeba.txt``: a count line, a header of attribute names, then ``<file> <+-1 per attribute>``."""
    lines = path.read_text().splitlines()
    names = lines[1].split()
    rows = [line.split() for line in lines[2:] if line.strip()]
    return names, [row[0] for row in rows], np.array([row[1:] for row in rows], dtype=np.int64)


def _load_celeba(cfg: DataConfig, download: bool) -> DatasetSource:
    """CelebA (Liu et al. 2015) with one binary attribute as the class, read from torchvision's layout
    ``root/celeba/{img_align_celeba/, list_attr_celeba.txt, list_eval_partition.txt}``; the official partition gives
    train (0), val (1) and test (2). The other annotation files torchvision wants are not needed."""
    folder = Path(cfg.root).expanduser() / "celeba"
    if download:
        tvd.CelebA(cfg.root, split="all", target_type=[], download=True)
    _require(
        [folder / "img_align_celeba", folder / "list_attr_celeba.txt", folder / "list_eval_partition.txt"],
        "celeba",
        _download_hint(folder, "img_align_celeba/ and the two list files (torchvision's download needs gdown)"),
    )
    attr_names, files, attributes = _read_celeba_attributes(folder / "list_attr_celeba.txt")
    target = CELEBA_DEFAULT_TARGET if cfg.target is None else cfg.target
    labels, class_names = _binary_attribute(attributes, attr_names, target, "celeba")
    partition = dict(line.split() for line in (folder / "list_eval_partition.txt").read_text().splitlines() if line)
    unassigned = [file for file in files if file not in partition]
    if unassigned:
        raise DataError(
            f"celeba: {len(unassigned)} images (e.g. {unassigned[0]}) are missing from "
            f"{folder / 'list_eval_partition.txt'}; restore the official file"
        )
    split_of = np.array([int(partition[file]) for file in files])
    size = _native_size(cfg, "celeba")

    def pool(split: int) -> ImageFilePool | None:
        chosen = np.flatnonzero(split_of == split)
        if len(chosen) == 0:
            return None
        paths = [folder / "img_align_celeba" / files[i] for i in chosen]
        return ImageFilePool(paths, labels[torch.from_numpy(chosen)], mode="RGB", size=size)

    train = pool(0)
    if train is None:
        raise DataError(f"celeba: no image is in the training partition (0) of {folder / 'list_eval_partition.txt'}")
    return DatasetSource(train=train, val=pool(1), test=pool(2), class_names=class_names)


def _load_tiny_imagenet(cfg: DataConfig, download: bool) -> DatasetSource:
    """Tiny ImageNet (200 classes, 64x64): ``wnids.txt``, ``train/<wnid>/images/*.JPEG``, ``val/images/*.JPEG`` with
    ``val/val_annotations.txt``; its labelled val set is the test set (the official test set has no labels)."""
    root = Path(cfg.root).expanduser()
    folder = root / "tiny-imagenet-200" if cfg.path is None else Path(cfg.path).expanduser()
    if download and not folder.exists():
        download_and_extract_archive(TINY_IMAGENET_URL, download_root=str(folder.parent))
    _require(
        [folder / "wnids.txt", folder / "train", folder / "val" / "val_annotations.txt"],
        "tiny-imagenet",
        _download_hint(folder, "the unpacked tiny-imagenet-200 files") + " Or set data.path= to that folder.",
    )
    wnids = (folder / "wnids.txt").read_text().split()
    train_paths, train_labels = [], []
    for label, wnid in enumerate(wnids):
        paths = sorted((folder / "train" / wnid / "images").glob("*.JPEG"))
        train_paths += paths
        train_labels += [label] * len(paths)
    label_of = {wnid: label for label, wnid in enumerate(wnids)}
    annotations = [line.split("\t") for line in (folder / "val" / "val_annotations.txt").read_text().splitlines()]
    val_paths = [folder / "val" / "images" / row[0] for row in annotations if row[0]]
    val_labels = [label_of[row[1]] for row in annotations if row[0]]
    words_file = folder / "words.txt"
    words = dict(line.split("\t", 1) for line in words_file.read_text().splitlines()) if words_file.exists() else {}
    size = cfg.img_size or _KNOWN_INFO["tiny-imagenet"].img_size
    return DatasetSource(
        train=ImageFilePool(train_paths, torch.tensor(train_labels), mode="RGB", size=size),
        val=None,
        test=ImageFilePool(val_paths, torch.tensor(val_labels), mode="RGB", size=size),
        class_names=[words.get(wnid, wnid).split(",")[0] for wnid in wnids],
    )


_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}
_reported_bad_images: set[str] = set()


def _hidden(name: str) -> bool:
    """Hidden files and folders (``.ipynb_checkpoints``, ``.DS_Store``, ``.thumbs``) are not data."""
    return name.startswith(".")


def _class_folders(folder: Path) -> list[str]:
    """The class names of an image folder: its visible sub-folders, sorted."""
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not _hidden(entry.name))


def _image_files(folder: Path, class_names: list[str]) -> list[tuple[Path, int]]:
    """``(path, class index)`` of every visible image file under ``folder/<class>/`` (sub-folders included,
    hidden files and folders skipped), in sorted order."""
    samples = []
    for label, name in enumerate(class_names):
        if not (folder / name).is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(folder / name, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not _hidden(d))
            samples += [
                (Path(dirpath) / f, label)
                for f in sorted(filenames)
                if not _hidden(f) and f.lower().endswith(IMG_EXTENSIONS)
            ]
    return samples


@functools.lru_cache(maxsize=1 << 20)
def _image_mode_and_size(path: str, mtime_ns: int, size: int) -> tuple[str, int] | str:
    """``(PIL mode, shorter side)`` of a decodable image, or the reason it cannot be read. Cached by file
    identity: the folder is listed twice per run (for the model's shape, then for the data)."""
    try:
        with Image.open(path) as image:
            mode, shorter = image.mode, min(image.size)
            image.load()  # a full decode: a truncated file opens fine and fails only here
        return mode, shorter
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError... on broken files
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"


def _readable_images(
    samples: list[tuple[Path, int]], strict: bool, where: str
) -> tuple[list[tuple[Path, int]], list[tuple[str, int]]]:
    """The samples whose image decodes, and ``(mode, shorter side)`` of each. An unreadable file is named and
    skipped (one line with the count), or is a :class:`DataError` when ``strict``."""
    kept, shapes, bad = [], [], []
    for path, label in samples:
        stat = path.stat()
        shape = _image_mode_and_size(str(path), stat.st_mtime_ns, stat.st_size)
        if isinstance(shape, str):
            if strict:
                raise DataError(
                    f"{where}: cannot read image {path} ({shape}); remove or replace the file, or set "
                    "data.strict_images=false to skip unreadable images"
                )
            bad.append((path, shape))
        else:
            kept.append((path, label))
            shapes.append(shape)
    new = [(path, reason) for path, reason in bad if str(path) not in _reported_bad_images]
    if new:
        _reported_bad_images.update(str(path) for path, _ in new)
        first, reason = new[0]
        print(
            f"{where}: skipped {len(bad)} unreadable image{'s' * (len(bad) > 1)} of {len(samples)} "
            f"(e.g. {first}: {reason}); set data.strict_images=true to stop on them instead",
            file=sys.stderr,
        )
    return kept, shapes


def _load_imagefolder(cfg: DataConfig, download: bool) -> DatasetSource:
    """Any folder tree ``root/train/<class>/*`` with optional ``root/val/<class>/*``, ``root/test/<class>/*``, or
    class folders directly under ``root``. Hidden files and folders are not data. Every image is decoded once at
    set-up: unreadable ones are named and skipped (``data.strict_images=true``: an error). The channels are
    ``data.in_chans`` (1 or 3) or else those of most training images (a tie: RGB), and every image is converted to
    them; the native size is the most common shorter side of the training images."""
    layout = "Expected <folder>/train/<class>/<image> (optional val/, test/) or <folder>/<class>/<image>."
    folder = _locate(cfg.path, cfg.root, "imagefolder", f"{layout} Point data.path= (or data.root=) at the folder.")
    if cfg.in_chans not in (None, 1, 3):
        raise DataError(f"data.in_chans must be 1 (gray), 3 (RGB) or null (the images' own), got {cfg.in_chans}")
    split_dirs = {split: folder / split for split in ("train", "val", "test") if (folder / split).is_dir()}
    train_dir = split_dirs.get("train", folder)
    class_names = _class_folders(train_dir)
    if not class_names:
        raise DatasetNotFoundError(f"imagefolder: no class folders in {train_dir}. {layout}")
    train_samples, shapes = _readable_images(_image_files(train_dir, class_names), cfg.strict_images, "imagefolder")
    if not train_samples:
        raise DatasetNotFoundError(
            f"imagefolder: no readable image ({', '.join(IMG_EXTENSIONS)}) in the class folders of {train_dir}. "
            f"{layout}"
        )
    counts = Counter(label for _, label in train_samples)
    empty = [name for label, name in enumerate(class_names) if counts[label] == 0]
    if empty:
        raise DataError(
            f"imagefolder: class folder{'s' * (len(empty) > 1)} {', '.join(str(train_dir / n) for n in empty)} "
            f"{'hold' if len(empty) > 1 else 'holds'} no readable image; add images, or remove the folder (every "
            "class folder is a class)"
        )
    if len(class_names) < 2:
        raise DataError(
            f"imagefolder: {train_dir} has one class folder ({class_names[0]}); a classifier needs at least two: "
            f"put each class's images in its own folder under {train_dir}"
        )
    if cfg.in_chans is not None:
        mode = "L" if cfg.in_chans == 1 else "RGB"
    else:
        gray = sum(image_mode in _GRAY_MODES for image_mode, _ in shapes)
        mode = "L" if gray > len(shapes) - gray else "RGB"
    size = cfg.img_size or Counter(shorter for _, shorter in shapes).most_common(1)[0][0]

    def pool(samples: list[tuple[Path, int]]) -> ImageFilePool:
        paths = [path for path, _ in samples]
        return ImageFilePool(paths, torch.tensor([label for _, label in samples]), mode=mode, size=size)

    def optional_pool(split: str) -> ImageFilePool | None:
        if split not in split_dirs:
            return None
        samples, _ = _readable_images(_image_files(split_dirs[split], class_names), cfg.strict_images, "imagefolder")
        return pool(samples)

    return DatasetSource(pool(train_samples), optional_pool("val"), optional_pool("test"), class_names)


def _load_npz(cfg: DataConfig, download: bool) -> DatasetSource:
    """A ``.npz`` file with ``x_train, y_train, x_test, y_test`` (uint8 images NHW or NHWC; int labels ``[N]``, or
    a 0/1 attribute matrix ``[N, K]`` whose class column ``cfg.target`` names via ``attr_names`` or indexes).
    Optional ``class_names`` names the classes of single-label files."""
    fix = "Set data.path= to the .npz file (absolute, or relative to data.root)."
    if cfg.path is None:
        raise DataError(f"npz: no file given. {fix}")
    path = _locate(cfg.path, cfg.root, "npz", fix)
    if path.is_dir():
        raise DataError(
            f"npz: {path} is a folder, not an .npz file. {fix} (A folder of images is data.name=imagefolder.)"
        )
    if not zipfile.is_zipfile(path):
        raise DataError(
            f"npz: {path} is not an .npz file (the zip archive np.savez writes); write it with "
            "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
        )
    with np.load(path) as file:
        missing = [key for key in NPZ_KEYS if key not in file.files]
        if missing:
            raise DataError(
                f"npz: {path} lacks {', '.join(missing)} (has: {', '.join(file.files)}). It needs x_train, y_train, "
                "x_test, y_test: uint8 images NHW or NHWC, labels [N] or a 0/1 attribute matrix [N, K]."
            )
        arrays = {key: file[key] for key in NPZ_KEYS}
        attr_names = [str(name) for name in file["attr_names"]] if "attr_names" in file.files else None
        stored_names = [str(name) for name in file["class_names"]] if "class_names" in file.files else None
    images = {key: _images_nchw(arrays[key], f"npz {key}") for key in ("x_train", "x_test")}
    for split in ("train", "test"):
        if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise DataError(
                f"npz: {path} has {len(arrays[f'x_{split}'])} images in x_{split} but {len(arrays[f'y_{split}'])} "
                f"labels in y_{split}; they must match one to one"
            )
        if len(arrays[f"x_{split}"]) == 0:
            raise DataError(f"npz: x_{split} of {path} holds no image; a run needs training and test images")
    if arrays["y_train"].ndim == 2:
        y_train, class_names = _binary_attribute(arrays["y_train"], attr_names, cfg.target, f"npz {path}")
        y_test, _ = _binary_attribute(arrays["y_test"], attr_names, cfg.target, f"npz {path}")
    else:
        if cfg.target is not None:
            raise DataError(
                f"npz: data.target={cfg.target!r} given but y_train of {path} is single-label [N]; unset data.target"
            )
        y_train, y_test = (_class_indices(arrays[key], f"npz {key} of {path}") for key in ("y_train", "y_test"))
        num_classes = len(stored_names) if stored_names else int(y_train.max()) + 1
        _check_label_range(y_train, y_test, num_classes, stored_names is not None, f"npz {path}")
        class_names = stored_names or [str(label) for label in range(num_classes)]
    size = cfg.img_size or min(images["x_train"].shape[-2:])
    return DatasetSource(
        train=TensorImagePool(images["x_train"], y_train, size=size),
        val=None,
        test=TensorImagePool(images["x_test"], y_test, size=size),
        class_names=class_names,
    )


_LOADERS = {
    "digits": _load_digits,
    "mnist": lambda cfg, download: _load_mnist_like(tvd.MNIST, "mnist", cfg, download),
    "fashion-mnist": lambda cfg, download: _load_mnist_like(tvd.FashionMNIST, "fashion-mnist", cfg, download),
    "cifar10": lambda cfg, download: _load_cifar(_CIFAR10Files, "cifar10", cfg, download),
    "cifar100": lambda cfg, download: _load_cifar(_CIFAR100Files, "cifar100", cfg, download),
    "svhn": _load_svhn,
    "celeba": _load_celeba,
    "tiny-imagenet": _load_tiny_imagenet,
    "imagefolder": _load_imagefolder,
    "npz": _load_npz,
}

"""Image datasets by name, read from their real on-disk formats.

A loader returns a :class:`DatasetSource`: an image pool for each split the dataset ships, and its class names.
A pool holds its labels as int64 ``[N]`` and yields ``(image: uint8 [C, S, S], label: int)`` at the final square
size ``S``. In-memory sets (digits, MNIST-like, CIFAR, SVHN, npz) keep all images as one uint8 tensor; folder sets
(CelebA, Tiny ImageNet, imagefolder) decode their files on access.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torchvision.datasets as tvd
from sklearn.datasets import load_digits
from torchvision.datasets.mnist import read_image_file, read_label_file
from torchvision.datasets.utils import download_and_extract_archive, extract_archive

from vitlab.atomic import publish_files, staging_folder
from vitlab.data.config import DataConfig, DataError, check_dataset_name
from vitlab.data.hf_datasets import load_hf_dataset
from vitlab.data.imagefolder import load_imagefolder
from vitlab.data.sources import (
    _KNOWN_INFO,
    CELEBA_DEFAULT_TARGET,
    DOWNLOADABLE,
    NPZ_KEYS,
    TINY_IMAGENET_URL,
    DatasetInfo,
    DatasetNotFoundError,
    DatasetSource,
    ImageFilePool,
    TensorImagePool,
    _binary_attribute,
    _check_label_range,
    _class_indices,
    _download_hint,
    _images_nchw,
    _locate,
    _native_size,
    _require,
    check_split_channels,
    class_names_problem,
)


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
            "imagefolder and hf images only: unset it"
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
        with staging_folder(target) as stage:
            extract_archive(str(packed), str(stage))
            publish_files(stage, target.parent, [beside.name], whole=False)
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


def _files_checked(dataset_class: type[tvd.CIFAR10]) -> type[tvd.CIFAR10]:
    """CIFAR-10/100 that checks its batch files exist rather than their md5 (a download still checks the archive's)."""
    unchecked = {
        key: [(filename, None) for filename, _ in getattr(dataset_class, key)] for key in ("train_list", "test_list")
    }
    return type(dataset_class.__name__, (dataset_class,), {**unchecked, "meta": {**dataset_class.meta, "md5": None}})


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


def _npz_array(file: np.lib.npyio.NpzFile, key: str, path: Path) -> np.ndarray:
    """``file[key]``; an array of Python objects (which only unpickling reads, and ``np.load`` reads no pickle: one
    can run code) is a :class:`DataError` that says how to save it instead."""
    try:
        return file[key]
    except ValueError as e:
        raise DataError(
            f"npz: {key} of {path} is an array of Python objects (dtype=object), which vitlab does not unpickle; save "
            "it as numbers (images uint8, labels int) or, for names, as strings: np.array(names, dtype=str)"
        ) from e


def _load_npz(cfg: DataConfig, download: bool) -> DatasetSource:
    """A ``.npz`` file with ``x_train, y_train, x_test, y_test`` (uint8 images NHW or NHWC; int labels ``[N]``, or
    a 0/1 attribute matrix ``[N, K]`` whose class column ``cfg.target`` names via ``attr_names`` or indexes).
    Optional ``class_names`` names the classes of single-label files."""
    path, arrays = _read_npz(cfg)
    images = {key: _images_nchw(arrays[key], f"npz {key}") for key in ("x_train", "x_test")}
    check_split_channels(images, f"npz {path}")
    for split in ("train", "test"):
        if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
            raise DataError(
                f"npz: {path} has {len(arrays[f'x_{split}'])} images in x_{split} but {len(arrays[f'y_{split}'])} "
                f"labels in y_{split}; they must match one to one"
            )
        if len(arrays[f"x_{split}"]) == 0:
            raise DataError(f"npz: x_{split} of {path} holds no image; a run needs training and test images")
    y_train, y_test, class_names = _npz_labels(cfg, arrays, path)
    size = cfg.img_size or min(images["x_train"].shape[-2:])
    return DatasetSource(
        train=TensorImagePool(images["x_train"], y_train, size=size),
        val=None,
        test=TensorImagePool(images["x_test"], y_test, size=size),
        class_names=class_names,
    )


def _read_npz(cfg: DataConfig) -> tuple[Path, dict[str, np.ndarray]]:
    """The file ``data.path`` names and its arrays, every one :data:`NPZ_KEYS` names there."""
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
        return path, {
            key: _npz_array(file, key, path) for key in (*NPZ_KEYS, "attr_names", "class_names") if key in file
        }


def _npz_labels(
    cfg: DataConfig, arrays: dict[str, np.ndarray], path: Path
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``y_train, y_test`` as class indices and the class names: one attribute's column of a 0/1 matrix
    (``data.target``), or single labels named by the file's ``class_names`` or by their numbers."""
    if arrays["y_train"].ndim == 2:
        attr_names = [str(name) for name in arrays["attr_names"]] if "attr_names" in arrays else None
        y_train, class_names = _binary_attribute(arrays["y_train"], attr_names, cfg.target, f"npz {path}")
        y_test, _ = _binary_attribute(arrays["y_test"], attr_names, cfg.target, f"npz {path}")
        return y_train, y_test, class_names
    if cfg.target is not None:
        raise DataError(
            f"npz: data.target={cfg.target!r} given but y_train of {path} is single-label [N]; unset data.target"
        )
    stored_names = [str(name) for name in arrays["class_names"]] if "class_names" in arrays else None
    y_train, y_test = (_class_indices(arrays[key], f"npz {key} of {path}") for key in ("y_train", "y_test"))
    num_classes = len(stored_names) if stored_names else int(y_train.max()) + 1
    problem = class_names_problem(stored_names, num_classes) if stored_names else None
    if problem:
        raise DataError(f"npz: the class_names of {path} {problem}; give each class its own name")
    _check_label_range(y_train, y_test, num_classes, stored_names is not None, f"npz {path}")
    return y_train, y_test, stored_names or [str(label) for label in range(num_classes)]


_LOADERS = {
    "digits": _load_digits,
    "mnist": lambda cfg, download: _load_mnist_like(tvd.MNIST, "mnist", cfg, download),
    "fashion-mnist": lambda cfg, download: _load_mnist_like(tvd.FashionMNIST, "fashion-mnist", cfg, download),
    "cifar10": lambda cfg, download: _load_cifar(_files_checked(tvd.CIFAR10), "cifar10", cfg, download),
    "cifar100": lambda cfg, download: _load_cifar(_files_checked(tvd.CIFAR100), "cifar100", cfg, download),
    "svhn": _load_svhn,
    "celeba": _load_celeba,
    "tiny-imagenet": _load_tiny_imagenet,
    "imagefolder": load_imagefolder,
    "npz": _load_npz,
    "hf": load_hf_dataset,
}

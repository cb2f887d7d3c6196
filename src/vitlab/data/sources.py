"""What a dataset loader returns and the helpers the loaders share: the errors, the dataset's info, the image
pools (tensors in memory, files read on access), the splits, and the checks of files, arrays and labels."""

from __future__ import annotations

import contextlib
import difflib
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms.v2.functional import pil_to_tensor

from vitlab.data.config import DATASETS as DATASETS  # the names live with the config, which loads no torch
from vitlab.data.config import DataConfig, DataError
from vitlab.data.transforms import resize_to_square

DOWNLOADABLE = ["mnist", "fashion-mnist", "cifar10", "cifar100", "svhn", "celeba", "tiny-imagenet"]
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
CELEBA_DEFAULT_TARGET = "Male"
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
#: the files whose named classes without a training image were already said (a file is loaded more than once)
_said_empty: set[str] = set()


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


def image_pixels(image: Image.Image, mode: str) -> Tensor:
    """``uint8 [C, H, W]`` of a PIL image in ``mode`` (``"L"``: 1 channel, ``"RGB"``: 3), every bit depth PIL reads
    scaled to 0..255. PIL's ``convert`` clips integer images (a 16-bit PNG, mode ``I;16``) to 0..255, which makes
    every pixel >= 1 white: their 0..65535 is divided by 257 (= 65535 / 255) here instead. A float image (mode ``F``)
    or an integer one outside 0..65535 has no range to scale from, and is a :class:`DataError`."""
    if image.mode == "F":
        raise DataError("32-bit float image (PIL mode F) has no agreed range; save it as an 8- or 16-bit image")
    if image.mode == "I" or image.mode.startswith("I;16"):
        values = np.asarray(image)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise DataError(
                f"32-bit integer image (PIL mode I) with values in {values.min()}..{values.max()}, outside 0..65535; "
                "save it as an 8- or 16-bit image"
            )
        image = Image.fromarray(np.rint(values / 257).astype(np.uint8))
    return pil_to_tensor(image.convert(mode))


@contextlib.contextmanager
def open_image(path: str | Path | IO[bytes]) -> Iterator[Image.Image]:
    """An image file as a viewer shows it: its EXIF ``Orientation`` applied (``PIL.ImageOps.exif_transpose``; a
    camera stores a portrait photo as landscape pixels with Orientation=6, "rotate 90 degrees clockwise to show").
    PIL's guard against decompression bombs (an image of more than twice ``PIL.Image.MAX_IMAGE_PIXELS`` pixels: a
    small file that would decode into gigabytes) is a one-line :class:`DataError` naming the limit; PIL's other
    errors pass through."""
    try:
        with Image.open(path) as image:
            yield ImageOps.exif_transpose(image)
    except Image.DecompressionBombError as e:
        raise DataError(
            f"{str(e).split(',')[0]}: PIL refuses it as a possible decompression bomb (a small file that decodes "
            "into gigabytes of memory; the limit is twice PIL.Image.MAX_IMAGE_PIXELS); shrink the image"
        ) from e


def read_image_file(path: str | Path, mode: str) -> Tensor:
    """``uint8 [C, H, W]`` of an image file in ``mode`` (:func:`image_pixels`) as a viewer shows it
    (:func:`open_image`): the one reader of image files, for training (imagefolder), ``predict`` and ``explain``.
    PIL's errors (and :class:`DataError`) pass through."""
    try:
        with open_image(path) as image:
            return image_pixels(image, mode)
    except DataError as e:
        raise DataError(f"{path}: {e}") from e


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
            pixels = read_image_file(self.paths[index], self.mode)
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
    if array.ndim not in (3, 4):
        raise DataError(
            f"{where} must be images NHW (gray) or NHWC (RGB), got shape {list(array.shape)} ({array.ndim} axes); "
            "stack the images into one array of N images (a single image H x W is x[None])"
        )
    if array.dtype != np.uint8:
        raise DataError(
            f"{where} must be uint8 images, got {array.dtype} {list(array.shape)}; convert with "
            "(x * 255).round().clip(0, 255).astype(np.uint8) if it holds floats in [0, 1]."
        )
    images = torch.from_numpy(np.ascontiguousarray(array))
    return images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2).contiguous()


def check_split_channels(images: dict[str, Tensor], where: str) -> None:
    """Every split's images ``[N, C, H, W]`` have 1 (gray) or 3 (RGB) channels, the same number in each split: a
    model takes one channel count, and the transforms, ``predict`` and ``explain`` read gray or RGB images."""
    channels = {key: int(x.shape[1]) for key, x in images.items()}
    for key, count in channels.items():
        if count not in (1, 3):
            raise DataError(
                f"{where}: {key} has {count} channels (shape NHWC with C={count}); vitlab reads gray (NHW or C=1) or "
                f"RGB (C=3) images: keep 3 channels (x[..., :3]) or convert them to one"
            )
    if len(set(channels.values())) > 1:
        shown = ", ".join(f"{key} {count}" for key, count in channels.items())
        raise DataError(
            f"{where}: the splits differ in channels ({shown}); give every split the same: gray (NHW) or RGB "
            "(NHWC, C=3)"
        )


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


def class_names_problem(names: Sequence[str], num_classes: int) -> str | None:
    """What keeps ``names`` from naming the classes of a ``num_classes``-way head one to one (a count that differs,
    a name given twice), as the rest of a sentence whose subject holds the names; None when they fit."""
    if len(names) != num_classes:
        return f"names {len(names)} classes, the model has {num_classes}"
    twice = [name for name, count in Counter(names).items() if count > 1]
    return f"names {twice[0]!r} {names.count(twice[0])} times" if twice else None


def _check_label_range(train: Tensor, test: Tensor, num_classes: int, named: bool, where: str) -> None:
    """Classes 0..K-1 must all occur in the training labels unless the file names them (``class_names``: said once,
    in one line on stderr), and the test labels must be among them."""
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
    if named and len(present) < num_classes and where not in _said_empty:
        _said_empty.add(where)
        print(
            f"{where}: y_train uses {len(present)} of the {num_classes} classes its class_names names; the model gets "
            f"a {num_classes}-way head, as the file says, and never learns the classes without a training image (to "
            f"train a {len(present)}-way one, drop their names and remap the labels)",
            file=sys.stderr,
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

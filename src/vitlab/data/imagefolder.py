"""The ``imagefolder`` dataset: any folder tree of class folders, every image decoded once at set-up (the loader of
:func:`vitlab.data.datasets.load_dataset` for ``data.name=imagefolder``)."""

from __future__ import annotations

import functools
import os
import sys
from collections import Counter
from pathlib import Path

import torch
from torchvision.datasets.folder import IMG_EXTENSIONS

from vitlab.data.config import DataConfig, DataError
from vitlab.data.sources import DatasetNotFoundError, DatasetSource, ImageFilePool, _locate, image_pixels, open_image

_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"}
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
        with open_image(path) as image:
            mode, shorter = image.mode, min(image.size)
            image_pixels(image, "L")  # a full decode (a truncated file opens fine and fails only here), a bit depth
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


def load_imagefolder(cfg: DataConfig, download: bool) -> DatasetSource:
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
    _check_classes(train_dir, class_names, train_samples)
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


def _check_classes(train_dir: Path, class_names: list[str], train_samples: list[tuple[Path, int]]) -> None:
    """Every class folder holds a readable training image, and there are at least two classes."""
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

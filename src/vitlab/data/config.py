"""The data section of a run's configuration."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from vitlab.errors import VitlabError

DATASETS = [
    "digits",
    "mnist",
    "fashion-mnist",
    "cifar10",
    "cifar100",
    "svhn",
    "celeba",
    "tiny-imagenet",
    "imagefolder",
    "npz",
    "hf",
]


class DataError(VitlabError, ValueError):
    """A data configuration problem the user can fix; the message says how."""


def check_dataset_name(name: str) -> str:
    """The canonical dataset name (case-insensitive, ``_`` accepted for ``-``), or an error naming the known ones."""
    canonical = name.lower().replace("_", "-")
    if canonical in DATASETS:
        return canonical
    close = difflib.get_close_matches(canonical, DATASETS, n=1)
    suggestion = f" Did you mean {close[0]!r}?" if close else ""
    raise DataError(f"unknown dataset {name!r}.{suggestion} Known datasets: {', '.join(DATASETS)} (set data.name=).")


@dataclass
class AugmentConfig:
    """Training-time augmentation. Pad-and-crop, flip and AutoAugment run on the uint8 batch in the collate function
    (``batched``, the default: the same images bit for bit as torchvision's per-image transforms from the same
    random state, about half the CPU time per batch) or image by image in the dataset (``batched: false``); random
    erasing, MixUp and CutMix run on the normalised batch in the collate function."""

    random_crop: bool = False  # pad-and-crop (padding = crop_padding)
    crop_padding: int = 4
    hflip: bool = False
    autoaugment: bool = False  # torchvision AutoAugment (CIFAR10 policy); works on 1 and 3 channels
    random_erasing: float = 0.0  # probability for torchvision RandomErasing
    mixup_alpha: float = 0.0  # torchvision.transforms.v2.MixUp on batches (collate), soft labels out
    cutmix_alpha: float = 0.0  # v2.CutMix; with both > 0, RandomChoice between them
    batched: bool = True  # crop/flip/AutoAugment a batch at a time (same images as false, which runs them per image)


@dataclass
class DataConfig:
    """Which dataset, where its files are, and how it is split and batched.

    Splits: the test set is the dataset's official test split (``tiny-imagenet``: its labelled ``val``); where there
    is none (``digits``, an ``imagefolder``, ``npz`` or ``hf`` without one) a fixed 20% stratified test split is carved
    off the training set with seed 0, whatever ``seed`` says, so every run is tested on the same images. The
    validation set is a seeded ``val_fraction`` split of the (remaining) training set, except where the dataset
    ships a validation split (``celeba``'s official partition, ``imagefolder``'s ``val/`` folder, ``hf``'s
    ``validation``).
    """

    name: str = "digits"
    root: str = "data"  # where files are looked for (and downloaded to with download=True)
    path: str | None = None  # for npz: the file; for imagefolder/tiny-imagenet: the folder (falls back to root)
    target: str | int | None = None  # class column for multi-label y (celeba/npz): name or index; celeba default "Male"
    img_size: int | None = None  # resize to this square size; None = native size
    in_chans: int | None = None  # imagefolder, hf: 1 (gray) or 3 (RGB), every image converted; None = most images' own
    strict_images: bool = False  # imagefolder, hf: an unreadable image is an error (naming it) instead of skipped
    image_column: str | None = None  # hf: the column of images; None = the Image feature, else image/img/pixel_values
    label_column: str | None = None  # hf: the column of labels; None = the ClassLabel feature, else label/labels/...
    batch_size: int = 64
    eval_batch_size: int | None = None
    num_workers: int = 0
    val_fraction: float = 0.1  # seeded split of the TRAIN set into train/val
    seed: int = 0
    download: bool = False
    limit_train: int | None = None  # keep only the first n (after the seeded split) - for quick runs
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        """``name: hf:PATH`` is ``name: hf`` with ``path: PATH``, so the run's config names its files in one place."""
        if isinstance(self.name, str) and self.name.lower().startswith("hf:"):
            given = self.name[3:]
            if not given or (self.path is not None and self.path != given):
                raise DataError(
                    f"data.name={self.name!r} names the dataset's files"
                    + (f" and data.path={self.path!r} other ones; give one of them" if given else ", but is empty")
                    + ": data.name=hf:PATH, or data.name=hf with data.path=PATH"
                )
            self.name, self.path = "hf", given

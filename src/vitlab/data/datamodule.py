"""One LightningDataModule for every dataset: seeded splits, an epoch-seeded shuffle, normalised batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from vitlab.data.config import DataConfig, DataError
from vitlab.data.datasets import dataset_info, download_dataset, load_dataset
from vitlab.data.sources import DatasetInfo, ImagePool
from vitlab.data.transforms import NormalizeCollate, build_train_transform, channel_mean_std

TEST_FRACTION = 0.2  # carved off the training set when a dataset ships no test split
TEST_SPLIT_SEED = 0  # fixed, so that every run is tested on the same images whatever its seed


def split_indices(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded split of ``range(N)`` into ``(kept, held_out)`` with ``round(fraction * N)`` held out, both in shuffled
    order. ``labels: int64 [N]``. Stratified by label when it can be (every class present has two members and both
    parts have room for one of each); otherwise a plain random split."""
    count = len(labels)
    held_out = round(fraction * count)
    if held_out == 0:
        return torch.randperm(count, generator=torch.Generator().manual_seed(seed)), torch.empty(0, dtype=torch.int64)
    if held_out >= count:
        raise DataError(f"holding out {fraction:.0%} of {count} images leaves none to train on")
    class_counts = torch.bincount(labels)
    present = class_counts[class_counts > 0]
    stratify = present.min() >= 2 and min(held_out, count - held_out) >= len(present)
    kept, out = train_test_split(
        np.arange(count), test_size=held_out, random_state=seed, stratify=labels.numpy() if stratify else None
    )
    return torch.from_numpy(kept), torch.from_numpy(out)


class EpochShuffleSampler(Sampler[int]):
    """A random order of ``range(num_samples)`` that depends only on ``(seed, epoch)``, so a resumed run replays the
    same order. Lightning calls :meth:`set_epoch` at every epoch (through its DistributedSampler wrapper under DDP)."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples).tolist())

    def __len__(self) -> int:
        return self.num_samples


class ImageSplit(Dataset):
    """The images ``indices: int64 [n]`` of a pool, with an optional per-image transform of the uint8 image."""

    def __init__(self, pool: ImagePool, indices: Tensor, transform: Callable[[Tensor], Tensor] | None = None) -> None:
        self.pool = pool
        self.indices = indices
        self.transform = transform

    @property
    def labels(self) -> Tensor:
        """int64 ``[n]``."""
        return self.pool.labels[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image, label = self.pool[int(self.indices[index])]
        return (image if self.transform is None else self.transform(image)), label


def _whole(pool: ImagePool) -> ImageSplit:
    return ImageSplit(pool, torch.arange(len(pool)))


def _check_config(cfg: DataConfig) -> None:
    problems = []
    if cfg.batch_size < 1:
        problems.append(f"data.batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.eval_batch_size is not None and cfg.eval_batch_size < 1:
        problems.append(f"data.eval_batch_size must be >= 1 or null, got {cfg.eval_batch_size}")
    if not 0.0 <= cfg.val_fraction < 1.0:
        problems.append(f"data.val_fraction must be in [0, 1), got {cfg.val_fraction}")
    if cfg.num_workers < 0:
        problems.append(f"data.num_workers must be >= 0, got {cfg.num_workers}")
    if cfg.limit_train is not None and cfg.limit_train < 1:
        problems.append(f"data.limit_train must be >= 1 or null, got {cfg.limit_train}")
    if not 0.0 <= cfg.augment.random_erasing <= 1.0:
        problems.append(f"data.augment.random_erasing is a probability in [0, 1], got {cfg.augment.random_erasing}")
    if cfg.augment.mixup_alpha < 0 or cfg.augment.cutmix_alpha < 0:
        problems.append("data.augment.mixup_alpha and cutmix_alpha must be >= 0 (0 turns them off)")
    if problems:
        raise DataError("; ".join(problems))


def _check_splits(
    cfg: DataConfig, labels: Tensor, train: ImageSplit, val: ImageSplit, test: ImageSplit, carved_val: bool
) -> None:
    """At least two classes, and an image in every split (validation may be empty only by ``val_fraction=0``)."""
    classes = torch.unique(labels).tolist()
    if len(classes) < 2:
        raise DataError(
            f"data: every training image of {cfg.name} has the label {classes[0] if classes else '-'}; a classifier "
            "needs images of at least two classes"
        )
    no_val = len(val) == 0 and not (carved_val and cfg.val_fraction == 0)
    if len(train) == 0 or len(test) == 0 or no_val:
        hint = " or raise data.val_fraction" if no_val and carved_val else ""
        raise DataError(
            f"data: {cfg.name} gives {len(train)} training, {len(val)} validation and {len(test)} test images; every "
            f"split needs at least one image: add images{hint}"
        )


class VisionDataModule(pl.LightningDataModule):
    """Train/val/test loaders of one image-classification dataset, configured by :class:`DataConfig`.

    Batches are ``(x: float [B, C, H, W]`` normalised with ``mean``/``std``, ``y: int64 [B])``; with MixUp or CutMix
    the training ``y`` is float ``[B, num_classes]`` soft labels. ``num_classes``, ``in_chans`` and ``img_size``
    are known on construction; ``class_names`` and any ``mean``/``std`` computed from the training images load the
    data on first use (as :meth:`setup` does).
    """

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__()
        _check_config(cfg)
        self.cfg = cfg
        self.info: DatasetInfo = dataset_info(cfg)
        self.train_set: ImageSplit | None = None
        self.val_set: ImageSplit | None = None
        self.test_set: ImageSplit | None = None
        self._class_names: list[str] | None = None
        self._mean_std = None if self.info.mean is None else (self.info.mean, self.info.std)

    @property
    def num_classes(self) -> int:
        return self.info.num_classes

    @property
    def in_chans(self) -> int:
        return self.info.in_chans

    @property
    def img_size(self) -> int:
        return self.info.img_size

    @property
    def class_names(self) -> list[str]:
        self.setup()
        return self._class_names

    @property
    def mean(self) -> tuple[float, ...]:
        if self._mean_std is None:
            self.setup()
        return self._mean_std[0]

    @property
    def std(self) -> tuple[float, ...]:
        if self._mean_std is None:
            self.setup()
        return self._mean_std[1]

    def set_normalisation(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Normalise with this ``mean`` and ``std`` (one per channel) instead of the training images' own, e.g. those
        of pretrained weights (their ``pretrained_cfg``). Before the loaders are built."""
        if len(mean) != self.in_chans or len(std) != self.in_chans or min(std) <= 0:
            raise ValueError(
                f"normalisation needs {self.in_chans} means and {self.in_chans} positive stds (one per channel of "
                f"{self.cfg.name}), got mean={list(mean)}, std={list(std)}"
            )
        self._mean_std = (tuple(float(m) for m in mean), tuple(float(s) for s in std))

    def prepare_data(self) -> None:
        """Download the dataset when ``cfg.download`` (Lightning runs this on one process per node)."""
        if self.cfg.download:
            download_dataset(self.cfg)

    def setup(self, stage: str | None = None) -> None:
        """Read the dataset and make the splits (once; later calls do nothing)."""
        if self.train_set is not None:
            return
        cfg = self.cfg
        source = load_dataset(cfg)
        train_indices = torch.arange(len(source.train))
        if source.test is None:
            train_indices, test_indices = split_indices(source.train.labels, TEST_FRACTION, TEST_SPLIT_SEED)
            self.test_set = ImageSplit(source.train, test_indices)
        else:
            self.test_set = _whole(source.test)
        if source.val is None:
            kept, held_out = split_indices(source.train.labels[train_indices], cfg.val_fraction, cfg.seed)
            self.val_set = ImageSplit(source.train, train_indices[held_out])
            train_indices = train_indices[kept]
        else:
            self.val_set = _whole(source.val)
        train_indices = train_indices[: cfg.limit_train]
        if self._mean_std is None:
            self._mean_std = channel_mean_std(ImageSplit(source.train, train_indices), seed=cfg.seed)
        self._class_names = source.class_names
        # with augment.batched the collate function augments the whole batch (BatchAugment): no per-image transform
        per_image = None if cfg.augment.batched else build_train_transform(cfg.augment, self.img_size)
        self.train_set = ImageSplit(source.train, train_indices, per_image)
        self._carved_val = source.val is None

    def check_trainable(self) -> None:
        """What a training run needs of the data, checked before its run folder is made: :func:`_check_splits`."""
        self.setup()
        _check_splits(
            self.cfg, self.train_set.pool.labels, self.train_set, self.val_set, self.test_set, self._carved_val
        )

    def train_dataloader(self) -> DataLoader:
        self.setup()
        collate = NormalizeCollate(self.mean, self.std, num_classes=self.num_classes, augment=self.cfg.augment)
        sampler = EpochShuffleSampler(len(self.train_set), self.cfg.seed)
        # A ragged last batch (possibly of one image) would skew batch statistics such as the MMD of ViTCAE.
        drop_last = len(self.train_set) > self.cfg.batch_size
        loader = self._loader(self.train_set, self.cfg.batch_size, collate, sampler, drop_last=drop_last)
        # Its own generator: creating an iterator draws a base seed from the loader's generator, which would
        # otherwise come from the global RNG and shift every augmentation after a resume (the resumed run
        # creates its first iterator at another point than an uninterrupted one).
        loader.generator = torch.Generator().manual_seed(self.cfg.seed)
        return loader

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        self.setup()
        return self._eval_loader(self.test_set)

    def _eval_loader(self, dataset: ImageSplit) -> DataLoader:
        collate = NormalizeCollate(self.mean, self.std, num_classes=self.num_classes)
        return self._loader(dataset, self.cfg.eval_batch_size or self.cfg.batch_size, collate, sampler=None)

    def _loader(
        self,
        dataset: Dataset,
        batch_size: int,
        collate: NormalizeCollate,
        sampler: Sampler | None,
        drop_last: bool = False,
    ) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            collate_fn=collate,
            num_workers=self.cfg.num_workers,
            persistent_workers=self.cfg.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
        )


def build_datamodule(cfg: DataConfig) -> VisionDataModule:
    """The data module for ``cfg`` (reads nothing yet for the named datasets)."""
    return VisionDataModule(cfg)

"""Datasets by name, their transforms, and the one LightningDataModule that serves them.

The names are imported when first used (PEP 562): ``vitlab.config`` reads ``vitlab.data.config`` (plain
dataclasses) without loading Lightning, torchvision and scikit-learn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitlab.data.config import DATASETS, AugmentConfig, DataConfig, DataError
from vitlab.lazy import lazy_exports

if TYPE_CHECKING:
    from vitlab.data.datamodule import (
        EpochShuffleSampler,
        ImageSplit,
        VisionDataModule,
        build_datamodule,
        split_indices,
    )
    from vitlab.data.datasets import dataset_info, download_dataset, load_dataset
    from vitlab.data.sources import DatasetInfo, DatasetNotFoundError, DatasetSource
    from vitlab.data.transforms import (
        BatchAugment,
        NormalizeCollate,
        channel_mean_std,
        denormalize,
        normalize,
        resize_to_square,
    )


#: public name -> the module that defines it
_LAZY = {
    "BatchAugment": "vitlab.data.transforms",
    "DatasetInfo": "vitlab.data.sources",
    "DatasetNotFoundError": "vitlab.data.sources",
    "DatasetSource": "vitlab.data.sources",
    "EpochShuffleSampler": "vitlab.data.datamodule",
    "ImageSplit": "vitlab.data.datamodule",
    "NormalizeCollate": "vitlab.data.transforms",
    "VisionDataModule": "vitlab.data.datamodule",
    "build_datamodule": "vitlab.data.datamodule",
    "channel_mean_std": "vitlab.data.transforms",
    "dataset_info": "vitlab.data.datasets",
    "denormalize": "vitlab.data.transforms",
    "download_dataset": "vitlab.data.datasets",
    "load_dataset": "vitlab.data.datasets",
    "normalize": "vitlab.data.transforms",
    "resize_to_square": "vitlab.data.transforms",
    "split_indices": "vitlab.data.datamodule",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "DATASETS",
    "AugmentConfig",
    "BatchAugment",
    "DataConfig",
    "DataError",
    "DatasetInfo",
    "DatasetNotFoundError",
    "DatasetSource",
    "EpochShuffleSampler",
    "ImageSplit",
    "NormalizeCollate",
    "VisionDataModule",
    "build_datamodule",
    "channel_mean_std",
    "dataset_info",
    "denormalize",
    "download_dataset",
    "load_dataset",
    "normalize",
    "resize_to_square",
    "split_indices",
]

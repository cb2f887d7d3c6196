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
    from vitlab.data.datasets import dataset_info
    from vitlab.data.sources import DatasetNotFoundError
    from vitlab.data.transforms import BatchAugment, NormalizeCollate, denormalize, normalize


#: public name -> the module that defines it
_LAZY = {
    "BatchAugment": "vitlab.data.transforms",
    "DatasetNotFoundError": "vitlab.data.sources",
    "EpochShuffleSampler": "vitlab.data.datamodule",
    "ImageSplit": "vitlab.data.datamodule",
    "NormalizeCollate": "vitlab.data.transforms",
    "VisionDataModule": "vitlab.data.datamodule",
    "build_datamodule": "vitlab.data.datamodule",
    "dataset_info": "vitlab.data.datasets",
    "denormalize": "vitlab.data.transforms",
    "normalize": "vitlab.data.transforms",
    "split_indices": "vitlab.data.datamodule",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "DATASETS",
    "AugmentConfig",
    "BatchAugment",
    "DataConfig",
    "DataError",
    "DatasetNotFoundError",
    "EpochShuffleSampler",
    "ImageSplit",
    "NormalizeCollate",
    "VisionDataModule",
    "build_datamodule",
    "dataset_info",
    "denormalize",
    "normalize",
    "split_indices",
]

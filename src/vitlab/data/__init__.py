"""Datasets by name, their transforms, and the one LightningDataModule that serves them."""

from vitlab.data.config import AugmentConfig, DataConfig
from vitlab.data.datamodule import (
    EpochShuffleSampler,
    ImageSplit,
    VisionDataModule,
    build_datamodule,
    split_indices,
)
from vitlab.data.datasets import (
    DATASETS,
    DataError,
    DatasetInfo,
    DatasetNotFoundError,
    DatasetSource,
    dataset_info,
    download_dataset,
    load_dataset,
)
from vitlab.data.transforms import NormalizeCollate, channel_mean_std, denormalize, resize_to_square

__all__ = [
    "DATASETS",
    "AugmentConfig",
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
    "resize_to_square",
    "split_indices",
]

"""Image transforms: square resizing, per-image augmentation, batch normalisation with MixUp/CutMix.

Images stay uint8 ``[C, H, W]`` through the dataset and the per-image augmentations (cheap to copy and what
AutoAugment expects); the collate function stacks them, converts to float and normalises the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from vitlab.data.config import AugmentConfig


def resize_to_square(image: Tensor, size: int) -> Tensor:
    """Shorter side resized to ``size`` (antialiased), then centre-cropped: ``image: uint8 [C, H, W]`` ->
    ``[C, size, size]``. An image already of that size is returned as is."""
    if tuple(image.shape[-2:]) == (size, size):
        return image
    return F.center_crop(F.resize(image, size, antialias=True), [size, size])


def build_train_transform(augment: AugmentConfig, img_size: int) -> Callable[[Tensor], Tensor] | None:
    """The per-image training augmentation on ``uint8 [C, img_size, img_size]`` images, or None if there is none:
    pad-and-crop, horizontal flip, then AutoAugment (CIFAR-10 policy, Cubuk et al. 2019)."""
    steps: list[Callable[[Tensor], Tensor]] = []
    if augment.random_crop:
        steps.append(v2.RandomCrop(img_size, padding=augment.crop_padding))
    if augment.hflip:
        steps.append(v2.RandomHorizontalFlip())
    if augment.autoaugment:
        steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10))
    return v2.Compose(steps) if steps else None


class NormalizeCollate:
    """Collate ``[(image: uint8 [C, H, W], label: int)]`` into ``(x: float [B, C, H, W], y)``.

    ``x = (image / 255 - mean) / std`` per channel; then, in training, random erasing per image (Zhong et al. 2020,
    erased pixels take the value 0, i.e. the mean) and MixUp (Zhang et al. 2018) / CutMix (Yun et al. 2019) on the
    batch. ``y`` is int64 ``[B]``, or float ``[B, num_classes]`` soft labels (each row sums to 1) when MixUp or
    CutMix is on. A class, not a closure, so that DataLoader workers can pickle it.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        num_classes: int,
        augment: AugmentConfig | None = None,
    ) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        augment = augment or AugmentConfig()
        self.erasing = v2.RandomErasing(p=augment.random_erasing) if augment.random_erasing > 0 else None
        mixers = []
        if augment.mixup_alpha > 0:
            mixers.append(v2.MixUp(alpha=augment.mixup_alpha, num_classes=num_classes))
        if augment.cutmix_alpha > 0:
            mixers.append(v2.CutMix(alpha=augment.cutmix_alpha, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixers) if mixers else None

    def __call__(self, batch: list[tuple[Tensor, int]]) -> tuple[Tensor, Tensor]:
        images, labels = zip(*batch, strict=True)
        x = normalize(torch.stack(images).float().div_(255), self.mean, self.std)
        y = torch.tensor(labels, dtype=torch.int64)
        if self.erasing is not None:
            x = torch.stack([self.erasing(image) for image in x])
        if self.mix is not None:
            x, y = self.mix(x, y)
        return x, y


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Pixels in [0, 1] -> the model's input: ``x: [B, C, H, W]`` or ``[C, H, W]`` -> ``(x - mean) / std``.

    The one normalisation of the project (the data module's collate, the evaluation suite, the generative tasks'
    judge, the report's and the probes' test images all go through it or :func:`denormalize`).
    """
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x - mean_t) / std_t


def denormalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Undo the normalisation: ``x: [B, C, H, W]`` or ``[C, H, W]`` -> ``x * std + mean`` clamped to [0, 1]."""
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x * std_t + mean_t).clamp(0.0, 1.0)


def channel_mean_std(
    dataset: Dataset, *, max_images: int = 1000, seed: int = 0
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation in [0, 1] units over up to ``max_images`` images of ``dataset``
    (a seeded random sample when it holds more), whose items are ``(image: uint8 [C, H, W], label)``."""
    count = len(dataset)
    if count == 0:
        raise ValueError("cannot compute mean/std of an empty training set")
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(count, generator=generator)[:max_images].tolist()
    channels = dataset[indices[0]][0].shape[0]
    total = torch.zeros(channels, dtype=torch.float64)
    total_sq = torch.zeros(channels, dtype=torch.float64)
    pixels = 0
    for index in indices:
        image = dataset[index][0].to(torch.float64).div_(255).flatten(1)
        total += image.sum(1)
        total_sq += image.square().sum(1)
        pixels += image.shape[1]
    mean = total / pixels
    std = (total_sq / pixels - mean.square()).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())

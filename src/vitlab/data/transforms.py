"""Image transforms: square resizing, augmentation, batch normalisation with MixUp/CutMix.

Images stay uint8 ``[C, H, W]`` through the dataset (cheap to copy and what AutoAugment expects); the collate
function stacks them, augments the uint8 batch (:class:`BatchAugment`, by default) or takes the dataset's per-image
augmentations (:func:`build_train_transform`, ``data.augment.batched=false``), converts to float and normalises the
whole batch at once.
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
    pad-and-crop, horizontal flip, then AutoAugment (CIFAR-10 policy, Cubuk et al. 2019). The dataset applies it
    image by image when ``augment.batched`` is off; :class:`BatchAugment` makes the same images a batch at a time."""
    steps: list[Callable[[Tensor], Tensor]] = []
    if augment.random_crop:
        steps.append(v2.RandomCrop(img_size, padding=augment.crop_padding))
    if augment.hflip:
        steps.append(v2.RandomHorizontalFlip())
    if augment.autoaugment:
        steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10))
    return v2.Compose(steps) if steps else None


class BatchAugment:
    """Pad-and-crop, horizontal flip and AutoAugment (CIFAR-10 policy) on a stacked batch ``uint8 [B, C, H, W]``,
    giving, from one state of the random generator, bit for bit the images that :func:`build_train_transform`
    gives image by image (``tests/data/test_batch_augment.py`` checks it).

    torchvision draws each image's decisions with scalar calls (crop offsets, the flip, the sub-policy, whether
    each of its two operations applies and its sign); this draws the same numbers with the same calls in the same
    order, then runs the arithmetic once per batch: the crop as one gather from the padded batch, the flip as one
    indexed copy, and each AutoAugment operation once on the images that drew it with the same magnitude (the kernel
    torchvision's AutoAugment calls, whose per-image statistics, such as Equalize's histograms and Contrast's mean,
    are taken per image of a batch). What is saved is torchvision's per-call overhead, 128 calls of each transform a
    batch (``benchmarks/micro/data_path.py``). The crop keeps the image size (``RandomCrop(H, padding)`` on images
    of size ``H``, as the data module's images are).
    """

    def __init__(self, augment: AugmentConfig) -> None:
        self.padding = augment.crop_padding if augment.random_crop else None
        self.hflip = augment.hflip
        self.autoaugment = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10) if augment.autoaugment else None
        self._magnitudes: dict[tuple[str, int, int], Tensor | None] = {}

    @staticmethod
    def wanted(augment: AugmentConfig) -> bool:
        """Whether ``augment`` asks for any of the operations this class makes."""
        return augment.random_crop or augment.hflip or augment.autoaugment

    def _magnitude_bins(self, transform_id: str, height: int, width: int) -> Tensor | None:
        key = (transform_id, height, width)
        if key not in self._magnitudes:  # torchvision rebuilds these bins (a linspace) at every call
            bins, _ = self.autoaugment._AUGMENTATION_SPACE[transform_id]
            self._magnitudes[key] = bins(10, height, width)
        return self._magnitudes[key]

    def _draw(self, count: int, height: int, width: int) -> tuple[list[int], list[int], list[bool], list[list]]:
        """Every image's decisions, drawn as torchvision's transforms draw them: per image, RandomCrop's two
        offsets, RandomHorizontalFlip's coin, then AutoAugment's sub-policy, coins and signs."""
        tops, lefts, flips = [0] * count, [0] * count, [False] * count
        stages: list[list[tuple[int, str, float]]] = [[], []]
        pad = self.padding
        policies = self.autoaugment._policies if self.autoaugment is not None else []
        for i in range(count):
            if pad:  # RandomCrop.make_params: offsets only along a padded side (none without padding)
                tops[i] = int(torch.randint(0, 2 * pad + 1, size=()))
                lefts[i] = int(torch.randint(0, 2 * pad + 1, size=()))
            if self.hflip:  # _RandomApplyTransform.forward: skipped when rand >= p
                flips[i] = not bool(torch.rand(1) >= 0.5)
            if self.autoaugment is None:
                continue
            policy = policies[int(torch.randint(len(policies), ()))]  # AutoAugment.forward
            for stage, (transform_id, probability, index) in enumerate(policy):
                if not torch.rand(()) <= probability:
                    continue
                magnitudes = self._magnitude_bins(transform_id, height, width)
                magnitude = 0.0
                if magnitudes is not None:
                    magnitude = float(magnitudes[index])
                    if self.autoaugment._AUGMENTATION_SPACE[transform_id][1] and torch.rand(()) <= 0.5:
                        magnitude *= -1
                stages[stage].append((i, transform_id, magnitude))
        return tops, lefts, flips, stages

    def __call__(self, images: Tensor) -> Tensor:
        """``images: uint8 [B, C, H, W]`` -> the augmented batch, the same shape (a new tensor)."""
        count, channels, height, width = images.shape
        tops, lefts, flips, stages = self._draw(count, height, width)
        x = images
        if self.padding:  # zero padding, then each image's window: one gather over the flattened padded image
            pad = self.padding
            padded = F.pad(x, [pad, pad, pad, pad], fill=0)
            row = torch.tensor(tops)[:, None, None] + torch.arange(height)[None, :, None]
            col = torch.tensor(lefts)[:, None, None] + torch.arange(width)[None, None, :]
            flat = (row * (width + 2 * pad) + col).view(count, 1, height * width).expand(count, channels, -1)
            x = padded.flatten(2).gather(2, flat).view(count, channels, height, width)
        else:
            x = x.clone()
        flipped = torch.tensor(flips, dtype=torch.bool)
        if bool(flipped.any()):
            x[flipped] = x[flipped].flip(-1)
        for stage in stages:  # the second operation sees the first one's output, as in torchvision
            groups: dict[tuple[str, float], list[int]] = {}
            for i, transform_id, magnitude in stage:
                groups.setdefault((transform_id, magnitude), []).append(i)
            for (transform_id, magnitude), members in groups.items():
                index = torch.tensor(members)
                x[index] = self.autoaugment._apply_image_or_video_transform(
                    x[index],
                    transform_id,
                    magnitude,
                    interpolation=self.autoaugment.interpolation,
                    fill=self.autoaugment._fill,
                )
        return x


class NormalizeCollate:
    """Collate ``[(image: uint8 [C, H, W], label: int)]`` into ``(x: float [B, C, H, W], y)``.

    In training, the uint8 batch is first augmented by :class:`BatchAugment` when ``augment.batched`` (the
    dataset then applies no per-image transform). ``x = (image / 255 - mean) / std`` per channel; then, in training,
    random erasing per image (Zhong et al. 2020, erased pixels take the value 0, i.e. the mean; the coin of every
    image drawn as torchvision's RandomErasing draws it, the rectangle only for the images it erases) and MixUp
    (Zhang et al. 2018) / CutMix (Yun et al. 2019) on the batch. ``y`` is int64 ``[B]``, or float
    ``[B, num_classes]`` soft labels (each row sums to 1) when MixUp or CutMix is on. A class, not
    a closure, so that DataLoader workers can pickle it.
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
        self.batch_augment = BatchAugment(augment) if augment.batched and BatchAugment.wanted(augment) else None
        self.erasing = v2.RandomErasing(p=augment.random_erasing) if augment.random_erasing > 0 else None
        mixers = []
        if augment.mixup_alpha > 0:
            mixers.append(v2.MixUp(alpha=augment.mixup_alpha, num_classes=num_classes))
        if augment.cutmix_alpha > 0:
            mixers.append(v2.CutMix(alpha=augment.cutmix_alpha, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixers) if mixers else None

    def __call__(self, batch: list[tuple[Tensor, int]]) -> tuple[Tensor, Tensor]:
        images, labels = zip(*batch, strict=True)
        x = torch.stack(images)
        if self.batch_augment is not None:
            x = self.batch_augment(x)
        x = normalize(x.float().div_(255), self.mean, self.std)
        y = torch.tensor(labels, dtype=torch.int64)
        if self.erasing is not None:
            for i in range(len(x)):  # RandomErasing's coin (rand >= p: kept), then its rectangle, image by image
                if torch.rand(1) >= self.erasing.p:
                    continue
                x[i] = self.erasing.transform(x[i], self.erasing.make_params([x[i]]))
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

"""BatchAugment: the per-image augmentations of torchvision, a batch at a time, the same images bit for bit."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from data_fixtures import write_cifar10
from vitlab.data import AugmentConfig, BatchAugment, DataConfig, NormalizeCollate, build_datamodule
from vitlab.data.transforms import build_train_transform

ALL = {"random_crop": True, "crop_padding": 4, "hflip": True, "autoaugment": True}


def images(count: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (count, channels, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def per_image(augment: AugmentConfig, batch: torch.Tensor) -> torch.Tensor:
    transform = build_train_transform(augment, batch.shape[-1])
    return torch.stack([transform(image) for image in batch])


@pytest.mark.parametrize(
    "options",
    [
        ALL,
        {**ALL, "crop_padding": 2},
        {**ALL, "crop_padding": 0},
        {"random_crop": True, "crop_padding": 4},
        {"hflip": True},
        {"autoaugment": True},
        {"random_crop": True, "crop_padding": 3, "autoaugment": True},
    ],
)
@pytest.mark.parametrize(("channels", "size"), [(3, 32), (1, 12)])
def test_batched_images_equal_torchvisions_per_image_images_from_one_random_state(options, channels, size):
    augment = AugmentConfig(**options)
    batch = images(96, channels, size)
    for seed in range(3):
        torch.manual_seed(seed)
        expected = per_image(augment, batch)
        after_expected = torch.rand(4)  # the generator must also be left where torchvision leaves it
        torch.manual_seed(seed)
        got = BatchAugment(augment)(batch)
        assert torch.equal(got, expected), f"seed {seed}: {int((got != expected).sum())} pixels differ"
        assert torch.equal(torch.rand(4), after_expected)
    assert torch.equal(batch, images(96, channels, size))  # the input is not written


def test_every_autoaugment_operation_of_the_policy_equals_its_per_image_result():
    """Each (operation, magnitude, sign) of the CIFAR-10 policy on a group of images, against one call per image:
    the random test above reaches most of them; this reaches all."""
    autoaugment = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    batch = images(12, 3, 32, seed=1)
    batch[3] = 7  # a flat image (AutoContrast's and Equalize's degenerate case)
    seen = set()
    for policy in autoaugment._policies:
        for transform_id, _, index in policy:
            bins, signed = autoaugment._AUGMENTATION_SPACE[transform_id]
            magnitudes = bins(10, 32, 32)
            for sign in (1, -1) if signed and magnitudes is not None else (1,):
                magnitude = 0.0 if magnitudes is None else sign * float(magnitudes[index])
                if (transform_id, magnitude) in seen:
                    continue
                seen.add((transform_id, magnitude))

                def apply(x, transform_id=transform_id, magnitude=magnitude):
                    return autoaugment._apply_image_or_video_transform(
                        x, transform_id, magnitude, interpolation=autoaugment.interpolation, fill=autoaugment._fill
                    )

                grouped = apply(batch)
                assert torch.equal(grouped, torch.stack([apply(image) for image in batch])), (transform_id, magnitude)
    assert {name for name, _ in seen} >= {"Invert", "Rotate", "Equalize", "Posterize", "Solarize", "AutoContrast"}


def test_random_erasing_in_the_collate_equals_torchvisions_transform_image_by_image():
    collate = NormalizeCollate((0.5,), (0.25,), num_classes=10, augment=AugmentConfig(random_erasing=0.3))
    batch = [(image, i % 10) for i, image in enumerate(images(64, 1, 16, seed=2))]
    erasing = v2.RandomErasing(p=0.3)
    torch.manual_seed(5)
    x, _ = collate(batch)
    torch.manual_seed(5)
    plain = NormalizeCollate((0.5,), (0.25,), num_classes=10)(batch)[0]
    expected = torch.stack([erasing(image) for image in plain])
    assert torch.equal(x, expected)
    assert 0 < int((x == 0).flatten(1).any(1).sum()) < 64  # some images erased, not all


def test_the_data_module_gives_the_same_training_batches_batched_or_per_image(tmp_path):
    write_cifar10(tmp_path, per_batch=40)
    full = AugmentConfig(**ALL, random_erasing=0.25, mixup_alpha=0.2)

    def batches(batched: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        augment = AugmentConfig(**{**full.__dict__, "batched": batched})
        cfg = DataConfig(name="cifar10", root=str(tmp_path), batch_size=16, val_fraction=0.2, augment=augment)
        datamodule = build_datamodule(cfg)
        datamodule.setup("fit")
        torch.manual_seed(11)
        return list(datamodule.train_dataloader())

    batched, per_image_batches = batches(True), batches(False)
    assert len(batched) == len(per_image_batches) > 1
    for (x, y), (x_ref, y_ref) in zip(batched, per_image_batches, strict=True):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_the_batched_path_is_the_default_and_leaves_the_dataset_untransformed(tmp_path):
    assert AugmentConfig().batched
    write_cifar10(tmp_path, per_batch=8)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), augment=AugmentConfig(**ALL))
    datamodule = build_datamodule(cfg)
    datamodule.setup("fit")
    assert datamodule.train_set.transform is None
    assert datamodule.train_dataloader().collate_fn.batch_augment is not None

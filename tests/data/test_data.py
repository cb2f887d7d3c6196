"""vitlab.data: every dataset read from tiny files in its real on-disk format, through the code path of real use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from data_fixtures import (
    CELEBA_ATTRIBUTES,
    random_images,
    write_celeba,
    write_cifar10,
    write_imagefolder,
    write_mnist,
    write_png,
    write_svhn,
    write_tiny_imagenet,
)
from vitlab.data import (
    DATASETS,
    AugmentConfig,
    DataConfig,
    DataError,
    DatasetNotFoundError,
    EpochShuffleSampler,
    VisionDataModule,
    build_datamodule,
    dataset_info,
    denormalize,
    split_indices,
)


def make(tmp_path, **overrides) -> VisionDataModule:
    """A set-up data module whose files live under ``tmp_path``."""
    datamodule = build_datamodule(DataConfig(root=str(tmp_path), **overrides))
    datamodule.setup("fit")
    return datamodule


def stacked_images(dataset) -> torch.Tensor:
    return torch.stack([dataset[i][0] for i in range(len(dataset))])


def assert_batch(datamodule: VisionDataModule, loader_name: str = "val_dataloader") -> None:
    """The first batch of a loader has the promised dtypes and shapes and maps back to the stored uint8 images."""
    x, y = next(iter(getattr(datamodule, loader_name)()))
    size = datamodule.img_size
    assert x.dtype == torch.float32 and x.shape[1:] == (datamodule.in_chans, size, size)
    assert y.dtype == torch.int64 and y.shape == (x.shape[0],)
    assert y.min() >= 0 and y.max() < datamodule.num_classes
    dataset = {"val_dataloader": datamodule.val_set, "test_dataloader": datamodule.test_set}[loader_name]
    expected = stacked_images(dataset)[: len(x)].float() / 255
    torch.testing.assert_close(denormalize(x, datamodule.mean, datamodule.std), expected, atol=1e-5, rtol=0)


# --- digits: the embedded default ----------------------------------------------------------------------------------


def test_digits_scaled_to_uint8_with_a_fixed_stratified_test_split(tmp_path):
    datamodule = make(tmp_path)
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (10, 1, 8)
    pool = datamodule.train_set.pool
    digits = load_digits()
    assert pool.images.dtype == torch.uint8 and pool.images.shape == (1797, 1, 8, 8)
    expected = np.clip(digits.images * 16, 0, 255).astype(np.uint8)
    assert np.array_equal(pool.images[:, 0].numpy(), expected) and pool.images.max() == 255
    sizes = len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)
    assert sum(sizes) == 1797 and sizes[2] == round(0.2 * 1797)
    # stratified: every class gets its 20% share (+-1) of the test set
    test_counts = torch.bincount(datamodule.test_set.labels, minlength=10)
    all_counts = torch.bincount(pool.labels, minlength=10)
    assert ((test_counts - 0.2 * all_counts).abs() <= 1).all()
    assert_batch(datamodule)
    assert_batch(datamodule, "test_dataloader")


def test_splits_are_disjoint_seeded_and_the_test_split_ignores_the_seed(tmp_path):
    first, again, other = make(tmp_path, seed=3), make(tmp_path, seed=3), make(tmp_path, seed=4)
    train, val, test = (set(s.indices.tolist()) for s in (first.train_set, first.val_set, first.test_set))
    assert not (train & val or train & test or val & test) and len(train | val | test) == 1797
    assert torch.equal(first.val_set.indices, again.val_set.indices)
    assert torch.equal(first.train_set.indices, again.train_set.indices)
    assert not torch.equal(first.val_set.indices, other.val_set.indices)
    assert torch.equal(first.test_set.indices, other.test_set.indices)


def test_split_indices_stratifies_and_holds_out_the_asked_fraction():
    labels = torch.arange(100) % 4
    kept, held_out = split_indices(labels, 0.2, seed=0)
    assert len(held_out) == 20 and sorted(torch.cat([kept, held_out]).tolist()) == list(range(100))
    assert torch.bincount(labels[held_out]).tolist() == [5, 5, 5, 5]
    kept_none, none = split_indices(labels, 0.0, seed=0)
    assert len(none) == 0 and sorted(kept_none.tolist()) == list(range(100))


def test_limit_train_keeps_the_first_images_of_the_seeded_split(tmp_path):
    full, limited = make(tmp_path), make(tmp_path, limit_train=50)
    assert torch.equal(limited.train_set.indices, full.train_set.indices[:50])
    assert torch.equal(limited.val_set.indices, full.val_set.indices)


def test_img_size_resizes_every_split(tmp_path):
    datamodule = make(tmp_path, img_size=16, batch_size=4)
    assert datamodule.img_size == 16 == dataset_info(datamodule.cfg).img_size
    x, _ = next(iter(datamodule.train_dataloader()))
    assert x.shape == (4, 1, 16, 16)


# --- shuffling, augmentation, mixing -------------------------------------------------------------------------------


def test_sampler_order_depends_only_on_seed_and_epoch():
    sampler = EpochShuffleSampler(50, seed=7)
    epoch0 = list(sampler)
    sampler.set_epoch(3)
    epoch3 = list(sampler)
    resumed = EpochShuffleSampler(50, seed=7)
    resumed.set_epoch(3)
    other_seed = EpochShuffleSampler(50, seed=8)
    other_seed.set_epoch(3)
    assert sorted(epoch3) == list(range(50)) and len(sampler) == 50
    assert list(resumed) == epoch3 and list(sampler) == epoch3
    assert epoch3 != epoch0 and list(other_seed) != epoch3


def test_train_loader_batches_follow_the_epoch(tmp_path):
    def first_labels(epoch: int) -> torch.Tensor:
        loader = make(tmp_path, batch_size=32).train_dataloader()
        loader.sampler.set_epoch(epoch)
        return next(iter(loader))[1]

    assert torch.equal(first_labels(2), first_labels(2))
    assert not torch.equal(first_labels(2), first_labels(1))


def test_mixup_mixes_images_and_one_hot_labels_with_the_same_weight(tmp_path):
    torch.manual_seed(0)
    plain = make(tmp_path, batch_size=16).train_dataloader()
    mixed = make(tmp_path, batch_size=16, augment=AugmentConfig(mixup_alpha=0.4)).train_dataloader()
    x0, y0 = next(iter(plain))
    x, y = next(iter(mixed))  # same (seed, epoch) -> same images; MixUp pairs each with its neighbour (roll by 1)
    assert y.dtype == torch.float32 and y.shape == (16, 10)
    one_hot = torch.nn.functional.one_hot(y0, 10).float()
    weight = y[0, y0[0]] if y0[0] != y0[-1] else 1 - y[0, y0[-1]]
    torch.testing.assert_close(y, weight * one_hot + (1 - weight) * one_hot.roll(1, 0))
    torch.testing.assert_close(x, weight * x0 + (1 - weight) * x0.roll(1, 0))
    _, y_val = next(iter(make(tmp_path, augment=AugmentConfig(mixup_alpha=0.4)).val_dataloader()))
    assert y_val.dtype == torch.int64  # evaluation is never mixed


@pytest.mark.parametrize(("mixup", "cutmix"), [(0.0, 1.0), (0.4, 1.0)])
def test_cutmix_and_the_random_choice_give_soft_labels_summing_to_one(tmp_path, mixup, cutmix):
    torch.manual_seed(0)
    datamodule = make(tmp_path, batch_size=16, augment=AugmentConfig(mixup_alpha=mixup, cutmix_alpha=cutmix))
    x, y = next(iter(datamodule.train_dataloader()))
    assert x.shape == (16, 1, 8, 8) and y.dtype == torch.float32 and y.shape == (16, 10)
    torch.testing.assert_close(y.sum(1), torch.ones(16))
    assert ((y > 0).sum(1) <= 2).all() and (y >= 0).all()


def test_per_image_augmentations_keep_shape_and_random_erasing_fills_with_the_mean(tmp_path):
    torch.manual_seed(0)
    augment = AugmentConfig(random_crop=True, crop_padding=2, hflip=True, autoaugment=True, random_erasing=1.0)
    datamodule = make(tmp_path, batch_size=16, img_size=12, augment=augment)
    x, y = next(iter(datamodule.train_dataloader()))
    assert x.shape == (16, 1, 12, 12) and y.shape == (16,)
    erased = (x == 0).flatten(1).any(1)  # an erased pixel is exactly 0 = the mean; an image pixel never is
    assert erased.all()


def test_denormalize_inverts_the_normalisation():
    mean, std = (0.2, 0.5, 0.7), (0.1, 0.2, 0.3)
    images = torch.rand(2, 3, 4, 4)
    normalised = (images - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    torch.testing.assert_close(denormalize(normalised, mean, std), images)
    assert denormalize(torch.full((3, 2, 2), 100.0), mean, std).max() == 1.0


# --- torchvision's file formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "folder", "gz"), [("mnist", "MNIST", False), ("fashion-mnist", "FashionMNIST", True)])
def test_mnist_like_idx_files(tmp_path, name, folder, gz):
    arrays = write_mnist(tmp_path, folder, n_train=40, n_test=10, gz=gz)
    datamodule = make(tmp_path, name=name, val_fraction=0.25)
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (10, 1, 28)
    assert datamodule.mean == dataset_info(datamodule.cfg).mean  # the published constant, not recomputed
    assert len(datamodule.class_names) == 10
    test_pool = datamodule.test_set.pool
    assert np.array_equal(test_pool.images[:, 0].numpy(), arrays["x_test"])
    assert np.array_equal(datamodule.test_set.labels.numpy(), arrays["y_test"])
    assert (len(datamodule.train_set), len(datamodule.val_set)) == (30, 10)
    assert_batch(datamodule)


def test_cifar10_pickled_batches(tmp_path):
    arrays = write_cifar10(tmp_path, per_batch=4)
    datamodule = make(tmp_path, name="cifar10", val_fraction=0.2)
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (10, 3, 32)
    assert datamodule.class_names[:2] == ["airplane", "automobile"]
    train_pool = datamodule.train_set.pool
    assert train_pool.images.shape == (20, 3, 32, 32)
    assert np.array_equal(train_pool.images.permute(0, 2, 3, 1).numpy(), arrays["x_train"])  # CHW rows -> HWC -> CHW
    assert np.array_equal(train_pool.labels.numpy(), arrays["y_train"])
    assert len(datamodule.test_set) == 4
    assert_batch(datamodule, "test_dataloader")


def test_svhn_mat_files_map_label_10_to_digit_0(tmp_path):
    arrays = write_svhn(tmp_path, n_train=12, n_test=5)
    datamodule = make(tmp_path, name="svhn")
    assert np.array_equal(datamodule.test_set.labels.numpy(), arrays["y_test"])
    assert np.array_equal(datamodule.test_set.pool.images.permute(0, 2, 3, 1).numpy(), arrays["x_test"])
    assert_batch(datamodule, "test_dataloader")


# --- folder formats ------------------------------------------------------------------------------------------------


def test_imagefolder_with_train_and_test_folders(tmp_path):
    write_imagefolder(tmp_path / "pets", {"train": 5, "test": 2})
    datamodule = make(tmp_path, name="imagefolder", path="pets", val_fraction=0.2)  # relative to root
    assert datamodule.class_names == ["cat", "dog"]
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (2, 3, 10)  # shorter side
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (8, 2, 4)
    image, label = datamodule.test_set[3]
    assert image.shape == (3, 10, 10) and label == 1 and (image == 20 * 1 + 1).all()  # dog/1.png, centre-cropped
    # mean/std are computed from the training images: fill values 20 * label + i over the 8 training images
    labels, indices = _train_label_and_index(datamodule)
    train_values = torch.tensor([20.0 * label + i for label, i in zip(labels, indices, strict=True)]) / 255
    torch.testing.assert_close(torch.tensor(datamodule.mean), train_values.mean().repeat(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        torch.tensor(datamodule.std), train_values.std(correction=0).repeat(3), atol=1e-6, rtol=0
    )
    assert_batch(datamodule)


def _train_label_and_index(datamodule: VisionDataModule) -> tuple[list[int], list[int]]:
    paths = [datamodule.train_set.pool.paths[i] for i in datamodule.train_set.indices]
    return datamodule.train_set.labels.tolist(), [int(path.stem) for path in paths]


def test_imagefolder_flat_gray_folder_gets_a_seeded_test_split(tmp_path):
    write_imagefolder(tmp_path / "flat", {"": 10}, gray=True, classes=("a", "b", "c"))
    datamodule = make(tmp_path, name="imagefolder", path=str(tmp_path / "flat"), img_size=6)
    assert datamodule.in_chans == 1 and datamodule.num_classes == 3 and datamodule.class_names == ["a", "b", "c"]
    assert len(datamodule.test_set) == 6 and torch.bincount(datamodule.test_set.labels).tolist() == [2, 2, 2]
    assert not set(datamodule.test_set.indices.tolist()) & set(datamodule.train_set.indices.tolist())
    assert_batch(datamodule)


def test_imagefolder_scales_16_bit_images_and_refuses_float_ones_by_mode(tmp_path):
    levels = {"dark": 257, "mid": 128 * 257, "white": 65535}  # 1, 128 and 255 in 8 bits
    for name, level in levels.items():
        for i in range(4):
            write_png(tmp_path / "deep" / name / f"{i}.png", np.full((6, 6), level, dtype=np.uint16))  # mode I;16
    datamodule = make(tmp_path, name="imagefolder", path=str(tmp_path / "deep"), img_size=6)
    assert datamodule.in_chans == 1 and datamodule.class_names == ["dark", "mid", "white"]
    pool = datamodule.train_set.pool
    pixels = {(int(pool.labels[i]), int(pool[i][0].min()), int(pool[i][0].max())) for i in range(len(pool))}
    assert pixels == {(0, 1, 1), (1, 128, 128), (2, 255, 255)}
    Image.fromarray(np.full((6, 6), 0.5, dtype=np.float32)).save(tmp_path / "deep" / "mid" / "float.tiff")
    with pytest.raises(DataError, match=r"float.tiff \(DataError: 32-bit float image \(PIL mode F\)"):
        make(tmp_path, name="imagefolder", path=str(tmp_path / "deep"), img_size=6, strict_images=True)


def test_celeba_attribute_as_class_with_the_official_partition(tmp_path):
    partitions = [0] * 8 + [1] * 3 + [2] * 4
    attributes = write_celeba(tmp_path, partitions)
    datamodule = make(tmp_path, name="celeba", img_size=8)
    assert datamodule.class_names == ["not Male", "Male"] and datamodule.num_classes == 2
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (8, 3, 4)
    male = CELEBA_ATTRIBUTES.index("Male")
    assert datamodule.test_set.labels.tolist() == attributes[11:, male].tolist()
    assert datamodule.val_set.pool.paths[0].name == "000009.jpg"
    assert_batch(datamodule, "test_dataloader")
    by_name = make(tmp_path, name="celeba", img_size=8, target="Smiling")
    by_index = make(tmp_path, name="celeba", img_size=8, target=0)
    assert by_name.train_set.labels.tolist() == by_index.train_set.labels.tolist() == attributes[:8, 0].tolist()


def test_celeba_native_size_is_the_centre_cropped_aligned_width(tmp_path):
    write_celeba(tmp_path, [0, 0, 2])
    datamodule = make(tmp_path, name="celeba")
    assert datamodule.img_size == 178 and datamodule.test_set[0][0].shape == (3, 178, 178)


def test_tiny_imagenet_layout(tmp_path):
    write_tiny_imagenet(tmp_path / "tiny-imagenet-200", ["n01", "n02", "n03"], per_class=4, val_labels=[2, 0, 1, 2])
    datamodule = make(tmp_path, name="tiny-imagenet", val_fraction=0.25)
    assert datamodule.num_classes == 200  # the real set's; this tiny copy uses 3 of them
    assert datamodule.class_names == ["thing n01", "thing n02", "thing n03"]
    assert (len(datamodule.train_set), len(datamodule.val_set)) == (9, 3)
    assert datamodule.test_set.labels.tolist() == [2, 0, 1, 2]
    assert datamodule.test_set[0][0].shape == (3, 64, 64)  # the 8x8 files are served at the native 64x64
    # computed from the training images: uniform random pixels average about 0.5 (no published constant exists)
    assert dataset_info(datamodule.cfg).mean is None and all(abs(m - 0.5) < 0.1 for m in datamodule.mean)
    assert_batch(datamodule, "test_dataloader")


# --- npz -----------------------------------------------------------------------------------------------------------


def write_multilabel_npz(path, **extra):
    arrays = {
        "x_train": random_images(20, 6, 6, 3, seed=0),
        "y_train": np.random.default_rng(0).integers(0, 2, size=(20, 3)),
        "x_test": random_images(5, 6, 6, 3, seed=1),
        "y_test": np.random.default_rng(1).integers(0, 2, size=(5, 3)),
        "attr_names": np.array(["Smiling", "Male", "Young"]),
        **extra,
    }
    np.savez(path, **arrays)
    return arrays


@pytest.mark.parametrize("target", ["Male", 1])
def test_npz_multilabel_column_by_name_or_index(tmp_path, target):
    arrays = write_multilabel_npz(tmp_path / "faces.npz")
    datamodule = make(tmp_path, name="npz", path="faces.npz", target=target, val_fraction=0.2)
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (2, 3, 6)
    assert datamodule.class_names == ["not Male", "Male"]
    assert datamodule.test_set.labels.tolist() == arrays["y_test"][:, 1].tolist()
    assert np.array_equal(datamodule.test_set.pool.images.permute(0, 2, 3, 1).numpy(), arrays["x_test"])
    expected_mean = torch.from_numpy(arrays["x_train"]).float().div(255)[datamodule.train_set.indices].mean((0, 1, 2))
    torch.testing.assert_close(torch.tensor(datamodule.mean, dtype=torch.float32), expected_mean)
    assert_batch(datamodule)


def test_npz_single_label_gray(tmp_path):
    np.savez(
        tmp_path / "gray.npz",
        x_train=random_images(12, 5, 5, None, seed=0),
        y_train=np.arange(12) % 3,
        x_test=random_images(3, 5, 5, None, seed=1),
        y_test=np.arange(3),
    )
    datamodule = make(tmp_path, name="npz", path=str(tmp_path / "gray.npz"), img_size=10)
    assert (datamodule.num_classes, datamodule.in_chans, datamodule.img_size) == (3, 1, 10)
    assert datamodule.class_names == ["0", "1", "2"]
    assert_batch(datamodule, "test_dataloader")


# --- errors that name the problem and the fix ----------------------------------------------------------------------


def test_unknown_dataset_lists_the_known_ones_and_suggests_a_close_match():
    with pytest.raises(DataError, match=r"unknown dataset 'cifar-10'.*Did you mean 'cifar10'.*digits, mnist"):
        build_datamodule(DataConfig(name="cifar-10"))
    assert "celeba" in DATASETS and "npz" in DATASETS


def test_info_of_named_datasets_needs_no_files(tmp_path):
    info = dataset_info(DataConfig(name="cifar100", root=str(tmp_path / "absent"), img_size=24))
    assert (info.num_classes, info.in_chans, info.img_size) == (100, 3, 24)


@pytest.mark.parametrize(
    ("name", "looked_in"),
    [("mnist", "MNIST/raw"), ("cifar10", "cifar-10-batches-py"), ("celeba", "celeba"), ("svhn", "train_32x32.mat")],
)
def test_missing_files_name_the_path_and_the_fix(tmp_path, name, looked_in):
    with pytest.raises(DatasetNotFoundError, match=rf"{name}: files not found: .*{looked_in}.*data\.download=true"):
        make(tmp_path, name=name)


def test_missing_imagefolder_and_npz_say_where_they_looked(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"nothing at .*nowhere.*data\.path="):
        make(tmp_path, name="imagefolder", path="nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"class folder.*Expected <folder>/train/<class>"):
        make(tmp_path, name="imagefolder", path="empty")
    with pytest.raises(DataError, match=r"npz: no file given.*data\.path="):
        make(tmp_path, name="npz")


def test_npz_column_errors_list_the_available_names(tmp_path):
    write_multilabel_npz(tmp_path / "faces.npz")
    with pytest.raises(DataError, match=r"unknown column data\.target='Mal'.*Did you mean 'Male'.*Smiling, Male"):
        make(tmp_path, name="npz", path="faces.npz", target="Mal")
    with pytest.raises(DataError, match=r"multi-label with 3 columns.*data\.target=.*Smiling, Male, Young"):
        make(tmp_path, name="npz", path="faces.npz")
    with pytest.raises(DataError, match=r"out of range"):
        make(tmp_path, name="npz", path="faces.npz", target=3)


def test_npz_missing_keys_are_named(tmp_path):
    np.savez(tmp_path / "partial.npz", x_train=random_images(4, 5, 5, None, seed=0), y_train=np.arange(4))
    with pytest.raises(DataError, match=r"lacks x_test, y_test \(has: x_train, y_train\)"):
        make(tmp_path, name="npz", path="partial.npz")


def test_celeba_unknown_attribute_lists_the_attributes(tmp_path):
    write_celeba(tmp_path, [0, 0, 2])
    with pytest.raises(DataError, match=r"unknown column data\.target='Smile'.*Smiling, Male, Young"):
        make(tmp_path, name="celeba", target="Smile")


def test_bad_numbers_in_the_config_are_named(tmp_path):
    with pytest.raises(DataError, match=r"data\.val_fraction must be in \[0, 1\), got 1\.5"):
        make(tmp_path, val_fraction=1.5)
    with pytest.raises(DataError, match=r"data\.img_size must be a positive integer"):
        make(tmp_path, img_size=0)

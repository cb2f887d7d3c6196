"""Writers of tiny datasets in their real on-disk formats, for the data tests (no network, no shared files)."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

CELEBA_ATTRIBUTES = ["Smiling", "Male", "Young"]


def random_images(count: int, height: int, width: int, channels: int | None, seed: int) -> np.ndarray:
    """uint8 images ``[count, H, W]`` (channels None) or ``[count, H, W, channels]``."""
    shape = (count, height, width) if channels is None else (count, height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def write_idx(path: Path, array: np.ndarray, *, gz: bool) -> None:
    """An IDX file (LeCun's MNIST format): magic ``0x0000 08 <ndim>`` (unsigned bytes), big-endian int32 dims."""
    payload = struct.pack(f">I{array.ndim}I", 0x0800 + array.ndim, *array.shape) + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(f"{path}.gz", "wb") as file:
            file.write(payload)
    else:
        path.write_bytes(payload)


def write_mnist(root: Path, folder: str, *, n_train: int, n_test: int, gz: bool = False) -> dict[str, np.ndarray]:
    """``root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (as torchvision's MNIST expects)."""
    arrays = {
        "x_train": random_images(n_train, 28, 28, None, seed=1),
        "y_train": np.arange(n_train) % 10,
        "x_test": random_images(n_test, 28, 28, None, seed=2),
        "y_test": (np.arange(n_test) + 3) % 10,
    }
    raw = root / folder / "raw"
    write_idx(raw / "train-images-idx3-ubyte", arrays["x_train"], gz=gz)
    write_idx(raw / "train-labels-idx1-ubyte", arrays["y_train"], gz=gz)
    write_idx(raw / "t10k-images-idx3-ubyte", arrays["x_test"], gz=gz)
    write_idx(raw / "t10k-labels-idx1-ubyte", arrays["y_test"], gz=gz)
    return arrays


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as file:
        pickle.dump(obj, file)


def write_cifar10(root: Path, *, per_batch: int) -> dict[str, np.ndarray]:
    """``root/cifar-10-batches-py/``: ``data_batch_1..5`` and ``test_batch`` (``data: uint8 [n, 3072]`` in CHW
    order, ``labels``) and ``batches.meta`` (``label_names``)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    x_train, y_train = [], []
    for batch in range(1, 6):
        images = random_images(per_batch, 32, 32, 3, seed=batch)
        labels = [(batch + i) % 10 for i in range(per_batch)]
        chw = images.transpose(0, 3, 1, 2).reshape(per_batch, -1)
        _pickle(folder / f"data_batch_{batch}", {"data": chw, "labels": labels})
        x_train.append(images)
        y_train += labels
    x_test = random_images(per_batch, 32, 32, 3, seed=9)
    y_test = [i % 10 for i in range(per_batch)]
    _pickle(folder / "test_batch", {"data": x_test.transpose(0, 3, 1, 2).reshape(per_batch, -1), "labels": y_test})
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _pickle(folder / "batches.meta", {"label_names": names})
    return {"x_train": np.concatenate(x_train), "y_train": np.array(y_train), "x_test": x_test, "y_test": y_test}


def write_svhn(root: Path, *, n_train: int, n_test: int) -> dict[str, np.ndarray]:
    """``root/{train,test}_32x32.mat`` with ``X: [32, 32, 3, N]`` and ``y: [N, 1]`` in 1..10 (10 is the digit 0).
    Returns the images NHWC and the digits 0..9 the loader should give."""
    arrays = {}
    for split, count, seed in (("train", n_train, 1), ("test", n_test, 2)):
        images = random_images(count, 32, 32, 3, seed=seed)
        digits = np.arange(count) % 10
        stored = np.where(digits == 0, 10, digits)
        scipy.io.savemat(root / f"{split}_32x32.mat", {"X": images.transpose(1, 2, 3, 0), "y": stored[:, None]})
        arrays[f"x_{split}"], arrays[f"y_{split}"] = images, digits
    return arrays


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def write_imagefolder(
    folder: Path, splits: dict[str, int], *, classes: tuple[str, ...] = ("cat", "dog"), size=(10, 12), gray=False
) -> None:
    """``folder/<split>/<class>/<i>.png`` for each ``split: images per class`` (split ``""``: class folders directly
    under ``folder``). Image ``i`` of class ``c`` is filled with ``20 * c + i`` so tests can recognise it."""
    height, width = size
    for split, per_class in splits.items():
        for label, name in enumerate(classes):
            for i in range(per_class):
                shape = (height, width) if gray else (height, width, 3)
                write_png(folder / split / name / f"{i}.png", np.full(shape, 20 * label + i, dtype=np.uint8))


def write_celeba(root: Path, partitions: list[int], *, size=(14, 12)) -> np.ndarray:
    """``root/celeba/``: ``img_align_celeba/000001.jpg...``, ``list_attr_celeba.txt`` (count, header, +-1 rows) and
    ``list_eval_partition.txt``. Returns the 0/1 attribute matrix ``[N, len(CELEBA_ATTRIBUTES)]``."""
    folder = root / "celeba"
    attributes = np.random.default_rng(0).integers(0, 2, size=(len(partitions), len(CELEBA_ATTRIBUTES)))
    names = [f"{i + 1:06d}.jpg" for i in range(len(partitions))]
    for i, name in enumerate(names):
        write_png(folder / "img_align_celeba" / name, random_images(1, *size, 3, seed=i)[0])
    rows = [f"{name} " + " ".join(f"{2 * a - 1:2d}" for a in row) for name, row in zip(names, attributes, strict=True)]
    (folder / "list_attr_celeba.txt").write_text("\n".join([str(len(names)), " ".join(CELEBA_ATTRIBUTES), *rows]))
    partition_rows = [f"{name} {split}" for name, split in zip(names, partitions, strict=True)]
    (folder / "list_eval_partition.txt").write_text("\n".join(partition_rows) + "\n")
    return attributes


def write_tiny_imagenet(folder: Path, wnids: list[str], *, per_class: int, val_labels: list[int]) -> None:
    """``folder/``: ``wnids.txt``, ``words.txt``, ``train/<wnid>/images/<wnid>_<i>.JPEG``, ``val/images/val_<i>.JPEG``
    and ``val/val_annotations.txt`` (tab-separated file, wnid, box)."""
    (folder / "wnids.txt").parent.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (folder / "words.txt").write_text("\n".join(f"{wnid}\tthing {wnid}, other name" for wnid in wnids) + "\n")
    for label, wnid in enumerate(wnids):
        for i in range(per_class):
            image = Image.fromarray(random_images(1, 8, 8, 3, seed=10 * label + i)[0])
            path = folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, format="JPEG")
    rows = []
    for i, label in enumerate(val_labels):
        path = folder / "val" / "images" / f"val_{i}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(random_images(1, 8, 8, 3, seed=100 + i)[0]).save(path, format="JPEG")
        rows.append(f"val_{i}.JPEG\t{wnids[label]}\t0\t0\t7\t7")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(rows) + "\n")

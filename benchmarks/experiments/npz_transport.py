"""Carry the images a protocol reads from an image npz to a machine that cannot read the original, losslessly.

A lent GPU machine takes at most 64 MiB of files, less than the 114 MB CIFAR-10 npz. A protocol such as
``compare/cifar10_p4`` reads 23,000 of its 40,000 images (its validation split, the first ``data.limit_train`` of
the rest, the whole test set). ``pack`` keeps those, bit for bit, as lossless WebP mosaics (about half the bytes),
beside every label and the SHA-256 of every kept image; ``unpack`` rebuilds an npz of the original's shapes in which
the images no run reads are zeros, and refuses to write it unless every kept image hashes as in the original. The
splits are computed from the labels alone (``vitlab.data.datamodule.split_indices``), so a run on the rebuilt file
reads the same images, in the same order, as a run on the original.

    python -m benchmarks.experiments.npz_transport pack cifar10.npz DIR --config compare/cifar10_p4 [--all-train]
    python -m benchmarks.experiments.npz_transport unpack DIR cifar10.npz
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

GRID = 100  # images per mosaic row and column


def used_train_indices(npz: Path, config: str, seeds: list[int]) -> np.ndarray:
    """The training-pool indices a run of ``config`` on ``npz`` reads (validation split and kept training images),
    for every data seed in ``seeds``, sorted."""
    from vitlab.config import build_config
    from vitlab.data.datamodule import build_datamodule

    used: set[int] = set()
    for seed in seeds:
        cfg = build_config(config, [f"data.path={npz}", f"data.seed={seed}"])
        dm = build_datamodule(cfg.data)
        dm.setup()
        used.update(int(i) for i in dm.train_set.indices)
        used.update(int(i) for i in dm.val_set.indices)
    return np.array(sorted(used), dtype=np.int64)


def _digest(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def _encode(block: np.ndarray) -> bytes:
    """Up to GRID x GRID images [n, h, w, c] as one lossless WebP mosaic."""
    from PIL import Image

    n, h, w, c = block.shape
    full = np.zeros((GRID * GRID, h, w, c), np.uint8)
    full[:n] = block
    mosaic = full.reshape(GRID, GRID, h, w, c).transpose(0, 2, 1, 3, 4).reshape(GRID * h, GRID * w, c)
    buffer = io.BytesIO()
    Image.fromarray(mosaic.squeeze(-1) if c == 1 else mosaic).save(buffer, "WEBP", lossless=True, quality=100, method=6)
    return buffer.getvalue()


def _decode(data: bytes, n: int, h: int, w: int, c: int) -> np.ndarray:
    from PIL import Image

    mosaic = np.asarray(Image.open(io.BytesIO(data)).convert("L" if c == 1 else "RGB")).reshape(GRID * h, GRID * w, c)
    return mosaic.reshape(GRID, h, GRID, w, c).transpose(0, 2, 1, 3, 4).reshape(GRID * GRID, h, w, c)[:n]


def _write_images(images: np.ndarray, folder: Path, stem: str, workers: int) -> list[str]:
    blocks = [images[i : i + GRID * GRID] for i in range(0, len(images), GRID * GRID)]
    with ProcessPoolExecutor(workers) as pool:
        encoded = list(pool.map(_encode, blocks))
    names = []
    for k, data in enumerate(encoded):
        names.append(f"{stem}_{k:03d}.webp")
        (folder / names[-1]).write_bytes(data)
    return names


def pack(npz: Path, out: Path, config: str, seeds: list[int], all_train: bool, workers: int) -> dict:
    with np.load(npz) as f:
        arrays = {k: f[k] for k in f.files}
    if arrays["x_train"].ndim != 4:
        raise SystemExit(f"error: {npz}: x_train must be NHWC uint8; got shape {arrays['x_train'].shape}")
    used = np.arange(len(arrays["x_train"])) if all_train else used_train_indices(npz, config, seeds)
    out.mkdir(parents=True, exist_ok=False)
    kept = arrays["x_train"][used]
    manifest = {
        "source": npz.name,
        "config": None if all_train else config,
        "data_seeds": None if all_train else seeds,
        "shapes": {k: list(v.shape) for k, v in arrays.items()},
        "dtypes": {k: str(v.dtype) for k, v in arrays.items()},
        "train_used": len(used),
        "sha256": {"x_train_used": _digest(kept), "x_test": _digest(arrays["x_test"])},
        "train_files": _write_images(kept, out, "train", workers),
        "test_files": _write_images(arrays["x_test"], out, "test", workers),
    }
    np.savez_compressed(
        out / "labels.npz",
        train_used=used,
        **{k: v for k, v in arrays.items() if not k.startswith("x_")},
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(folder: Path, out: Path) -> dict:
    if out.exists():
        raise SystemExit(f"error: {out} exists; pass another path (a file is never overwritten)")
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "labels.npz") as f:
        others = {k: f[k] for k in f.files}
    used = others.pop("train_used")
    shapes = manifest["shapes"]

    def read(files: list[str], count: int, shape: list[int]) -> np.ndarray:
        h, w, c = shape[1:]
        parts, left = [], count
        for name in files:
            parts.append(_decode((folder / name).read_bytes(), min(left, GRID * GRID), h, w, c))
            left -= len(parts[-1])
        return np.concatenate(parts)

    kept = read(manifest["train_files"], len(used), shapes["x_train"])
    x_test = read(manifest["test_files"], shapes["x_test"][0], shapes["x_test"])
    for name, images in (("x_train_used", kept), ("x_test", x_test)):
        if _digest(images) != manifest["sha256"][name]:
            raise SystemExit(f"error: {folder}: {name} does not hash as the original's; the copy is damaged")
    x_train = np.zeros(shapes["x_train"], np.uint8)
    x_train[used] = kept
    partial = out.with_name(out.name + ".partial.npz")
    np.savez(partial, x_train=x_train, x_test=x_test, **others)
    partial.replace(out)
    return {"out": str(out), "train_used": len(used), "verified": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("npz", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--config", default="compare/cifar10_p4")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--all-train", action="store_true", help="keep every training image (no config)")
    p.add_argument("--workers", type=int, default=2)
    u = sub.add_parser("unpack")
    u.add_argument("folder", type=Path)
    u.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "pack":
        manifest = pack(args.npz, args.out, args.config, args.seeds, args.all_train, args.workers)
        size = sum(f.stat().st_size for f in args.out.iterdir())
        print(f"packed {manifest['train_used']} training and {manifest['shapes']['x_test'][0]} test images: {size:,} B")
    else:
        print(json.dumps(unpack(args.folder, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

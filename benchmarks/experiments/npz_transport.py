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

Where even the kept images are too many for one transfer (the GPU protocol reads all 40,000: about 60 MB), ``pack
--parts N`` writes ``DIR/part1`` ... ``DIR/partN``, each carried on its own (the training and test images dealt
out in turn), and ``unpack PART1 ... PARTN OUT`` joins them, refusing a missing, repeated or foreign part.
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


def pack(npz: Path, out: Path, config: str, seeds: list[int], all_train: bool, workers: int, parts: int = 1) -> dict:
    with np.load(npz) as f:
        arrays = {k: f[k] for k in f.files}
    if arrays["x_train"].ndim != 4:
        raise SystemExit(f"error: {npz}: x_train must be NHWC uint8; got shape {arrays['x_train'].shape}")
    used = np.arange(len(arrays["x_train"])) if all_train else used_train_indices(npz, config, seeds)
    test = np.arange(len(arrays["x_test"]))
    out.mkdir(parents=True, exist_ok=False)
    common = {
        "source": npz.name,
        "source_sha256": {"x_train_used": _digest(arrays["x_train"][used]), "x_test": _digest(arrays["x_test"])},
        "config": None if all_train else config,
        "data_seeds": None if all_train else seeds,
        "shapes": {k: list(v.shape) for k, v in arrays.items()},
        "dtypes": {k: str(v.dtype) for k, v in arrays.items()},
        "train_used_total": len(used),
        "parts": parts,
    }
    for part in range(1, parts + 1):
        folder = out if parts == 1 else out / f"part{part}"
        folder.mkdir(exist_ok=True)
        mine, my_test = used[part - 1 :: parts], test[part - 1 :: parts]
        kept, x_test = arrays["x_train"][mine], arrays["x_test"][my_test]
        manifest = common | {
            "part": part,
            "train_used": len(mine),
            "test_held": len(my_test),
            "sha256": {"x_train_used": _digest(kept), "x_test": _digest(x_test)},
            "train_files": _write_images(kept, folder, "train", workers),
            "test_files": _write_images(x_test, folder, "test", workers),
        }
        np.savez_compressed(
            folder / "labels.npz",
            train_used=mine,
            test_held=my_test,
            **{k: v for k, v in arrays.items() if not k.startswith("x_")},
        )
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return common


def _read_part(folder: Path) -> tuple[dict, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """One packed folder: its manifest, its label arrays, and its training and test images, checked by SHA-256."""
    manifest = json.loads((folder / "manifest.json").read_text())
    with np.load(folder / "labels.npz") as f:
        others = {k: f[k] for k in f.files}
    shapes = manifest["shapes"]

    def read(files: list[str], count: int, shape: list[int]) -> np.ndarray:
        h, w, c = shape[1:]
        chunks, left = [], count
        for name in files:
            chunks.append(_decode((folder / name).read_bytes(), min(left, GRID * GRID), h, w, c))
            left -= len(chunks[-1])
        return np.concatenate(chunks) if chunks else np.zeros((0, h, w, c), np.uint8)

    held = others.get("test_held", np.arange(shapes["x_test"][0]))
    kept = read(manifest["train_files"], len(others["train_used"]), shapes["x_train"])
    x_test = read(manifest["test_files"], len(held), shapes["x_test"])
    for name, images in (("x_train_used", kept), ("x_test", x_test)):
        if _digest(images) != manifest["sha256"][name]:
            raise SystemExit(f"error: {folder}: {name} does not hash as the original's; the copy is damaged")
    return manifest, others, kept, x_test


def unpack(folders: Path | list[Path], out: Path) -> dict:
    """Join the packed folder(s) into an npz at ``out`` (the original's shapes; unread training images zero)."""
    folders = [folders] if isinstance(folders, Path) else list(folders)
    if out.exists():
        raise SystemExit(f"error: {out} exists; pass another path (a file is never overwritten)")
    read = [_read_part(folder) for folder in folders]
    first = read[0][0]
    expected = first.get("parts", 1)
    numbers = sorted(m.get("part", 1) for m, *_ in read)
    if numbers != list(range(1, expected + 1)) or any(
        m.get("source_sha256", m["sha256"]) != first.get("source_sha256", first["sha256"]) for m, *_ in read
    ):
        raise SystemExit(f"error: parts {numbers} of one packing were given; pass each of its {expected} parts once")
    shapes = first["shapes"]
    x_train = np.zeros(shapes["x_train"], np.uint8)
    x_test = np.zeros(shapes["x_test"], np.uint8)
    used = []
    for _, others, kept, test_part in read:
        x_train[others["train_used"]] = kept
        x_test[others.get("test_held", np.arange(len(x_test)))] = test_part
        used.append(others["train_used"])
    used_all = np.sort(np.concatenate(used))
    if expected > 1 and (
        _digest(x_train[used_all]) != first["source_sha256"]["x_train_used"]
        or _digest(x_test) != first["source_sha256"]["x_test"]
    ):
        raise SystemExit("error: the joined parts do not hash as the original's; a part is damaged or foreign")
    labels = {k: v for k, v in read[0][1].items() if k not in ("train_used", "test_held")}
    partial = out.with_name(out.name + ".partial.npz")
    np.savez(partial, x_train=x_train, x_test=x_test, **labels)
    partial.replace(out)
    return {"out": str(out), "parts": expected, "train_used": len(used_all), "verified": True}


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
    p.add_argument("--parts", type=int, default=1, help="folders part1..partN, each carried on its own")
    u = sub.add_parser("unpack")
    u.add_argument("folders", type=Path, nargs="+", help="the packed folder, or every part of one packing")
    u.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "pack":
        manifest = pack(args.npz, args.out, args.config, args.seeds, args.all_train, args.workers, args.parts)
        size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
        print(
            f"packed {manifest['train_used_total']} training and {manifest['shapes']['x_test'][0]} test images in "
            f"{args.parts} part(s): {size:,} B"
        )
    else:
        print(json.dumps(unpack(args.folders, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

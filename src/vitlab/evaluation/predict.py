"""Top-k predictions of a trained classifier on image files, with the evaluation preprocessing of its run.

The preprocessing is the one the run's validation and test sets went through (``vitlab.data``): the image read as
``uint8`` with the run's channel count (grayscale or RGB), the shorter side resized to the run's image size and
centre-cropped (:func:`vitlab.data.transforms.resize_to_square`), then normalised with the run's mean and std.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.data.sources import class_names_problem, read_image_file
from vitlab.data.transforms import normalize, resize_to_square
from vitlab.errors import CheckpointError, ConfigError
from vitlab.export_formats import ClassifierGraph
from vitlab.rundir import EXPORT_CONFIG_FILE, locate_model, read_json, write_output

#: file suffixes taken from a folder (a file named on the command line is tried whatever its suffix)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


@dataclass
class Prediction:
    """The ``k`` most probable classes of one image: ``classes[i]`` (its index ``indices[i]``), probability
    ``probs[i]``, most probable first."""

    path: str
    indices: list[int]
    classes: list[str]
    probs: list[float]


def load_predictor(target: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The model (eval mode) and the data description (``img_size, in_chans, mean, std, class_names``) of a run
    directory, an export folder or a ``.ckpt`` file."""
    from vitlab.export import load_model, model_from_loaded_checkpoint, read_checkpoint

    source = locate_model(target).source
    if source.is_dir():
        meta = read_json(source / EXPORT_CONFIG_FILE)
        info = meta.get("data")
        if not info:
            raise CheckpointError(
                f"{source / EXPORT_CONFIG_FILE} has no data description; export it with `vitlab export`"
            )
        model = load_model(source)
        source = source / EXPORT_CONFIG_FILE
    else:
        model, hparams = model_from_loaded_checkpoint(read_checkpoint(source))  # the file is read once
        model, info = model.eval(), hparams["data_info"]
    classes = getattr(model, "num_classes", info.get("num_classes"))
    problem = class_names_problem(info["class_names"], classes) if info.get("class_names") else None
    if problem:
        raise CheckpointError(f"the class_names of {source} {problem}; export the model again")
    return model, info


def image_files(inputs: Iterable[str | Path]) -> Iterator[Path]:
    """Files named, and the image files (``IMAGE_SUFFIXES``) under folders named, in sorted order."""
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.exists():
            yield path
        else:
            raise ConfigError(f"{path} does not exist; pass image files or folders of images")


def read_image(path: Path, info: dict[str, Any]) -> torch.Tensor:
    """``uint8 [C, S, S]``: the file in the run's channel count, as a viewer shows it (EXIF orientation applied),
    resized and centre-cropped to its image size. Raises PIL's error (or a ``DataError``) for a file that is not a
    readable image."""
    pixels = read_image_file(path, "L" if info["in_chans"] == 1 else "RGB")
    return resize_to_square(pixels, int(info["img_size"]))


def readable_images(files: Iterable[Path], info: dict[str, Any], on_error: Any) -> Iterator[tuple[Path, torch.Tensor]]:
    """``(path, pixels)`` of each file :func:`read_image` reads; an unreadable one goes to ``on_error(path, e)``."""
    for path in files:
        try:
            pixels = read_image(Path(path), info)
        except Exception as e:  # PIL's many types: UnidentifiedImageError, SyntaxError, EOFError, a decompression bomb
            if on_error is not None:
                on_error(path, e)
            continue
        yield path, pixels


def normalise(images: torch.Tensor, info: dict[str, Any]) -> torch.Tensor:
    """``uint8 [B, C, H, W]`` -> the run's normalised float input, as ``NormalizeCollate`` makes it (the one
    normalisation, :func:`vitlab.data.transforms.normalize`, with the run's mean and std)."""
    return normalize(images.float().div_(255), info["mean"], info["std"])


@torch.no_grad()
def predict(
    model: nn.Module,
    info: dict[str, Any],
    files: Iterable[Path],
    *,
    topk: int = 5,
    batch_size: int = 64,
    on_error: Any = None,
) -> Iterator[Prediction]:
    """Top-``topk`` predictions for each readable file, in batches of ``batch_size``. A file that cannot be read
    as an image is passed to ``on_error(path, exception)`` and skipped."""
    graph = ClassifierGraph(model).eval()
    device = next(model.parameters()).device
    names = list(info.get("class_names") or [])
    paths: list[Path] = []
    images: list[torch.Tensor] = []

    def flush() -> Iterator[Prediction]:
        x = normalise(torch.stack(images), info).to(device)
        probs = graph(x).float().softmax(-1).cpu()
        k = min(topk, probs.shape[1])
        values, indices = probs.topk(k, dim=-1)
        for path, p, i in zip(paths, values.tolist(), indices.tolist(), strict=True):
            classes = [names[j] if j < len(names) else str(j) for j in i]
            yield Prediction(str(path), i, classes, p)
        paths.clear()
        images.clear()

    for path, pixels in readable_images(files, info, on_error):
        paths.append(path)
        images.append(pixels)
        if len(images) == batch_size:
            yield from flush()
    if images:
        yield from flush()


def rows(predictions: Iterable[Prediction]) -> Iterator[dict[str, Any]]:
    """Flat records: ``path, top1, prob1, top2, prob2, ...`` (probabilities rounded to 6 digits)."""
    for p in predictions:
        row: dict[str, Any] = {"path": p.path}
        for rank, (name, prob) in enumerate(zip(p.classes, p.probs, strict=True), start=1):
            row[f"top{rank}"] = name
            row[f"prob{rank}"] = round(prob, 6)
        yield row


def write_rows(records: list[dict[str, Any]], path: Path, *, force: bool = False) -> None:
    """CSV (``.csv``) or JSON lines (any other suffix, e.g. ``.jsonl``) of the records, written whole or not at all
    (:func:`vitlab.rundir.write_output`: an existing file is refused unless ``force``)."""
    if path.suffix.lower() == ".csv":
        buffer = io.StringIO()
        fields = list(dict.fromkeys(k for r in records for k in r))
        writer = csv.DictWriter(buffer, fieldnames=fields or ["path"])
        writer.writeheader()
        writer.writerows(records)
        text = buffer.getvalue()
    else:
        text = "".join(json.dumps(r) + "\n" for r in records)
    write_output(path, text, force=force)

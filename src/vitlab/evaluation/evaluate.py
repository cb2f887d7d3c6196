"""The evaluation suite of a trained classifier: ``evaluate_run(run_dir)``.

CET-ViT v4 model card: "Results", "Calibration", "OOD robustness", "Reversibility vs accuracy". On the test set of the
run's data: top-1 / top-5 accuracy, NLL and ECE (15 equal-width bins); a temperature fitted on one half of the
validation set and evaluated on the other half, then applied to the test set, with a reliability diagram before and
after; test-time augmentation over fixed views; accuracy under the CIFAR-C corruptions at every severity; per-class
accuracy; and, for models that expose their token-to-slot assignment ``S`` (``SlotAssigner``), the metrics of ``S``
that their family declares (``Family.evaluation``: per image, then its report over the classes).

Every image passes through [0, 1] pixel space (``denormalize`` with the data's statistics) so that views and
corruptions act on real pixels, then is normalised with the statistics the model was trained with.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from vitlab.config import check_seed
from vitlab.data import VisionDataModule, denormalize
from vitlab.data import normalize as normalize_pixels
from vitlab.errors import ConfigError
from vitlab.evaluation.calibration import calibration_split_eval, reliability_diagram
from vitlab.evaluation.corruptions import CORRUPTIONS, apply_corruption
from vitlab.evaluation.outputs import (
    N_BINS,
    View,
    build_tta_views,
    classification_metrics,
    classifier_logits,
    default_tta_shift,
    logits_and_assignment,
)
from vitlab.evaluation.stats import per_class_mean
from vitlab.evaluation.target import EvaluationTarget, load_evaluation_target
from vitlab.family import family_of, resolve
from vitlab.jsonio import finite_or_none
from vitlab.progress import progress
from vitlab.rundir import (
    EVALUATION_FILE,
    atomic_write_json,
)

SEVERITIES = (1, 2, 3, 4, 5)
#: datasets whose classes survive a horizontal flip (natural images); digits, MNIST and SVHN do not
FLIP_INVARIANT_DATASETS = frozenset({"cifar10", "cifar100", "celeba", "tiny-imagenet"})
RELIABILITY_FILE = "reliability.png"


# -------------------------------------------------------------------------------------------------------------------
# The suite
# -------------------------------------------------------------------------------------------------------------------
def _pixel_batches(
    loader: DataLoader,
    data_mean: Sequence[float],
    data_std: Sequence[float],
    device: str | torch.device,
    max_batches: int | None,
    what: str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(images: [B, C, H, W]`` in [0, 1], ``labels: [B])`` from a normalising loader, on ``device``, counted."""
    batches = itertools.islice(loader, max_batches)  # max_batches None: all
    for x, y in progress(batches, f"vitlab evaluate: {what} batch", total=min(len(loader), max_batches or len(loader))):
        yield denormalize(x.to(device), data_mean, data_std), y.to(device)


@dataclass
class _TestPredictions:
    """What one pass over the test set collects. ``logits: [B, K]``, ``labels: [B]``; ``tta_probs: [B, K]`` or
    None; ``image_metrics``: the family's metrics of the assignment matrix, name -> ``[B]`` (empty without one);
    ``corrupt_correct[name, severity]`` the number of correct predictions under that corruption."""

    logits: torch.Tensor
    labels: torch.Tensor
    tta_probs: torch.Tensor | None
    image_metrics: dict[str, torch.Tensor]
    corrupt_correct: dict[tuple[str, int], int]


@torch.inference_mode()
def _predict_validation(
    model: nn.Module,
    dm: VisionDataModule,
    normalize: Callable[[torch.Tensor], torch.Tensor],
    device: str | torch.device,
    max_batches: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation logits ``[B, K]`` (float64, CPU) and labels ``[B]``."""
    logits, labels = [], []
    for images, y in _pixel_batches(dm.val_dataloader(), dm.mean, dm.std, device, max_batches, "validation"):
        logits.append(classifier_logits(model, normalize(images)).double().cpu())
        labels.append(y.cpu())
    if sum(len(y) for y in labels) < 2:
        raise ConfigError(
            "temperature scaling needs a validation set of at least 2 images, and this run has none "
            "(data.val_fraction=0?); pass --data val_fraction=0.1 (those images may have been trained on)"
        )
    return torch.cat(logits), torch.cat(labels)


@torch.inference_mode()
def _predict_test(
    model: nn.Module,
    dm: VisionDataModule,
    normalize: Callable[[torch.Tensor], torch.Tensor],
    *,
    views: list[View],
    corruptions: list[tuple[str, int]],
    generator: torch.Generator,
    device: str | torch.device,
    max_batches: int | None,
    image_metrics: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None,
) -> _TestPredictions:
    """One pass over the test set: clean logits (and the ``image_metrics`` of S), the TTA views, every corruption."""
    logits_chunks, labels_chunks, tta_chunks = [], [], []
    metric_chunks: dict[str, list[torch.Tensor]] = {}
    corrupt_correct = dict.fromkeys(corruptions, 0)
    for images, labels in _pixel_batches(dm.test_dataloader(), dm.mean, dm.std, device, max_batches, "test set"):
        logits, S = logits_and_assignment(model, normalize(images))
        logits_chunks.append(logits.double().cpu())
        labels_chunks.append(labels.cpu())
        if S is not None and image_metrics is not None:
            for name, values in image_metrics(S).items():
                metric_chunks.setdefault(name, []).append(values.double().cpu())
        if views:
            probs = sum(
                logits.double().softmax(-1)
                if view.is_identity
                else classifier_logits(model, normalize(view(images))).double().softmax(-1)
                for view in views
            )
            tta_chunks.append((probs / len(views)).cpu())
        for name, severity in corruptions:
            corrupted = apply_corruption(images, name, severity, generator=generator)
            prediction = classifier_logits(model, normalize(corrupted)).argmax(-1)
            corrupt_correct[name, severity] += int((prediction == labels).sum())
    if not labels_chunks:
        raise ConfigError("the test set is empty; check the data config (data.name, data.path)")
    return _TestPredictions(
        torch.cat(logits_chunks),
        torch.cat(labels_chunks),
        torch.cat(tta_chunks) if tta_chunks else None,
        {name: torch.cat(chunks) for name, chunks in metric_chunks.items()},
        corrupt_correct,
    )


def _check_options(
    tta_views_count: int, severities: Sequence[int], max_batches: int | None, tta_shift: int | None, seed: int
) -> None:
    """The options of :func:`evaluate_run` that need no model, checked before it loads one (``--tta-views`` ...)."""
    if isinstance(tta_views_count, bool) or not isinstance(tta_views_count, int) or tta_views_count < 0:
        raise ConfigError(
            f"tta_views must be a count >= 0 (0 turns TTA off), got {tta_views_count!r}; pass --tta-views 0 or more"
        )
    bad = [s for s in severities if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 5]
    if bad or not severities:
        raise ConfigError(f"severities must be integers in 1..5, got {list(severities)}; pass --severities from 1..5")
    if max_batches is not None and max_batches < 1:
        raise ConfigError(
            f"max_batches must be >= 1, got {max_batches}; pass --max-batches 1 or more, or leave it out for all"
        )
    if tta_shift is not None and tta_shift < 1:
        raise ConfigError(
            f"the TTA shift must be at least 1 pixel, got {tta_shift}; pass --tta-shift 1 or more, or leave it out"
        )
    check_seed(seed, "--seed")


def _test_sections(
    test: _TestPredictions,
    calibration: dict[str, Any],
    class_names: list[str],
    severities: Sequence[int],
    evaluation: Any,
    seed: int,
) -> dict[str, Any]:
    """The sections of ``evaluation.json`` read from the test set's predictions: ``test``, ``calibration``,
    ``test_calibrated``, ``tta``, ``corruptions``, ``mean_corrupted``, ``per_class`` and ``assignment`` (the family's
    ``evaluation.report``, None without one)."""
    temperature = calibration["temperature"]
    correct = (test.logits.argmax(-1) == test.labels).double()
    class_accuracy, class_counts = per_class_mean(correct, test.labels, len(class_names))
    corruptions = {}
    for name in dict.fromkeys(name for name, _ in test.corrupt_correct):
        by_severity = {str(s): test.corrupt_correct[name, s] / len(test.labels) for s in severities}
        corruptions[name] = {"by_severity": by_severity, "mean": float(np.mean(list(by_severity.values())))}
    return {
        "test": classification_metrics(test.logits.softmax(-1), test.labels),
        "calibration": calibration,
        "test_calibrated": {
            "temperature": temperature,
            **classification_metrics((test.logits / temperature).softmax(-1), test.labels),
        },
        "tta": classification_metrics(test.tta_probs, test.labels) if test.tta_probs is not None else None,
        "corruptions": corruptions,
        "mean_corrupted": (float(np.mean([entry["mean"] for entry in corruptions.values()])) if corruptions else None),
        "per_class": [
            {
                "index": k,
                "class": class_names[k],
                "n": int(class_counts[k]),
                "accuracy": finite_or_none(class_accuracy[k].item()),
            }
            for k in range(len(class_names))
        ],
        "assignment": (
            evaluation.report(test.image_metrics, test.labels, class_accuracy, class_names, seed)
            if evaluation is not None and test.image_metrics
            else None
        ),
    }


def evaluate_run(
    run_dir_or_export: str | Path,
    *,
    data_overrides: Mapping[str, Any] | Sequence[str] | None = None,
    tta_views: int = 5,
    hflip: bool | None = None,
    tta_shift: int | None = None,
    corruptions: bool = True,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    device: str | torch.device = "cpu",
    max_batches: int | None = None,
    out_dir: str | Path | None = None,
    model_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the evaluation suite on the trained classifier at ``run_dir_or_export`` (a run directory, its ``export/``
    folder or a ``.ckpt``) and write ``evaluation.json`` + ``reliability.png``.

    ``data_overrides``: keys of the ``data`` section (``["eval_batch_size=256"]`` or a dict). ``tta_views``: test-time
    views (:func:`build_tta_views`; 0: none); ``hflip``: whether the flip view is allowed (None: if the model was
    trained with flips or the dataset is in :data:`FLIP_INVARIANT_DATASETS`); ``tta_shift``: pixels of the shift
    views (None: :func:`default_tta_shift`). ``corruptions``: the CIFAR-C suite at ``severities``. ``seed``: the
    validation half the temperature is fitted on, the corruption noise and the bootstrap. ``max_batches``: only the
    first batches of the validation and test loaders. ``out_dir``: default ``<run>/evaluation``, or
    ``<run>/evaluation-tome_r=8`` with ``model_overrides={"tome_r": 8}`` (options that leave the weights alone).

    Returns what ``evaluation.json`` holds: sections ``run``, ``test``, ``calibration`` (validation halves),
    ``test_calibrated``, ``tta``, ``corruptions``, ``mean_corrupted``, ``per_class``, ``assignment`` (None for models
    without an assignment matrix) and ``files``.
    """
    _check_options(tta_views, severities, max_batches, tta_shift, seed)
    target = load_evaluation_target(run_dir_or_export, data_overrides, device, model_overrides)
    target.model.eval()
    dm = target.datamodule
    dm.setup()
    views = _tta_views(target, tta_views, hflip, tta_shift)
    corrupted = [(name, severity) for name in (CORRUPTIONS if corruptions else []) for severity in severities]
    val_logits, val_labels, test, evaluation = _predict(target, views, corrupted, seed, device, max_batches)
    calibration = calibration_split_eval(val_logits, val_labels, seed=seed, n_bins=N_BINS)
    suffix = "".join(f"-{key}={value}" for key, value in sorted((model_overrides or {}).items()))
    out = Path(out_dir) if out_dir is not None else target.out_dir.with_name(target.out_dir.name + suffix)
    _write_reliability(target, test, calibration["temperature"], out / RELIABILITY_FILE)
    settings = dict(max_batches=max_batches, model_overrides=dict(model_overrides or {}), seed=seed)
    results: dict[str, Any] = {
        "run": _run_section(target, test, len(val_labels), settings, views, severities, out),
        **_test_sections(test, calibration, list(dm.class_names), severities, evaluation, seed),
        "files": {"reliability": RELIABILITY_FILE},
    }
    atomic_write_json(out / EVALUATION_FILE, results)
    return results


def _tta_views(target: EvaluationTarget, count: int, hflip: bool | None, shift: int | None) -> list[View]:
    """:func:`evaluate_run`'s test-time views, its ``None`` options resolved for the target's model and data."""
    dm = target.datamodule
    flip_allowed = (target.train_hflip or dm.cfg.name in FLIP_INVARIANT_DATASETS) if hflip is None else hflip
    return build_tta_views(count, hflip=flip_allowed, shift=default_tta_shift(dm.img_size) if shift is None else shift)


def _write_reliability(target: EvaluationTarget, test: _TestPredictions, temperature: float, path: Path) -> None:
    """The test set's reliability diagram, before and after dividing the logits by ``temperature``."""
    name = getattr(target.model, "preset", type(target.model).__name__)
    title = f"{name} on {target.datamodule.cfg.name} test: T = {temperature:.3f}"
    reliability_diagram(test.logits, test.labels, path, title=title, after=test.logits / temperature, n_bins=N_BINS)


def _predict(
    target: EvaluationTarget,
    views: list[View],
    corruptions: list[tuple[str, int]],
    seed: int,
    device: str | torch.device,
    max_batches: int | None,
) -> tuple[torch.Tensor, torch.Tensor, _TestPredictions, Any]:
    """The validation logits and labels (checked against the data's class count), the pass over the test set, and
    the family's evaluation of the assignment matrix (None without one); images normalised with the statistics the
    model was trained with."""
    model, dm = target.model, target.datamodule
    normalize = functools.partial(normalize_pixels, mean=target.mean, std=target.std)
    val_logits, val_labels = _predict_validation(model, dm, normalize, device, max_batches)
    if val_logits.shape[1] != dm.num_classes:
        raise ConfigError(
            f"the model predicts {val_logits.shape[1]} classes but {dm.cfg.name} has {dm.num_classes}; evaluate the "
            "model on the data it was trained on"
        )
    family = family_of(model)
    evaluation = resolve(family.evaluation) if family is not None and family.evaluation else None
    test = _predict_test(
        model,
        dm,
        normalize,
        views=views,
        corruptions=corruptions,
        generator=torch.Generator(device=device).manual_seed(seed),
        device=device,
        max_batches=max_batches,
        image_metrics=evaluation.image_metrics if evaluation is not None else None,
    )
    return val_logits, val_labels, test, evaluation


def _run_section(
    target: EvaluationTarget,
    test: _TestPredictions,
    n_val: int,
    settings: dict[str, Any],
    views: list[View],
    severities: Sequence[int],
    out: Path,
) -> dict[str, Any]:
    """The ``run`` section of ``evaluation.json``: what was evaluated, on what, and how."""
    model, dm = target.model, target.datamodule
    return {
        "source": str(target.source),
        "run_model": target.run_model,
        "model": getattr(model, "preset", type(model).__name__),
        "architecture": type(model).__name__,
        "dataset": dm.cfg.name,
        "num_classes": dm.num_classes,
        "n_test": len(test.labels),
        "n_val": n_val,
        **settings,  # max_batches, model_overrides, seed
        "tta_views": [view.name for view in views],
        "severities": list(severities),
        "out_dir": str(out),
    }

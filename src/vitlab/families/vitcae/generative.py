"""ViTCAE's four generative tasks and the linear probe (ViTCAE paper, "four distinct tasks", which it does not list;
the project's reading and each metric's meaning: docs/vitcae.md, "The generative tasks"). Each task writes a PNG
grid and its numbers, in [0, 1] pixel space after undoing the normalisation:

1. Reconstruction (:func:`reconstruction_task`): MSE, PSNR (of the MSE pooled over the set) and SSIM
   (:func:`ssim_window`) over the test set.
2. Class-conditional generation (:func:`conditional_generation_task`): ``z_cls`` from a Gaussian per class,
   ``z_pt`` from ``p(z_pt | z_cls)``, decoded, judged by a CNN trained independently on pixels (:class:`ConvJudge`).
3. Interpolation (:func:`interpolation_task`): decoding along the line between two test images' ``mu_cls``.
4. Inpainting (:func:`inpainting_task`): a seeded fraction of the patches set to the dataset mean, against the mean
   fill; for a generative model also the prior-mean fill, once and iterated ``INPAINTING_ITERATIONS`` times.

Linear probe (the project's decision where the paper is silent): a logistic regression on frozen ``mu_cls`` of the
un-augmented training images, accuracy on the test set (``linear_probe/accuracy``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics import MeanSquaredError, MetricCollection
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

from vitlab.data import ImageSplit, NormalizeCollate, VisionDataModule, denormalize, normalize
from vitlab.families.vitcae.model import ViTCAE
from vitlab.families.vitcae.pieces import (
    CHUNK,
    GRID_FILES,
    GRID_MAX_CLASSES,
    GRID_SAMPLES_PER_CLASS,
    INPAINTING_GRID_IMAGES,
    INPAINTING_ITERATIONS,
    INPAINTING_MASK_RATIO,
    INTERPOLATION_GRID_PAIRS,
    INTERPOLATION_PAIRS,
    INTERPOLATION_STEPS,
    PIXEL_JUDGE_MAX_IMAGES,
    RECONSTRUCTION_GRID_IMAGES,
    SAMPLES_PER_CLASS,
    Batches,
    ClassGaussians,
    ConvJudge,
    EncodedSplit,
    choose_interpolation_pairs,
    encode_split,
    fit_class_gaussians,
    fit_pixel_judge,
    interpolate_latents,
    judge_accuracy,
    linear_probe_accuracy,
    patch_mask_to_pixels,
    path_measures,
    prior_fill,
    random_patch_mask,
    sample_class_latents,
    sample_conditional_patches,
    save_image_grid,
    ssim_window,
    take_images,
)
from vitlab.models.contract import module_mode
from vitlab.models.protocols import GenerativeModel
from vitlab.progress import stage
from vitlab.rundir import GENERATE_METRICS_FILE, atomic_write_json

# -------------------------------------------------------------------------------------------------------------------
# The four tasks.


@torch.no_grad()
def reconstruction_task(
    model: ViTCAE,
    batches: Batches,
    mean: Sequence[float],
    std: Sequence[float],
    path: str | Path,
    *,
    device: torch.device,
    grid_images: int = RECONSTRUCTION_GRID_IMAGES,
    judge: ConvJudge | None = None,
    judge_images: int = PIXEL_JUDGE_MAX_IMAGES,
) -> dict[str, float]:
    """Task 1: reconstruct every image of ``batches``; MSE, PSNR, SSIM in [0, 1]; a grid of inputs over outputs.
    With ``judge``: its accuracy on the first ``judge_images`` reconstructions (an upper bound for samples)."""
    height, width = (side * model.patch_size for side in model.grid_size)
    scores = MetricCollection(
        {
            "mse": MeanSquaredError(),
            "psnr": PeakSignalNoiseRatio(data_range=1.0),
            "ssim": StructuralSimilarityIndexMeasure(data_range=1.0, **ssim_window(height, width)),
        },
        prefix="reconstruction/",
        compute_groups=False,
    ).to(device)
    shown_inputs, shown_outputs = [], []
    judged, judged_labels = [], []
    shown = judged_count = 0
    for x, y in batches:
        x = x.to(device)
        target = denormalize(x, mean, std)
        output = denormalize(model(x).recon, mean, std)
        if judge is not None and judged_count < judge_images:
            judged.append(output[: judge_images - judged_count].clamp(0, 1).cpu())
            judged_labels.append(y[: len(judged[-1])].cpu().long())
            judged_count += len(judged[-1])
        scores.update(output, target)
        if shown < grid_images:
            shown_inputs.append(target[: grid_images - shown].cpu())
            shown_outputs.append(output[: grid_images - shown].cpu())
            shown += len(shown_inputs[-1])
    grid = torch.stack([torch.cat(shown_inputs), torch.cat(shown_outputs)])
    save_image_grid(grid, path, row_labels=["input", "reconstruction"], title="Reconstruction (test images)")
    metrics = {name: float(value) for name, value in scores.compute().items()}
    if judge is not None:
        metrics["reconstruction/judge_accuracy"] = judge_accuracy(judge, torch.cat(judged), torch.cat(judged_labels))
    return metrics


@torch.no_grad()
def conditional_generation_task(
    model: ViTCAE,
    gaussians: ClassGaussians,
    judge: ConvJudge,
    mean: Sequence[float],
    std: Sequence[float],
    path: str | Path,
    *,
    device: torch.device,
    class_names: Sequence[str],
    generator: torch.Generator | None = None,
    samples_per_class: int = SAMPLES_PER_CLASS,
    grid_per_class: int = GRID_SAMPLES_PER_CLASS,
) -> dict[str, float]:
    """Task 2: sample ``z_cls`` from each class Gaussian, ``z_pt`` from ``p(z_pt | z_cls)``, decode.

    Class consistency: the independent CNN judge's accuracy on the samples (in [0, 1], as an image file would hold
    them), the ViTCAE classifier's accuracy on the re-encoded samples and on the sampled ``z_cls``. Grid: one row per
    class.
    """
    z_cls, labels = sample_class_latents(gaussians, samples_per_class, generator)
    z_cls = z_cls.to(device)
    samples, self_logits, prior_means, estimates = [], [], [], []
    std_sq = mean_sq = 0.0
    for z_chunk in z_cls.split(CHUNK):
        decoded = denormalize(model.decode(z_chunk, sample_conditional_patches(model, z_chunk, generator)), mean, std)
        samples.append(decoded)
        self_logits.append(model.head(model.encode(normalize(decoded, mean, std)).mu_cls))
        prior_mu, prior_logvar = model.prior(z_chunk)
        prior_means.append(denormalize(model.decode(z_chunk, prior_mu), mean, std).cpu())
        estimates.append(denormalize(model.decode(z_chunk, model.estimate_patches(z_chunk)), mean, std).cpu())
        std_sq += float(prior_logvar.exp().sum())
        mean_sq += float(prior_mu.pow(2).sum())
    samples, self_logits = torch.cat(samples), torch.cat(self_logits)
    entries = len(z_cls) * model.num_patches * model.patch_latent_dim
    labels_on_device = labels.to(device)
    metrics = {
        "conditional/judge_accuracy": judge_accuracy(judge, samples, labels),
        "conditional/prior_mean_judge_accuracy": judge_accuracy(judge, torch.cat(prior_means).clamp(0, 1), labels),
        "conditional/estimator_judge_accuracy": judge_accuracy(judge, torch.cat(estimates).clamp(0, 1), labels),
        "conditional/prior_std_rms": (std_sq / entries) ** 0.5,
        "conditional/prior_mean_rms": (mean_sq / entries) ** 0.5,
        "conditional/self_agreement": float((self_logits.argmax(-1) == labels_on_device).float().mean()),
        "conditional/latent_agreement": float((model.head(z_cls).argmax(-1) == labels_on_device).float().mean()),
        "conditional/num_classes": len(gaussians.classes),
    }
    _save_class_grid(samples.cpu(), gaussians.classes, class_names, grid_per_class, path)
    return metrics


def _save_class_grid(
    samples: Tensor, classes: Tensor, class_names: Sequence[str], grid_per_class: int, path: str | Path
) -> None:
    """The first ``grid_per_class`` samples of each class (``samples``: class by class), one row per class."""
    rows = min(len(classes), GRID_MAX_CLASSES)
    per_class = samples.view(len(classes), -1, *samples.shape[1:])
    save_image_grid(
        per_class[:rows, :grid_per_class],
        path,
        row_labels=[class_names[k] for k in classes[:rows].tolist()],
        title="Class-conditional samples: z_cls ~ N(m_k, S_k), z_pt ~ p(z_pt | z_cls)",
    )


@torch.no_grad()
def interpolation_task(
    model: ViTCAE,
    test: EncodedSplit,
    judge: ConvJudge,
    mean: Sequence[float],
    std: Sequence[float],
    path: str | Path,
    *,
    device: torch.device,
    class_names: Sequence[str],
    generator: torch.Generator | None = None,
    num_pairs: int = INTERPOLATION_PAIRS,
    steps: int = INTERPOLATION_STEPS,
    grid_pairs: int = INTERPOLATION_GRID_PAIRS,
) -> dict[str, float]:
    """Task 3: decode along straight lines between the ``mu_cls`` of two test images of different classes.

    Patch latents are the prior means ``mu_hat_pt(z_cls)``. Pairs are drawn among ``test.images``. Numbers: PSNR of
    the decoded end points against their images, the judge's accuracy on the end points. Grid: one row per pair,
    image A, the ``steps`` decodings, image B.
    """
    num_kept = len(test.images)
    start, end = choose_interpolation_pairs(test.labels[:num_kept], num_pairs, generator)
    path_latents = interpolate_latents(test.mu_cls[start], test.mu_cls[end], steps).to(device)  # [P, T, d_z]
    z_cls = path_latents.flatten(0, 1)
    frames = denormalize(model.decode(z_cls, model.prior(z_cls)[0]), mean, std).cpu()
    frames = frames.view(num_pairs, steps, *frames.shape[1:])  # [P, T, C, H, W]
    ends = torch.cat([frames[:, 0], frames[:, -1]])
    end_images = torch.cat([test.images[start], test.images[end]])
    end_labels = torch.cat([test.labels[start], test.labels[end]])
    endpoint_psnr = PeakSignalNoiseRatio(data_range=1.0)(ends, end_images)
    on_path = path_measures(model, frames, path_latents.cpu(), judge, test.labels[start], test.labels[end], mean, std)
    rows = min(num_pairs, grid_pairs)
    grid = torch.cat([test.images[start[:rows]].unsqueeze(1), frames[:rows], test.images[end[:rows]].unsqueeze(1)], 1)
    save_image_grid(
        grid,
        path,
        row_labels=[
            f"{class_names[a]} -> {class_names[b]}"
            for a, b in zip(test.labels[start[:rows]].tolist(), test.labels[end[:rows]].tolist(), strict=True)
        ],
        col_labels=["image A", *(f"t={t:.2f}" for t in torch.linspace(0, 1, steps).tolist()), "image B"],
        title="Interpolation of z_cls (patch latents = prior mean)",
    )
    return {
        "interpolation/endpoint_psnr": float(endpoint_psnr),
        "interpolation/endpoint_judge_accuracy": judge_accuracy(judge, ends, end_labels),
        **on_path,
    }


@torch.no_grad()
def inpainting_task(
    model: nn.Module,
    batches: Batches,
    mean: Sequence[float],
    std: Sequence[float],
    path: str | Path,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
    mask_ratio: float = INPAINTING_MASK_RATIO,
    grid_images: int = INPAINTING_GRID_IMAGES,
) -> dict[str, float]:
    """Task 4: mask ``mask_ratio`` of the patches of every image (pixels set to 0 = the dataset mean in normalised
    space), encode, decode. PSNR on the masked pixels in [0, 1] for the output and for the mean-fill baseline (the
    masked input itself). ``model`` needs ``grid_size``, ``patch_size``, ``num_patches`` and ``model(x).recon``.
    Grid: original, masked, inpainted.
    """
    generative = hasattr(model, "prior") and hasattr(model, "decode") and hasattr(model, "encode")
    fills = ["plain", "prior_fill", "iterated"] if generative else ["plain"]
    psnr = {name: PeakSignalNoiseRatio(data_range=1.0).to(device) for name in fills}
    baseline_psnr = PeakSignalNoiseRatio(data_range=1.0).to(device)
    shown: list[list[Tensor]] = [[] for _ in range(2 + len(fills))]
    for x, _ in batches:
        x = x.to(device)
        patch_mask = random_patch_mask(len(x), model.num_patches, mask_ratio, generator)
        pixel_mask = patch_mask_to_pixels(patch_mask, model.grid_size, model.patch_size).to(device)
        masked = x.masked_fill(pixel_mask, 0.0)
        target = denormalize(x, mean, std)
        mean_fill = denormalize(masked, mean, std)
        outputs = _inpaintings(model, masked, patch_mask.to(device), pixel_mask, generative)
        selected = pixel_mask.expand_as(x)
        for name in fills:
            psnr[name].update(denormalize(outputs[name], mean, std)[selected], target[selected])
        baseline_psnr.update(mean_fill[selected], target[selected])
        room = grid_images - sum(len(images) for images in shown[0])
        if room > 0:
            rows = (target, mean_fill, *(denormalize(outputs[name], mean, std) for name in fills))
            for row, images in zip(shown, rows, strict=True):
                row.append(images[:room].cpu())
    save_image_grid(
        torch.stack([torch.cat(row) for row in shown]),
        path,
        row_labels=["original", "masked", *(f"inpainted ({name})" for name in fills)],
        title=f"Inpainting: {mask_ratio:.0%} of the patches masked (filled with the dataset mean)",
    )
    return _inpainting_metrics(
        {name: float(metric.compute()) for name, metric in psnr.items()}, baseline_psnr, mask_ratio
    )


def _inpainting_metrics(
    values: dict[str, float], baseline_psnr: PeakSignalNoiseRatio, mask_ratio: float
) -> dict[str, float]:
    """The PSNR of each fill (``values``, ``plain`` first) and its gain over the mean-fill baseline's."""
    baseline = float(baseline_psnr.compute())
    metrics = {
        "inpainting/psnr": values["plain"],
        "inpainting/mean_fill_psnr": baseline,
        "inpainting/psnr_gain": values["plain"] - baseline,
        "inpainting/mask_ratio": mask_ratio,
    }
    for name in list(values)[1:]:
        metrics[f"inpainting/{name}_psnr"] = values[name]
        metrics[f"inpainting/{name}_psnr_gain"] = values[name] - baseline
    return metrics


def _inpaintings(
    model: nn.Module, masked: Tensor, patch_mask: Tensor, pixel_mask: Tensor, generative: bool
) -> dict[str, Tensor]:
    """The model's output on the ``masked`` images (``plain``) and, for a generative model, the prior fill once
    (``prior_fill``) and ``INPAINTING_ITERATIONS`` times (``iterated``)."""
    outputs = {"plain": model(masked).recon}
    if generative:
        outputs["prior_fill"] = current = prior_fill(model, masked, patch_mask, pixel_mask)
        for _ in range(INPAINTING_ITERATIONS - 1):
            current = prior_fill(model, current, patch_mask, pixel_mask)
        outputs["iterated"] = current
    return outputs


# -------------------------------------------------------------------------------------------------------------------
# Everything at once.


def _clean_loader(dm: VisionDataModule, split: ImageSplit) -> DataLoader:
    """The images of ``split`` without augmentation, normalised, with integer labels, in their stored order."""
    collate = NormalizeCollate(dm.mean, dm.std, num_classes=dm.num_classes)
    return DataLoader(
        ImageSplit(split.pool, split.indices),
        batch_size=dm.cfg.eval_batch_size or dm.cfg.batch_size,
        collate_fn=collate,
    )


class _Stages:
    """The stages of :func:`run_generative_tasks`: calling it with the next stage's name closes the running one,
    printing its seconds where ``progress`` asks for them (None closes the last)."""

    def __init__(self, progress: bool) -> None:
        self.progress, self.name, self.started = progress, None, time.perf_counter()

    def __call__(self, name: str | None) -> None:
        if self.progress and self.name is not None:
            print(f"generate: {self.name} done in {time.perf_counter() - self.started:.1f} s", flush=True)
        if self.progress and name is not None:
            stage(f"vitlab generate: {name}")
        self.name, self.started = name, time.perf_counter()


def run_generative_tasks(
    model: ViTCAE,
    datamodule: VisionDataModule,
    out_dir: Path,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    max_images: int | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Run the four generative tasks and the linear probe (module doc); write their grids (``GRID_FILES``) and
    ``metrics.json`` into ``out_dir``; return the metrics.

    ``model`` is moved to ``device`` and run in eval mode (its training flag is restored afterwards). ``max_images``
    caps the images used from each of the training and test sets (for quick runs); None uses all. Every random draw
    (class samples, prior noise, pairs, masks, sklearn) follows ``seed``. ``progress``: print one line per stage
    with its time (the judge's training and the encodings take minutes on large sets).

    Long because it is the list of stages, each one call, in the order they run.
    """
    if not isinstance(model, GenerativeModel):
        raise TypeError(f"the generative tasks need a ViTCAE, got {type(model).__name__}")
    if max_images is not None and max_images < 2:
        raise ValueError(f"max_images must be at least 2 (or None for all images), got {max_images}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    datamodule.setup()
    mean, std = datamodule.mean, datamodule.std
    test_batches = functools.partial(take_images, _clean_loader(datamodule, datamodule.test_set), max_images)
    grids = {task: out_dir / name for task, name in GRID_FILES.items()}
    stage, generator = _Stages(progress), torch.Generator().manual_seed(seed)
    sampling = dict(device=device, class_names=datamodule.class_names, generator=generator)
    model.to(device)
    with module_mode(model, training=False), torch.no_grad():
        stage("encoding the training images")
        train_images = take_images(_clean_loader(datamodule, datamodule.train_set), max_images)
        train = encode_split(model, train_images, mean, std, device=device, keep=PIXEL_JUDGE_MAX_IMAGES)
        stage("encoding the test images")
        test = encode_split(model, test_batches(), mean, std, device=device, keep=PIXEL_JUDGE_MAX_IMAGES)
        stage("training the CNN judge")
        judge = fit_pixel_judge(train.images, train.labels[: len(train.images)], seed, device=device)
        stage("classifier and linear probe")
        metrics = _classifier_metrics(model, train, test, judge, seed, device)
        stage("reconstruction")
        metrics |= reconstruction_task(
            model, test_batches(), mean, std, grids["reconstruction"], device=device, judge=judge
        )
        stage("conditional generation")
        gaussians = fit_class_gaussians(train.mu_cls, train.labels)
        metrics |= conditional_generation_task(model, gaussians, judge, mean, std, grids["conditional"], **sampling)
        stage("interpolation")
        metrics |= interpolation_task(model, test, judge, mean, std, grids["interpolation"], **sampling)
        stage("inpainting")
        metrics |= inpainting_task(
            model, test_batches(), mean, std, grids["inpainting"], device=device, generator=generator
        )
        stage(None)
    atomic_write_json(out_dir / GENERATE_METRICS_FILE, metrics)
    return metrics


def _classifier_metrics(
    model: ViTCAE, train: EncodedSplit, test: EncodedSplit, judge: ConvJudge, seed: int, device: torch.device
) -> dict[str, float]:
    """The image counts, the accuracy of the ViTCAE's own head and of a linear probe on ``mu_cls``, and the judge's
    accuracy on the real test images (an upper bound for the samples)."""
    classifier = model.head(test.mu_cls.to(device)).argmax(-1).cpu()
    return {
        "images/train": len(train.labels),
        "images/test": len(test.labels),
        "classifier/accuracy": float((classifier == test.labels).float().mean()),
        "linear_probe/accuracy": linear_probe_accuracy(train, test, seed),
        "conditional/judge_test_accuracy": judge_accuracy(judge, test.images, test.labels[: len(test.images)]),
    }

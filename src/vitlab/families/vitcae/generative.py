"""ViTCAE's four generative tasks and the linear probe (ViTCAE paper, "four distinct tasks"; docs/vitcae.md).

The paper judges its autoencoder on "four distinct tasks" without listing them; the four below are the project's
reading (docs/vitcae.md, "The generative tasks"). Each one here writes a PNG grid and its numbers:

1. Reconstruction: MSE, PSNR and SSIM over the test set, in [0, 1] pixel space after undoing the normalisation.
   PSNR is ``10 log10(1 / MSE)`` of the MSE pooled over every pixel of the set (torchmetrics, ``data_range=1``);
   SSIM is the mean per-image SSIM with the window of :func:`ssim_window` (a smaller one for tiny images).
2. Class-conditional generation: a Gaussian per class fitted to ``mu_cls`` of the training set, with a full
   covariance shrunk by Ledoit-Wolf (the latent dimensions are correlated, and shrinkage keeps the estimate
   positive definite when a class has fewer images than ``d_z``); ``z_cls`` sampled from it, ``z_pt`` from the
   conditional prior ``p(z_pt | z_cls)``, decoded. Class consistency is the accuracy, on the samples, of a judge
   trained independently of the ViTCAE: a small CNN (:class:`ConvJudge`) on the pixels of the training images.
   The same ``z_cls`` are also decoded with the prior mean ``mu_hat_pt(z_cls)`` and with the estimator ``g(z_cls)``
   as patch latents (``prior_mean_judge_accuracy``, ``estimator_judge_accuracy``): the samples' ``z_pt`` noise has
   the prior's std, which is measured (``prior_std_rms`` against ``prior_mean_rms``) and can be larger than the
   patch means themselves. Upper bounds beside them: the judge on real test images (``judge_test_accuracy``) and
   on their reconstructions (``reconstruction/judge_accuracy``). The ViTCAE's own classifier is reported too: on
   the re-encoded samples (``self_agreement``) and on the sampled ``z_cls`` themselves (``latent_agreement``).
3. Interpolation: a straight line between two test images' ``mu_cls``, patch latents from the prior mean
   ``mu_hat_pt(z_cls)``, decoded; pairs of images of different classes. At the ends: PSNR of the decoded end
   points against their images (what the prior-mean patch latents lose) and the judge's accuracy there. On the
   path (the interpolation itself): ``path_latent_error``, how far the re-encoded frames' ``mu_cls`` lie from the
   points of the line they were decoded from, relative to the line's length (0: the decoder follows the line);
   ``path_endpoint_classes``, the share of the inner frames the judge gives to one of the two end classes; and
   ``path_max_step_share``, the largest pixel change between neighbouring frames over the sum of them (``1 /
   (steps - 1)`` for an even morph, 1 for a single jump).
4. Inpainting: a seeded random fraction of the patches set to 0 in normalised space (the per-channel dataset
   mean), encoded and decoded; PSNR on the masked pixels against the mean-fill baseline, which is exactly what the
   masked input holds there. The autoencoder reproduces its input, mean fill included, so two fills that use the
   generative model are measured too: ``prior_fill`` replaces the masked patches' latents by the conditional prior
   mean ``mu_hat_pt(z_cls)`` before decoding (the known pixels are pasted back), and ``iterated`` repeats
   encode -> prior fill -> decode -> paste ``INPAINTING_ITERATIONS`` times.

Linear probe (the project's decision where the ViTCAE paper is silent; docs/vitcae.md, "Class conditioning"): a
logistic regression on frozen ``mu_cls`` of the training set, accuracy on the test set. Training latents and pixels
come from the training images without augmentation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from sklearn.covariance import LedoitWolf
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics import MeanSquaredError
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure
from torchvision.utils import make_grid

from vitlab.data import ImageSplit, NormalizeCollate, VisionDataModule, denormalize, normalize
from vitlab.families.vitcae.model import ViTCAE
from vitlab.models.protocols import GenerativeModel
from vitlab.rundir import GENERATE_METRICS_FILE, atomic_write_json, save_figure

Batches = Iterable[tuple[Tensor, Tensor]]

GRID_FILES = {
    "reconstruction": "reconstruction.png",
    "conditional": "conditional_samples.png",
    "interpolation": "interpolation.png",
    "inpainting": "inpainting.png",
}
RECONSTRUCTION_GRID_IMAGES = 16
SAMPLES_PER_CLASS = 50  # samples per class for the class-consistency numbers
GRID_SAMPLES_PER_CLASS = 8
GRID_MAX_CLASSES = 20  # rows of the class-conditional grid (e.g. CIFAR-100 shows its first 20 classes)
INTERPOLATION_PAIRS = 32  # pairs for the numbers; the grid shows the first INTERPOLATION_GRID_PAIRS
INTERPOLATION_GRID_PAIRS = 6
INTERPOLATION_STEPS = 8
INPAINTING_MASK_RATIO = 0.25
INPAINTING_ITERATIONS = 4
INPAINTING_GRID_IMAGES = 8
PIXEL_JUDGE_MAX_IMAGES = 10_000  # cap on the images the judge is trained and tested on
SKLEARN_MAX_ITER = 2000
#: passes of the judge's training over (at most PIXEL_JUDGE_MAX_IMAGES) training images
JUDGE_EPOCHS = 3
JUDGE_MIN_STEPS = 300
CHUNK = 256  # images decoded at once
GRID_CELL_PIXELS = 80  # small images are upscaled by a whole factor to about this size in the grids


# -------------------------------------------------------------------------------------------------------------------
# Pure pieces: windows, class Gaussians, sampling, interpolation, masks.


def ssim_window(height: int, width: int) -> dict[str, Any]:
    """Window options of torchmetrics' SSIM for ``height x width`` images.

    Wang et al. (2004)'s Gaussian window (sigma 1.5, 11x11 support) when both sides are at least 16 pixels. torchmetrics
    keeps only the ``(H - 10) x (W - 10)`` positions where the window fits, so smaller images (8x8 digits) get a 3x3
    uniform window instead: a ``(H - 2) x (W - 2)`` map of local statistics over 9 pixels.
    """
    if min(height, width) >= 16:
        return {"gaussian_kernel": True, "sigma": 1.5}
    if min(height, width) >= 3:
        return {"gaussian_kernel": False, "kernel_size": 3}
    raise ValueError(f"SSIM needs images of at least 3x3 pixels, got {height}x{width}")


@dataclass
class ClassGaussians:
    """One Gaussian per class over the global latent: ``classes: int64 [K]`` (the classes that have one),
    ``means: [K, d_z]``, ``covariances: [K, d_z, d_z]`` (symmetric positive semi-definite)."""

    classes: Tensor
    means: Tensor
    covariances: Tensor


def fit_class_gaussians(latents: Tensor, labels: Tensor) -> ClassGaussians:
    """Fit ``N(m_k, S_k)`` to the latents of each class ``k`` (task 2; docs/vitcae.md, "The generative tasks").

    ``latents: [N, d_z]``, ``labels: int64 [N]``. ``m_k`` is the class mean and ``S_k`` the Ledoit-Wolf shrunk
    covariance (Ledoit & Wolf 2004), positive definite even when a class has fewer latents than ``d_z``. Classes with
    fewer than two latents have no spread to estimate and are left out of ``classes``.
    """
    if latents.ndim != 2 or labels.shape != latents.shape[:1]:
        raise ValueError(f"expected latents [N, d] and labels [N], got {list(latents.shape)} and {list(labels.shape)}")
    data = latents.detach().cpu().double().numpy()
    label_array = labels.cpu().numpy()
    classes, means, covariances = [], [], []
    for k in np.unique(label_array):
        members = data[label_array == k]
        if len(members) < 2:
            continue
        estimator = LedoitWolf().fit(members)
        classes.append(int(k))
        means.append(torch.from_numpy(estimator.location_))
        covariances.append(torch.from_numpy(estimator.covariance_))
    if not classes:
        raise ValueError("no class has two or more latents: a class Gaussian needs at least two training images")
    dtype = latents.dtype
    return ClassGaussians(torch.tensor(classes), torch.stack(means).to(dtype), torch.stack(covariances).to(dtype))


def sample_class_latents(
    gaussians: ClassGaussians, per_class: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Draw ``per_class`` latents from every class Gaussian: ``z = m_k + S_k^{1/2} eps``, ``eps ~ N(0, I)``.

    Returns ``(z: [K * per_class, d_z], labels: int64 [K * per_class])``, class by class in ``gaussians.classes``
    order. The square root comes from an eigendecomposition, so semi-definite covariances work too.
    """
    eigenvalues, eigenvectors = torch.linalg.eigh(gaussians.covariances.double())
    roots = eigenvectors * eigenvalues.clamp_min(0).sqrt().unsqueeze(-2)  # [K, d, d], roots @ roots^T = S_k
    num_classes, dim = gaussians.means.shape
    eps = torch.randn(num_classes, per_class, dim, generator=generator, dtype=torch.float64)
    z = gaussians.means.double().unsqueeze(1) + eps @ roots.transpose(-1, -2)
    labels = gaussians.classes.repeat_interleave(per_class)
    return z.reshape(-1, dim).to(gaussians.means.dtype), labels


def sample_conditional_patches(model: ViTCAE, z_cls: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw ``z_pt ~ p(z_pt | z_cls) = N(mu_hat, diag exp(logvar_hat))`` (ViTCAE paper, "conditional Gaussian
    prior"): ``[B, d_z] -> [B, N, d_p]``.

    The noise is drawn on the CPU from ``generator``, so a seed gives the same samples on every device.
    """
    mu, logvar = model.prior(z_cls)
    eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype).to(mu.device)
    return mu + (0.5 * logvar).exp() * eps


def interpolate_latents(z_start: Tensor, z_end: Tensor, steps: int) -> Tensor:
    """Points on the straight lines ``(1 - t) z_start + t z_end``, ``t`` in ``linspace(0, 1, steps)``.

    ``z_start, z_end: [B, d]`` -> ``[B, steps, d]``; the first point is ``z_start``, the last ``z_end``.
    """
    if steps < 2:
        raise ValueError(f"an interpolation needs at least 2 steps (its two end points), got {steps}")
    t = torch.linspace(0.0, 1.0, steps, dtype=z_start.dtype, device=z_start.device).view(1, steps, 1)
    return (1.0 - t) * z_start.unsqueeze(1) + t * z_end.unsqueeze(1)


def choose_interpolation_pairs(
    labels: Tensor, num_pairs: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Seeded pairs of indices into ``labels: [N]`` whose two images have different classes.

    Returns ``(start, end)``, each int64 ``[num_pairs]``: ``start`` uniform over the images, ``end`` uniform over the
    images of another class.
    """
    if labels.unique().numel() < 2:
        raise ValueError("interpolation pairs need images of at least two classes; use more test images")
    start = torch.randint(len(labels), (num_pairs,), generator=generator)
    end = torch.empty_like(start)
    for i, s in enumerate(start.tolist()):
        others = (labels != labels[s]).nonzero().squeeze(1)
        end[i] = others[torch.randint(len(others), (1,), generator=generator)]
    return start, end


def random_patch_mask(
    batch_size: int, num_patches: int, ratio: float, generator: torch.Generator | None = None
) -> Tensor:
    """A seeded random set of ``max(1, round(ratio * N))`` patches per image: bool ``[B, N]``, True = masked."""
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"mask ratio must lie in (0, 1), got {ratio}")
    count = max(1, round(ratio * num_patches))
    order = torch.rand(batch_size, num_patches, generator=generator).argsort(dim=1)
    return torch.zeros(batch_size, num_patches, dtype=torch.bool).scatter_(1, order[:, :count], True)


def patch_mask_to_pixels(mask: Tensor, grid_size: tuple[int, int], patch_size: int) -> Tensor:
    """Patch mask ``[B, N]`` (row-major ``grid_size`` grid) -> pixel mask ``[B, 1, H, W]``, ``H = grid_h * P``."""
    grid_h, grid_w = grid_size
    if mask.shape[1] != grid_h * grid_w:
        raise ValueError(f"a {grid_h}x{grid_w} patch grid needs masks [B, {grid_h * grid_w}], got {list(mask.shape)}")
    grid = mask.view(-1, 1, grid_h, grid_w)
    return grid.repeat_interleave(patch_size, dim=2).repeat_interleave(patch_size, dim=3)


# -------------------------------------------------------------------------------------------------------------------
# Grids.


def save_image_grid(
    images: Tensor,
    path: str | Path,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write ``images: [R, K, C, H, W]`` in [0, 1] as an ``R x K`` PNG grid.

    Each image is upscaled by a whole factor (nearest neighbour, so every pixel stays a clean square; an 8x8 digit
    becomes 80x80) and the tiles are laid out with white gutters by torchvision's ``make_grid``; the mosaic is placed
    pixel for pixel on the figure (``figimage``, no resampling). ``row_labels`` (``R``) are written left of the rows,
    ``col_labels`` (``K``) above the columns. Returns the path written.
    """
    if images.ndim != 5 or images.shape[2] not in (1, 3):
        raise ValueError(f"expected images [R, K, C, H, W] with C = 1 or 3, got {list(images.shape)}")
    rows, cols, _, height, width = images.shape
    if len(row_labels or [None] * rows) != rows or len(col_labels or [None] * cols) != cols:
        raise ValueError(f"a {rows}x{cols} grid needs {rows} row labels and {cols} column labels")
    scale = max(1, GRID_CELL_PIXELS // max(height, width))
    tiles = images.detach().float().cpu().clamp(0, 1).flatten(0, 1)
    tiles = tiles.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    gutter = 4
    mosaic = make_grid(tiles, nrow=cols, padding=gutter, pad_value=1.0).permute(1, 2, 0).numpy()  # [H', W', 3]
    cell_h, cell_w = height * scale + gutter, width * scale + gutter
    left = 12 + 6 * max((len(label) for label in row_labels), default=0) if row_labels else 0
    top = (18 if col_labels else 0) + (24 if title else 0)
    fig_w, fig_h = left + mosaic.shape[1], top + mosaic.shape[0]
    figure = Figure(figsize=(fig_w / 100, fig_h / 100), dpi=100)
    figure.figimage(mosaic, xo=left, yo=0, origin="upper")
    for r, label in enumerate(row_labels or []):
        y = mosaic.shape[0] - (gutter + r * cell_h + (cell_h - gutter) / 2)
        figure.text((left - 6) / fig_w, y / fig_h, label, ha="right", va="center", fontsize=8)
    for c, label in enumerate(col_labels or []):
        x = left + gutter + c * cell_w + (cell_w - gutter) / 2
        figure.text(x / fig_w, (mosaic.shape[0] + 3) / fig_h, label, ha="center", va="bottom", fontsize=8)
    if title:
        figure.text(0.5, 1 - 4 / fig_h, title, ha="center", va="top", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, path, dpi=100)
    return path


# -------------------------------------------------------------------------------------------------------------------
# Data passes and the two sklearn models.


def take_images(batches: Batches, max_images: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """The batches ``(x: [B, C, H, W], y: [B])`` of ``batches`` up to ``max_images`` images in all (None: every one)."""
    seen = 0
    for x, y in batches:
        if max_images is not None:
            if seen >= max_images:
                return
            x, y = x[: max_images - seen], y[: max_images - seen]
        seen += len(x)
        yield x, y


@dataclass
class EncodedSplit:
    """A split pushed through the encoder: ``mu_cls: [N, d_z]``, ``labels: int64 [N]`` (both on the CPU) and its
    first ``images: [M, C, H, W]`` in [0, 1] (``M <= N``) for the judge and the grids."""

    mu_cls: Tensor
    labels: Tensor
    images: Tensor


@torch.no_grad()
def encode_split(
    model: ViTCAE, batches: Batches, mean: Sequence[float], std: Sequence[float], *, device: torch.device, keep: int
) -> EncodedSplit:
    """``mu_cls`` of every image of ``batches`` and the first ``keep`` images in [0, 1]."""
    mu_cls, labels, images = [], [], []
    kept = 0
    for x, y in batches:
        mu_cls.append(model.encode(x.to(device)).mu_cls.cpu())
        labels.append(y.cpu())
        if kept < keep:
            images.append(denormalize(x[: keep - kept].cpu(), mean, std))
            kept += len(images[-1])
    if not labels:
        raise ValueError("the split holds no images; check the data config (limit_train, val_fraction)")
    return EncodedSplit(torch.cat(mu_cls), torch.cat(labels).long(), torch.cat(images))


class ConvJudge(nn.Module):
    """The independent class-consistency judge: a small CNN on [0, 1] pixels, ``[B, C, H, W] -> [B, K]``.

    Deliberately not a ViT (so it shares no inductive bias or code with the model it judges) and stronger than a
    linear model on pixels, which misreads slightly shifted strokes as often as real errors (on MNIST a pixel
    logistic regression scored 89% on real test digits; a judge that weak says little about samples).
    """

    def __init__(self, in_chans: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_chans, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(8 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).flatten(1))

    @torch.no_grad()
    def predict(self, images: Tensor) -> Tensor:
        """Class predictions ``[N]`` for ``images: [N, C, H, W]`` in [0, 1]."""
        self.eval()
        device = next(self.parameters()).device
        return torch.cat([self(chunk.to(device)).argmax(-1).cpu() for chunk in images.split(512)])


def fit_pixel_judge(
    images: Tensor, labels: Tensor, seed: int = 0, epochs: int = JUDGE_EPOCHS, device: str | torch.device = "cpu"
) -> ConvJudge:
    """Train the independent judge on the training images only (never on ViTCAE outputs).

    ``images: [N, C, H, W]`` in [0, 1], ``labels: [N]``. Adam, batch 128, a fixed seed; ``epochs`` passes, and at
    least ``JUDGE_MIN_STEPS`` optimizer steps so a small training set (the 8x8 digits) is not underfitted.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        judge = ConvJudge(images.shape[1], int(labels.max()) + 1).to(device)
    optimizer = torch.optim.Adam(judge.parameters(), lr=2e-3)
    judge.train()
    with torch.enable_grad():  # the generative tasks run under no_grad
        _train_judge(judge, optimizer, images, labels, epochs, generator, device)
    return judge.eval()


def _train_judge(
    judge: ConvJudge,
    optimizer: torch.optim.Optimizer,
    images: Tensor,
    labels: Tensor,
    epochs: int,
    generator: torch.Generator,
    device: str | torch.device,
) -> None:
    steps_per_epoch = max(1, len(images) // 128)
    epochs = max(epochs, -(-JUDGE_MIN_STEPS // steps_per_epoch))
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for index in order.split(128):
            if len(index) < 2:  # BatchNorm needs two samples
                continue
            logits = judge(images[index].to(device))
            loss = F.cross_entropy(logits, labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()


def judge_accuracy(judge: ConvJudge, images: Tensor, labels: Tensor) -> float:
    """Accuracy of a fitted judge on ``images: [N, C, H, W]`` in [0, 1] with true ``labels: [N]``."""
    return float((judge.predict(images) == labels.cpu()).float().mean())


def linear_probe_accuracy(train: EncodedSplit, test: EncodedSplit, seed: int = 0) -> float:
    """Spec section 2: logistic regression on standardised frozen ``mu_cls`` of the training set, test accuracy."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=SKLEARN_MAX_ITER, random_state=seed))
    probe.fit(train.mu_cls.double().numpy(), train.labels.numpy())
    return float(probe.score(test.mu_cls.double().numpy(), test.labels.numpy()))


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
    mse = MeanSquaredError().to(device)
    psnr = PeakSignalNoiseRatio(data_range=1.0).to(device)
    ssim = StructuralSimilarityIndexMeasure(data_range=1.0, **ssim_window(height, width)).to(device)
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
        mse.update(output, target)
        psnr.update(output, target)
        ssim.update(output, target)
        if shown < grid_images:
            shown_inputs.append(target[: grid_images - shown].cpu())
            shown_outputs.append(output[: grid_images - shown].cpu())
            shown += len(shown_inputs[-1])
    inputs, outputs = torch.cat(shown_inputs), torch.cat(shown_outputs)
    save_image_grid(
        torch.stack([inputs, outputs]),
        path,
        row_labels=["input", "reconstruction"],
        title="Reconstruction (test images)",
    )
    metrics = {
        "reconstruction/mse": float(mse.compute()),
        "reconstruction/psnr": float(psnr.compute()),
        "reconstruction/ssim": float(ssim.compute()),
    }
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
        "conditional/num_classes": float(len(gaussians.classes)),
    }
    rows = min(len(gaussians.classes), GRID_MAX_CLASSES)
    per_class = samples.cpu().view(len(gaussians.classes), samples_per_class, *samples.shape[1:])
    save_image_grid(
        per_class[:rows, :grid_per_class],
        path,
        row_labels=[class_names[k] for k in gaussians.classes[:rows].tolist()],
        title="Class-conditional samples: z_cls ~ N(m_k, S_k), z_pt ~ p(z_pt | z_cls)",
    )
    return metrics


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
def path_measures(
    model: ViTCAE,
    frames: Tensor,
    path_latents: Tensor,
    judge: ConvJudge,
    start_labels: Tensor,
    end_labels: Tensor,
    mean: Sequence[float],
    std: Sequence[float],
) -> dict[str, float]:
    """The interpolation measured on its path (task 3). ``frames: [P, T, C, H, W]`` in [0, 1] decoded from
    ``path_latents: [P, T, d_z]``; the end classes ``[P]``. See the module docstring for the three numbers."""
    pairs, steps = frames.shape[:2]
    device = next(model.parameters()).device
    flat = frames.flatten(0, 1)
    encoded = torch.cat([model.encode(normalize(c.to(device), mean, std)).mu_cls.cpu() for c in flat.split(CHUNK)])
    encoded = encoded.view(pairs, steps, -1)
    length = (path_latents[:, -1] - path_latents[:, 0]).norm(dim=-1).clamp_min(1e-12)  # [P]
    inner = slice(1, steps - 1)
    latent_error = (encoded[:, inner] - path_latents[:, inner]).norm(dim=-1) / length.unsqueeze(1)
    predicted = judge.predict(flat).view(pairs, steps)[:, inner]
    at_an_end = (predicted == start_labels.unsqueeze(1)) | (predicted == end_labels.unsqueeze(1))
    step_sizes = (frames[:, 1:] - frames[:, :-1]).flatten(2).pow(2).mean(-1).sqrt()  # [P, T - 1]
    share = step_sizes.max(dim=1).values / step_sizes.sum(dim=1).clamp_min(1e-12)
    return {
        "interpolation/path_latent_error": float(latent_error.mean()),
        "interpolation/path_endpoint_classes": float(at_an_end.float().mean()),
        "interpolation/path_max_step_share": float(share.mean()),
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
        outputs = {"plain": model(masked).recon}
        if generative:
            outputs["prior_fill"] = prior_fill(model, masked, patch_mask.to(device), pixel_mask)
            current = outputs["prior_fill"]
            for _ in range(INPAINTING_ITERATIONS - 1):
                current = prior_fill(model, current, patch_mask.to(device), pixel_mask)
            outputs["iterated"] = current
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
    values, baseline = {name: float(metric.compute()) for name, metric in psnr.items()}, float(baseline_psnr.compute())
    metrics = {
        "inpainting/psnr": values["plain"],
        "inpainting/mean_fill_psnr": baseline,
        "inpainting/psnr_gain": values["plain"] - baseline,
        "inpainting/mask_ratio": mask_ratio,
    }
    for name in fills[1:]:
        metrics[f"inpainting/{name}_psnr"] = values[name]
        metrics[f"inpainting/{name}_psnr_gain"] = values[name] - baseline
    return metrics


@torch.no_grad()
def prior_fill(model: ViTCAE, x: Tensor, patch_mask: Tensor, pixel_mask: Tensor) -> Tensor:
    """One inpainting pass that uses the generative model: encode ``x`` (normalised, ``[B, C, H, W]``), replace
    the latents of the masked patches (``patch_mask: [B, N]``) by the conditional prior mean ``mu_hat_pt(mu_cls)``,
    decode, and paste the unmasked pixels of ``x`` back (``pixel_mask: [B, 1, H, W]``, True = masked)."""
    post = model.encode(x)
    prior_mu, _ = model.prior(post.mu_cls)
    z_pt = torch.where(patch_mask.unsqueeze(-1), prior_mu, post.mu_pt)
    decoded = model.decode(post.mu_cls, z_pt)
    return torch.where(pixel_mask, decoded, x)


# -------------------------------------------------------------------------------------------------------------------
# Everything at once.


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _clean_loader(dm: VisionDataModule, split: ImageSplit) -> DataLoader:
    """The images of ``split`` without augmentation, normalised, with integer labels, in their stored order."""
    collate = NormalizeCollate(dm.mean, dm.std, num_classes=dm.num_classes)
    return DataLoader(
        ImageSplit(split.pool, split.indices),
        batch_size=dm.cfg.eval_batch_size or dm.cfg.batch_size,
        collate_fn=collate,
    )


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
    """Run the four generative tasks and the linear probe; write their grids and ``metrics.json`` into ``out_dir``.

    ``model`` is moved to ``device`` and run in eval mode (its training flag is restored afterwards). Training
    latents and pixels come from the un-augmented training images. ``max_images`` caps the images used from each
    of the training and test sets (for quick runs); None uses all. Every random draw (class samples, prior noise,
    pairs, masks, sklearn) follows ``seed``. Returns the metrics, also written to ``out_dir / "metrics.json"``:
    ``images/{train,test}``, ``classifier/accuracy`` (the ViTCAE's own head), ``linear_probe/accuracy``,
    ``reconstruction/{mse,psnr,ssim,judge_accuracy}``, ``conditional/{judge_accuracy,prior_mean_judge_accuracy,
    estimator_judge_accuracy,judge_test_accuracy,prior_std_rms,prior_mean_rms,self_agreement,latent_agreement,
    num_classes}``, ``interpolation/{endpoint_psnr,endpoint_judge_accuracy,path_latent_error,
    path_endpoint_classes,path_max_step_share}``, ``inpainting/{psnr,mean_fill_psnr,psnr_gain,mask_ratio}`` and
    ``inpainting/{prior_fill,iterated}_{psnr,psnr_gain}``. The grids are the files of ``GRID_FILES``.
    ``progress``: print one line per stage with its time (the judge's training and the encodings take minutes on
    large sets).
    """
    if not isinstance(model, GenerativeModel):
        raise TypeError(f"the generative tasks need a ViTCAE, got {type(model).__name__}")
    if max_images is not None and max_images < 2:
        raise ValueError(f"max_images must be at least 2 (or None for all images), got {max_images}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    datamodule.setup()
    mean, std, class_names = datamodule.mean, datamodule.std, datamodule.class_names
    train_loader = _clean_loader(datamodule, datamodule.train_set)
    test_loader = _clean_loader(datamodule, datamodule.test_set)

    def test_batches() -> Iterator[tuple[Tensor, Tensor]]:
        return take_images(test_loader, max_images)

    clock = {"name": None, "t0": time.perf_counter()}

    def stage(name: str | None) -> None:
        """Close the running stage (its time) and open the next one."""
        if progress and clock["name"] is not None:
            print(f"generate: {clock['name']} done in {time.perf_counter() - clock['t0']:.1f} s", flush=True)
        clock["name"], clock["t0"] = name, time.perf_counter()

    generator = torch.Generator().manual_seed(seed)
    model.to(device)
    with _eval_mode(model), torch.no_grad():
        stage("encoding the training images")
        train = encode_split(
            model, take_images(train_loader, max_images), mean, std, device=device, keep=PIXEL_JUDGE_MAX_IMAGES
        )
        stage("encoding the test images")
        test = encode_split(model, test_batches(), mean, std, device=device, keep=PIXEL_JUDGE_MAX_IMAGES)
        stage("training the CNN judge")
        judge = fit_pixel_judge(train.images, train.labels[: len(train.images)], seed, device=device)
        stage("classifier and linear probe")
        classifier = model.head(test.mu_cls.to(device)).argmax(-1).cpu()
        metrics = {
            "images/train": float(len(train.labels)),
            "images/test": float(len(test.labels)),
            "classifier/accuracy": float((classifier == test.labels).float().mean()),
            "linear_probe/accuracy": linear_probe_accuracy(train, test, seed),
            "conditional/judge_test_accuracy": judge_accuracy(judge, test.images, test.labels[: len(test.images)]),
        }
        stage("reconstruction")
        metrics |= reconstruction_task(
            model, test_batches(), mean, std, out_dir / GRID_FILES["reconstruction"], device=device, judge=judge
        )
        stage("conditional generation")
        metrics |= conditional_generation_task(
            model,
            fit_class_gaussians(train.mu_cls, train.labels),
            judge,
            mean,
            std,
            out_dir / GRID_FILES["conditional"],
            device=device,
            class_names=class_names,
            generator=generator,
        )
        stage("interpolation")
        metrics |= interpolation_task(
            model,
            test,
            judge,
            mean,
            std,
            out_dir / GRID_FILES["interpolation"],
            device=device,
            class_names=class_names,
            generator=generator,
        )
        stage("inpainting")
        metrics |= inpainting_task(
            model, test_batches(), mean, std, out_dir / GRID_FILES["inpainting"], device=device, generator=generator
        )
        stage(None)
    atomic_write_json(out_dir / GENERATE_METRICS_FILE, metrics)
    return metrics

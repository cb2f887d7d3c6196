"""The pieces of ViTCAE's generative tasks (:mod:`vitlab.families.vitcae.generative`): their settings, the pure
functions (SSIM window, class Gaussians, latent sampling and interpolation, patch masks, image grids), the encoded
splits, the independent pixel judge and the linear probe."""

from __future__ import annotations

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
from torchvision.utils import make_grid

from vitlab.data import denormalize, normalize
from vitlab.families.vitcae.model import ViTCAE
from vitlab.rundir import save_figure

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
    return save_figure(figure, path, dpi=100)


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
    """The interpolation measured on its path (task 3 of :mod:`vitlab.families.vitcae.generative`, whose docstring
    gives the three numbers). ``frames: [P, T, C, H, W]`` in [0, 1] decoded from ``path_latents: [P, T, d_z]``; the
    end classes ``[P]``."""
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


def linear_probe_accuracy(train: EncodedSplit, test: EncodedSplit, seed: int = 0) -> float:
    """Spec section 2: logistic regression on standardised frozen ``mu_cls`` of the training set, test accuracy."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=SKLEARN_MAX_ITER, random_state=seed))
    probe.fit(train.mu_cls.double().numpy(), train.labels.numpy())
    return float(probe.score(test.mu_cls.double().numpy(), test.labels.numpy()))

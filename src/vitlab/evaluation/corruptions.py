"""Image corruptions at CIFAR-10-C's parameters for 32x32 images (Hendrycks & Dietterich 2019), severities 1-5.

CET-ViT v4 model card, "OOD robustness". Every corruption is a pure function of a batch
``x: [B, C, H, W]`` with values in [0, 1]; the result is clipped back to [0, 1], as CIFAR-C does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

# Severity 1..5 -> parameter, CIFAR-10-C's values (make_cifar_c.py of Hendrycks & Dietterich 2019).
SEVERITY_PARAMETERS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # noise sigma on [0, 1]
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),  # blur sigma in pixels
    "brightness_up": (0.05, 0.1, 0.15, 0.2, 0.3),  # HSV value shift
    "brightness_down": (0.05, 0.1, 0.15, 0.2, 0.3),  # HSV value shift, downward
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # contrast factor about the per-channel mean
}
# As scipy.ndimage / skimage's gaussian filter, used by CIFAR-C: the kernel reaches 4 sigma either side.
_BLUR_TRUNCATE = 4.0


def _check_images(x: torch.Tensor) -> None:
    if x.ndim != 4 or not x.dtype.is_floating_point:
        raise ValueError(f"images must be a float batch [B, C, H, W], got {list(x.shape)} of dtype {x.dtype}")
    if x.numel() and (x.min() < 0 or x.max() > 1):
        raise ValueError(
            f"images must lie in [0, 1], got [{x.min().item():.3f}, {x.max().item():.3f}]: corrupt before normalising"
        )


def add_gaussian_noise(x: torch.Tensor, sigma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``clip(x + N(0, sigma^2))``. ``x: [B, C, H, W]`` in [0, 1] -> same shape."""
    noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return (x + sigma * noise).clamp(0, 1)


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur of standard deviation ``sigma`` pixels. ``x: [B, C, H, W]`` -> same shape.

    The kernel reaches 4 sigma either side and the border repeats the edge pixels, as the
    ``scipy.ndimage.gaussian_filter(mode="nearest")`` behind CIFAR-C's skimage blur does.
    """
    if sigma < 0:
        raise ValueError(f"blur sigma must be >= 0, got {sigma}")
    radius = int(_BLUR_TRUNCATE * sigma + 0.5)
    if radius == 0:  # a one-pixel kernel: the identity
        return x
    # Replicate-pad by the kernel radius so that torchvision's own (reflect) padding never reaches the image.
    padded = F.pad(x, [radius] * 4, mode="replicate")
    blurred = TF.gaussian_blur(padded, kernel_size=[2 * radius + 1] * 2, sigma=[sigma, sigma])
    return blurred[..., radius:-radius, radius:-radius].clamp(0, 1)


def shift_brightness(x: torch.Tensor, delta: float) -> torch.Tensor:
    """Shift the HSV value ``V = max_c x_c`` by ``delta``, clipped to [0, 1], keeping hue and saturation.

    In HSV every channel is proportional to V at fixed hue and saturation, so the round trip RGB -> HSV -> RGB of
    CIFAR-C is a rescaling by ``V' / V``; a black pixel (V = 0, saturation 0) becomes grey ``V'``. For grayscale
    (C = 1) this is ``clip(x + delta)``. ``x: [B, C, H, W]`` -> same shape.
    """
    value = x.amax(dim=1, keepdim=True)
    shifted = (value + delta).clamp(0, 1)
    rescaled = x * (shifted / value.clamp(min=torch.finfo(x.dtype).tiny))
    return torch.where(value > 0, rescaled, shifted).clamp(0, 1)


def scale_contrast(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``clip((x - m) * factor + m)`` with ``m`` the per-image, per-channel mean. ``x: [B, C, H, W]``."""
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return ((x - mean) * factor + mean).clamp(0, 1)


def _severity_parameter(x: torch.Tensor, name: str, severity: int) -> float | None:
    """Validate the batch and the severity; the corruption's parameter, or None for severity 0 (clean)."""
    if isinstance(severity, bool) or not isinstance(severity, int) or not 0 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 0..5 (0 = clean), got {severity!r}")
    _check_images(x)
    return None if severity == 0 else SEVERITY_PARAMETERS[name][severity - 1]


def gaussian_noise(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """CIFAR-C gaussian noise at ``severity`` 0..5; ``generator`` (on ``x``'s device) makes it reproducible."""
    sigma = _severity_parameter(x, "gaussian_noise", severity)
    return x if sigma is None else add_gaussian_noise(x, sigma, generator)


def gaussian_blur(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """CIFAR-C gaussian blur at ``severity`` 0..5 (deterministic: ``generator`` is unused)."""
    sigma = _severity_parameter(x, "gaussian_blur", severity)
    return x if sigma is None else blur(x, sigma)


def brightness_up(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """CIFAR-C brightness at ``severity`` 0..5 (deterministic)."""
    delta = _severity_parameter(x, "brightness_up", severity)
    return x if delta is None else shift_brightness(x, delta)


def brightness_down(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The CET-ViT card's "brightness down": CIFAR-C's brightness shifts, downward, at ``severity`` 0..5."""
    delta = _severity_parameter(x, "brightness_down", severity)
    return x if delta is None else shift_brightness(x, -delta)


def contrast(x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """CIFAR-C contrast at ``severity`` 0..5 (deterministic)."""
    factor = _severity_parameter(x, "contrast", severity)
    return x if factor is None else scale_contrast(x, factor)


Corruption = Callable[..., torch.Tensor]
CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "gaussian_blur": gaussian_blur,
    "brightness_up": brightness_up,
    "brightness_down": brightness_down,
    "contrast": contrast,
}


def apply_corruption(
    x: torch.Tensor, name: str, severity: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Corrupt ``x: [B, C, H, W]`` (in [0, 1]) with corruption ``name`` at ``severity`` 0..5; 0 returns ``x``."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose one of {sorted(CORRUPTIONS)}")
    return CORRUPTIONS[name](x, severity, generator=generator)

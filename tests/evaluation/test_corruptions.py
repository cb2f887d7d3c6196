"""CIFAR-C corruptions: identities, the noise level, hand-worked contrast, and references (scipy, colorsys)."""

import colorsys

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from vitlab.evaluation.corruptions import (
    CORRUPTIONS,
    SEVERITY_PARAMETERS,
    add_gaussian_noise,
    apply_corruption,
    blur,
    scale_contrast,
    shift_brightness,
)


def images(batch: int = 2, channels: int = 3, size: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_severity_zero_returns_the_input_and_every_severity_stays_in_range(name):
    x = images()
    assert apply_corruption(x, name, 0) is x
    for severity in range(1, 6):
        corrupted = apply_corruption(x, name, severity, generator=torch.Generator().manual_seed(severity))
        assert corrupted.shape == x.shape and corrupted.min() >= 0 and corrupted.max() <= 1
        assert not torch.equal(corrupted, x)


def test_identity_parameters_return_the_input():
    x = images()
    torch.testing.assert_close(add_gaussian_noise(x, 0.0), x)
    torch.testing.assert_close(blur(x, 0.0), x)
    torch.testing.assert_close(shift_brightness(x, 0.0), x)
    torch.testing.assert_close(scale_contrast(x, 1.0), x)


@pytest.mark.parametrize("severity", [1, 5])
def test_noise_std_matches_sigma(severity):
    x = torch.full((4, 3, 32, 32), 0.5)  # 0.5 +- 5 sigma never reaches the clip bounds
    noisy = apply_corruption(x, "gaussian_noise", severity, generator=torch.Generator().manual_seed(0))
    sigma = SEVERITY_PARAMETERS["gaussian_noise"][severity - 1]
    assert (noisy - x).std().item() == pytest.approx(sigma, rel=0.03)
    assert (noisy - x).mean().abs().item() < 4 * sigma / noisy.numel() ** 0.5  # zero-mean noise


def test_noise_is_reproducible_with_a_generator():
    x = images()
    first = apply_corruption(x, "gaussian_noise", 3, generator=torch.Generator().manual_seed(7))
    second = apply_corruption(x, "gaussian_noise", 3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


def test_contrast_hand_worked():
    x = torch.tensor([0.2, 0.4, 0.6, 1.0]).reshape(1, 1, 2, 2)  # mean 0.55
    # severity 2: factor 0.5 -> (x - 0.55) * 0.5 + 0.55
    expected = torch.tensor([0.375, 0.475, 0.575, 0.775]).reshape(1, 1, 2, 2)
    torch.testing.assert_close(apply_corruption(x, "contrast", 2), expected)


def test_contrast_uses_the_mean_of_each_image_and_channel():
    x = images(batch=2, channels=3)
    out = scale_contrast(x, 0.3)
    torch.testing.assert_close(out.mean(dim=(-2, -1)), x.mean(dim=(-2, -1)))  # no clipping at factor < 1


@pytest.mark.parametrize("severity", [1, 5])
def test_blur_equals_scipy_gaussian_filter_with_nearest_border(severity):
    x = images(channels=3, size=16)
    sigma = SEVERITY_PARAMETERS["gaussian_blur"][severity - 1]
    reference = np.stack(
        [
            [gaussian_filter(channel, sigma=sigma, mode="nearest", truncate=4.0) for channel in image]
            for image in x.numpy()
        ]
    )
    np.testing.assert_allclose(apply_corruption(x, "gaussian_blur", severity).numpy(), reference, atol=1e-6)


@pytest.mark.parametrize(("name", "delta"), [("brightness_up", 0.3), ("brightness_down", -0.3)])
def test_brightness_equals_an_hsv_round_trip(name, delta):
    x = images(batch=1, channels=3, size=4)
    x[0, :, 0, 0] = 0  # a black pixel: saturation 0, becomes grey when brightened
    x[0, :, 0, 1] = torch.tensor([0.9, 0.5, 0.1])  # V + 0.3 clips at 1
    expected = torch.empty_like(x)
    for row in range(4):
        for col in range(4):
            hue, saturation, value = colorsys.rgb_to_hsv(*x[0, :, row, col].tolist())
            shifted = colorsys.hsv_to_rgb(hue, saturation, min(max(value + delta, 0.0), 1.0))
            expected[0, :, row, col] = torch.tensor(shifted)
    torch.testing.assert_close(apply_corruption(x, name, 5), expected)


def test_brightness_on_grayscale_shifts_the_value():
    x = torch.tensor([0.0, 0.5, 0.9]).reshape(1, 1, 1, 3)
    torch.testing.assert_close(
        apply_corruption(x, "brightness_up", 3), torch.tensor([0.15, 0.65, 1.0]).reshape(1, 1, 1, 3)
    )
    torch.testing.assert_close(
        apply_corruption(x, "brightness_down", 5), torch.tensor([0.0, 0.2, 0.6]).reshape(1, 1, 1, 3)
    )


def test_bad_names_severities_and_images_are_rejected():
    x = images()
    with pytest.raises(ValueError, match="unknown corruption 'snow'"):
        apply_corruption(x, "snow", 1)
    for severity in (6, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"severity must be an integer in 0\.\.5"):
            apply_corruption(x, "contrast", severity)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        apply_corruption(x * 2, "contrast", 1)
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        apply_corruption(x[0], "contrast", 1)

"""ViTCAE's generative tasks and linear probe (spec vitcae.md sections 2 and 6) and ``vitlab generate``."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import matplotlib.image
import pytest
import torch
from torch import nn
from torchmetrics.image import StructuralSimilarityIndexMeasure

import vitlab
from vitlab.cli.main import main
from vitlab.config import RunConfig, dump_yaml
from vitlab.data import DataConfig, build_datamodule
from vitlab.export import export_model
from vitlab.families.vitcae.generative import inpainting_task, run_generative_tasks
from vitlab.families.vitcae.pieces import (
    GRID_FILES,
    choose_interpolation_pairs,
    fit_class_gaussians,
    interpolate_latents,
    patch_mask_to_pixels,
    random_patch_mask,
    sample_class_latents,
    save_image_grid,
    ssim_window,
    take_images,
)

MAX_IMAGES = 60


def tiny_vitcae() -> nn.Module:
    return vitlab.create_model("vitcae_pico", num_classes=10, depth=1, decoder_depth=1)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> tuple[dict[str, float], Path, nn.Module]:
    torch.manual_seed(0)
    model = tiny_vitcae().train()
    out = tmp_path_factory.mktemp("generate")
    metrics = run_generative_tasks(model, build_datamodule(DataConfig(name="digits")), out, max_images=MAX_IMAGES)
    return metrics, out, model


# -------------------------------------------------------------------------------------------------------------------
# The whole run on digits.


def test_every_task_writes_its_grid_and_finite_numbers(digits_run):
    metrics, out, model = digits_run
    for file in GRID_FILES.values():
        picture = matplotlib.image.imread(out / file)
        assert picture.ndim == 3 and min(picture.shape[:2]) > 100, file
    assert json.loads((out / "metrics.json").read_text()) == pytest.approx(metrics)
    for task in ("reconstruction", "conditional", "interpolation", "inpainting", "linear_probe", "classifier"):
        assert any(name.startswith(f"{task}/") for name in metrics), task
    assert all(math.isfinite(value) for value in metrics.values())
    assert metrics["images/train"] == metrics["images/test"] == MAX_IMAGES
    counts = json.loads((out / "metrics.json").read_text())
    assert all(type(counts[key]) is int for key in ("images/train", "images/test", "conditional/num_classes"))
    for name in (
        "classifier/accuracy",
        "linear_probe/accuracy",
        "conditional/judge_accuracy",
        "conditional/judge_test_accuracy",
        "conditional/self_agreement",
        "conditional/latent_agreement",
        "conditional/prior_mean_judge_accuracy",
        "conditional/estimator_judge_accuracy",
        "reconstruction/judge_accuracy",
        "interpolation/path_endpoint_classes",
    ):
        assert 0.0 <= metrics[name] <= 1.0, name
    steps = 8  # INTERPOLATION_STEPS: an even morph has a largest step share of 1/7
    assert 1 / (steps - 1) - 1e-6 <= metrics["interpolation/path_max_step_share"] <= 1.0
    assert metrics["interpolation/path_latent_error"] >= 0 and metrics["conditional/prior_std_rms"] > 0
    for fill in ("prior_fill", "iterated"):
        gain = metrics[f"inpainting/{fill}_psnr"] - metrics["inpainting/mean_fill_psnr"]
        assert metrics[f"inpainting/{fill}_psnr_gain"] == pytest.approx(gain)
    assert -1.0 <= metrics["reconstruction/ssim"] <= 1.0
    assert model.training, "the model's training flag must be restored"


def test_pixel_judge_is_a_trustworthy_digit_classifier(digits_run):
    metrics, _, _ = digits_run
    assert metrics["conditional/judge_test_accuracy"] > 0.6  # 10 classes; ~0.97 with the full training set


def test_psnr_is_ten_log10_of_the_inverse_mse(digits_run):
    metrics, _, _ = digits_run
    assert metrics["reconstruction/psnr"] == pytest.approx(10 * math.log10(1 / metrics["reconstruction/mse"]), 1e-5)
    assert metrics["inpainting/psnr_gain"] == pytest.approx(
        metrics["inpainting/psnr"] - metrics["inpainting/mean_fill_psnr"]
    )


def test_same_seed_same_numbers(digits_run, tmp_path):
    metrics, _, model = digits_run
    again = run_generative_tasks(model, build_datamodule(DataConfig(name="digits")), tmp_path, max_images=MAX_IMAGES)
    assert again == pytest.approx(metrics, abs=1e-6)


def test_rejects_a_model_that_is_not_a_vitcae(tmp_path):
    vit = vitlab.create_model("vit_pico", num_classes=10)
    with pytest.raises(TypeError, match="ViTCAE"):
        run_generative_tasks(vit, build_datamodule(DataConfig(name="digits")), tmp_path)


# -------------------------------------------------------------------------------------------------------------------
# Inpainting: masks and the mean-fill baseline by hand.


def test_random_patch_mask_masks_the_requested_count_reproducibly():
    mask = random_patch_mask(5, 16, 0.25, torch.Generator().manual_seed(3))
    assert mask.dtype == torch.bool and mask.shape == (5, 16)
    assert mask.sum(1).tolist() == [4] * 5
    assert torch.equal(mask, random_patch_mask(5, 16, 0.25, torch.Generator().manual_seed(3)))
    assert not torch.equal(mask, random_patch_mask(5, 16, 0.25, torch.Generator().manual_seed(4)))
    with pytest.raises(ValueError, match="mask ratio"):
        random_patch_mask(1, 16, 1.0)


def test_patch_mask_to_pixels_hand_case():
    mask = torch.tensor([[True, False, False, True]])  # 2x2 grid of 2x2 patches
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(patch_mask_to_pixels(mask, (2, 2), 2), expected.view(1, 1, 4, 4))


class FixedOutput(nn.Module):
    """An 'autoencoder' on a 2x2 grid of 1x1 patches whose output is fixed, whatever it reads."""

    grid_size, patch_size, num_patches = (2, 2), 1, 4

    def __init__(self, recon: torch.Tensor) -> None:
        super().__init__()
        self.recon = recon

    def forward(self, x: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(recon=self.recon)


def test_inpainting_psnr_and_mean_fill_baseline_by_hand(tmp_path):
    mean, std = (0.25,), (0.5,)
    images = torch.stack([torch.full((1, 2, 2), 0.75), torch.zeros(1, 2, 2)])  # in [0, 1]
    x = (images - 0.25) / 0.5
    # Output 0.1 off everywhere: squared error 0.01 on the masked pixels -> 20 dB.
    recon = ((images + torch.tensor([-0.1, 0.1]).view(2, 1, 1, 1)) - 0.25) / 0.5
    metrics = inpainting_task(
        FixedOutput(recon),
        [(x, torch.tensor([0, 1]))],
        mean,
        std,
        tmp_path / "grid.png",
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        mask_ratio=0.5,
    )
    # Mean fill puts 0.25 on the two masked pixels of each image: errors 0.5^2 and 0.25^2, equal pixel counts.
    # (Counting the unmasked pixels too, whose mean-fill error is 0, would halve the MSE.)
    assert metrics["inpainting/mean_fill_psnr"] == pytest.approx(10 * math.log10(1 / ((0.25 + 0.0625) / 2)), 1e-5)
    assert metrics["inpainting/psnr"] == pytest.approx(20.0, 1e-4)
    assert (tmp_path / "grid.png").exists()


def test_prior_fill_keeps_the_known_pixels_and_decodes_the_prior_mean_in_the_masked_patches():
    from vitlab.families.vitcae.pieces import prior_fill

    torch.manual_seed(0)
    model = tiny_vitcae().eval()
    x = torch.randn(2, 1, 8, 8)
    patch_mask = random_patch_mask(2, model.num_patches, 0.5, torch.Generator().manual_seed(0))
    pixel_mask = patch_mask_to_pixels(patch_mask, model.grid_size, model.patch_size)
    filled = prior_fill(model, x, patch_mask, pixel_mask)
    assert torch.equal(filled[~pixel_mask.expand_as(x)], x[~pixel_mask.expand_as(x)])
    post = model.encode(x)
    prior_mu, _ = model.prior(post.mu_cls)
    expected = model.decode(post.mu_cls, torch.where(patch_mask.unsqueeze(-1), prior_mu, post.mu_pt))
    torch.testing.assert_close(filled[pixel_mask.expand_as(x)], expected[pixel_mask.expand_as(x)])


def test_path_measures_by_hand():
    from vitlab.families.vitcae.pieces import path_measures

    class Identity(nn.Module):  # encodes an image to its first two pixels, so the latent path is checkable
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def encode(self, x):
            return SimpleNamespace(mu_cls=x.flatten(1)[:, :2])

    class Judge:
        def predict(self, images):
            return (images.flatten(1)[:, 0] > 0.5).long()

    t = torch.linspace(0, 1, 5)
    latents = torch.stack([t, torch.zeros(5)], dim=1).unsqueeze(0)  # [1, 5, 2], a line of length 1
    frames = torch.zeros(1, 5, 1, 1, 2)
    frames[0, :, 0, 0, 0] = t  # decoded exactly on the line, in even steps
    out = path_measures(Identity(), frames, latents, Judge(), torch.tensor([0]), torch.tensor([1]), (0.0,), (1.0,))
    assert out["interpolation/path_latent_error"] == pytest.approx(0.0)
    assert out["interpolation/path_endpoint_classes"] == 1.0
    assert out["interpolation/path_max_step_share"] == pytest.approx(0.25)
    frames[0, 1:, 0, 0, 0] = 1.0  # one jump after the first frame
    out = path_measures(Identity(), frames, latents, Judge(), torch.tensor([0]), torch.tensor([1]), (0.0,), (1.0,))
    assert out["interpolation/path_max_step_share"] == pytest.approx(1.0)
    assert out["interpolation/path_latent_error"] > 0


# -------------------------------------------------------------------------------------------------------------------
# Class-conditional sampling, interpolation, SSIM window, batching.


def test_class_gaussians_are_fitted_and_sampled_per_class():
    g = torch.Generator().manual_seed(0)
    means = torch.tensor([[0.0, 0.0, 0.0], [5.0, -3.0, 1.0], [-4.0, 2.0, 8.0]])
    scales = torch.tensor([[1.0, 0.5, 2.0], [0.3, 1.0, 1.0], [2.0, 2.0, 0.5]])
    labels = torch.arange(3).repeat_interleave(400)
    latents = means[labels] + scales[labels] * torch.randn(1200, 3, generator=g)
    latents = torch.cat([latents, torch.ones(1, 3)])  # a lone class-7 latent: no spread to fit, left out
    labels = torch.cat([labels, torch.tensor([7])])
    gaussians = fit_class_gaussians(latents, labels)
    assert gaussians.classes.tolist() == [0, 1, 2]
    for k in range(3):
        assert torch.allclose(gaussians.means[k], latents[:1200][labels[:1200] == k].mean(0), atol=1e-5)
        assert torch.allclose(gaussians.covariances[k].diagonal(), scales[k] ** 2, rtol=0.25)

    samples, sample_labels = sample_class_latents(gaussians, 4000, g)
    assert samples.shape == (12000, 3) and sample_labels.tolist() == [0] * 4000 + [1] * 4000 + [2] * 4000
    for k in range(3):
        drawn = samples[sample_labels == k]
        standard_error = gaussians.covariances[k].diagonal().sqrt() / math.sqrt(4000)
        assert ((drawn.mean(0) - gaussians.means[k]).abs() < 4 * standard_error).all()
        assert torch.allclose(drawn.T.cov(), gaussians.covariances[k], atol=0.15 * scales[k].max() ** 2)


def test_interpolation_runs_straight_between_the_end_points():
    start, end = torch.tensor([[0.0, 2.0]]), torch.tensor([[4.0, -2.0]])
    line = interpolate_latents(start, end, 5)
    assert line.shape == (1, 5, 2)
    assert torch.equal(line[0, 0], start[0]) and torch.equal(line[0, -1], end[0])
    assert torch.allclose(line[0, 2], torch.tensor([2.0, 0.0]))
    with pytest.raises(ValueError, match="at least 2 steps"):
        interpolate_latents(start, end, 1)


def test_interpolation_pairs_join_different_classes():
    labels = torch.tensor([0, 0, 1, 2, 2, 1, 0])
    start, end = choose_interpolation_pairs(labels, 50, torch.Generator().manual_seed(0))
    assert (labels[start] != labels[end]).all()
    with pytest.raises(ValueError, match="two classes"):
        choose_interpolation_pairs(torch.zeros(5, dtype=torch.long), 3)


def test_ssim_window_fits_tiny_images():
    assert ssim_window(32, 32) == {"gaussian_kernel": True, "sigma": 1.5}
    window = ssim_window(8, 8)
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    ssim = StructuralSimilarityIndexMeasure(data_range=1.0, **window)
    assert ssim(x, x).item() == pytest.approx(1.0, abs=1e-5)
    assert ssim(x, 1 - x).item() < 0.5
    with pytest.raises(ValueError, match="3x3"):
        ssim_window(2, 8)


def test_image_grid_upscales_every_pixel_to_a_clean_block(tmp_path):
    images = torch.rand(2, 3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    picture = matplotlib.image.imread(save_image_grid(images, tmp_path / "grid.png"))[..., 0]
    assert picture.shape == (2 * 84 + 4, 3 * 84 + 4)  # 80-pixel tiles (8 x 10), 4-pixel gutters
    block = torch.ones(10, 10)
    tile = torch.from_numpy(picture[4 + 84 : 4 + 84 + 80, 4 + 2 * 84 : 4 + 2 * 84 + 80].copy())  # row 1, column 2
    assert torch.allclose(tile, torch.kron(images[1, 2, 0], block), atol=1 / 255)
    with pytest.raises(ValueError, match="row labels"):
        save_image_grid(images, tmp_path / "bad.png", row_labels=["only one"])


def test_take_images_stops_at_the_limit():
    batches = [(torch.zeros(4, 1, 2, 2), torch.arange(4)) for _ in range(3)]
    assert [len(y) for _, y in take_images(batches, 6)] == [4, 2]
    assert [len(y) for _, y in take_images(batches, None)] == [4, 4, 4]


# -------------------------------------------------------------------------------------------------------------------
# The command.


def make_run_dir(root: Path, model_name: str) -> Path:
    run_dir = root / "run"
    model = vitlab.create_model(model_name, num_classes=10)
    export_model(model, run_dir / "export", {"data": {"dataset": "digits", "num_classes": 10}})
    cfg = RunConfig(model={"name": model_name}, data=DataConfig(name="digits"))
    (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir


def test_cli_generate_on_a_run_directory(tmp_path, capsys):
    run_dir = make_run_dir(tmp_path, "vitcae_pico")
    assert main(["generate", str(run_dir), "--max-images", "40", "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    out = run_dir / "generate"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["images/test"] == 40
    assert "reconstruction/psnr" in printed and "linear_probe/accuracy" in printed
    for file in GRID_FILES.values():
        assert (out / file).exists() and str(out / file) in printed


def test_cli_generate_names_the_problem(tmp_path, capsys):
    run_dir = make_run_dir(tmp_path, "vit_pico")
    assert main(["generate", str(run_dir)]) == 2
    assert "needs a ViTCAE run" in capsys.readouterr().err
    (run_dir / "export" / "config.json").unlink()
    assert main(["generate", str(run_dir)]) == 2
    assert "vitlab export" in capsys.readouterr().err

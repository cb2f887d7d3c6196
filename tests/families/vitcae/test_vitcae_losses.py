"""ViTCAE losses (eq. 23-25): closed-form KLs, IMQ-MMD, the KL -> MMD curriculum, gradients reach every parameter."""

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from vitlab.families.vitcae.losses import (
    ViTCAELossConfig,
    conditional_prior_variance,
    imq_mmd,
    kl_gaussians,
    kl_standard_normal,
    patch_estimator_loss,
    reconstruction_loss,
    vitcae_loss,
)
from vitlab.families.vitcae.model import ViTCAE, ViTCAEOutput

SCALES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def test_kl_standard_normal_matches_torch_distributions():
    torch.manual_seed(0)
    mu, logvar = torch.randn(4, 6), torch.randn(4, 6)
    reference = kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(0.0, 1.0)).sum(1).mean()
    torch.testing.assert_close(kl_standard_normal(mu, logvar), reference)


def test_kl_gaussians_matches_torch_distributions_summed_over_tokens_and_dims():
    torch.manual_seed(0)
    mu_q, logvar_q, mu_p, logvar_p = torch.randn(4, 3, 5, 4).unbind(-1)
    q, p = Normal(mu_q, (0.5 * logvar_q).exp()), Normal(mu_p, (0.5 * logvar_p).exp())
    reference = kl_divergence(q, p).sum((1, 2)).mean()
    torch.testing.assert_close(kl_gaussians(mu_q, logvar_q, mu_p, logvar_p), reference)


def test_kl_of_identical_gaussians_is_zero():
    mu, logvar = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(kl_gaussians(mu, logvar, mu, logvar), torch.tensor(0.0))


def test_imq_mmd_matches_a_double_loop():
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.randn(4, 3) + 0.5

    def k(a, b):
        return sum(2 * 3 * s / (2 * 3 * s + float(((a - b) ** 2).sum())) for s in SCALES)

    n, m = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(n) for j in range(m)) / (n * m)
    torch.testing.assert_close(imq_mmd(x, y, SCALES), torch.tensor(xx + yy - 2 * xy), rtol=1e-5, atol=1e-5)


def test_imq_mmd_flattens_tokens_into_one_sample_per_image():
    x, y = torch.randn(6, 4, 3), torch.randn(5, 4, 3)
    torch.testing.assert_close(imq_mmd(x, y), imq_mmd(x.flatten(1), y.flatten(1)))


def test_imq_mmd_is_unbiased_for_equal_distributions_and_positive_for_shifted_ones():
    gen = torch.Generator().manual_seed(0)
    same = torch.stack(
        [imq_mmd(torch.randn(32, 4, generator=gen), torch.randn(32, 4, generator=gen)) for _ in range(40)]
    )
    shifted = torch.stack(
        [imq_mmd(torch.randn(32, 4, generator=gen), torch.randn(32, 4, generator=gen) + 1.0) for _ in range(40)]
    )
    assert (same < 0).any(), "an unbiased estimate scatters around 0 for equal distributions"
    assert same.mean().abs() < 3 * same.std() / 40**0.5 + 1e-3
    assert shifted.min() > same.max()
    assert shifted.mean() > 20 * same.mean().abs()


def test_imq_mmd_names_its_input_problems():
    with pytest.raises(ValueError, match="at least 2 samples"):
        imq_mmd(torch.randn(1, 3), torch.randn(4, 3))
    with pytest.raises(ValueError, match="different dimensions"):
        imq_mmd(torch.randn(4, 3), torch.randn(4, 2))


def test_reconstruction_and_estimator_losses_by_hand():
    x = torch.zeros(1, 1, 2, 2)
    x_rec = torch.tensor([[[[1.0, -1.0], [2.0, 0.0]]]])
    # mean |.| = 4/4 = 1, mean (.)^2 = 6/4 = 1.5
    torch.testing.assert_close(reconstruction_loss(x, x_rec, 2.0, 3.0), torch.tensor(2.0 * 1.0 + 3.0 * 1.5))
    torch.testing.assert_close(
        patch_estimator_loss(torch.zeros(2, 3, 4), torch.full((2, 3, 4), 2.0)), torch.tensor(4.0)
    )
    with pytest.raises(ValueError, match="does not match the input shape"):
        reconstruction_loss(x, torch.zeros(1, 1, 2, 3), 1.0, 1.0)


def fake_output(batch: int = 6, tokens: int = 4, d_z: int = 3, d_p: int = 2) -> ViTCAEOutput:
    """A ViTCAEOutput of random leaf tensors, so the loss is checked without a model."""
    gen = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    return ViTCAEOutput(
        recon=leaf(batch, 1, 4, 4),
        logits=leaf(batch, 5),
        z_cls=leaf(batch, d_z),
        mu_cls=leaf(batch, d_z),
        logvar_cls=leaf(batch, d_z),
        z_pt=leaf(batch, tokens, d_p),
        mu_pt=leaf(batch, tokens, d_p),
        logvar_pt=leaf(batch, tokens, d_p),
        prior_mu_pt=leaf(batch, tokens, d_p),
        prior_logvar_pt=leaf(batch, tokens, d_p),
        pt_estimate=leaf(batch, tokens, d_p),
    )


def test_curriculum_uses_kl_only_up_to_the_warmup_epoch_and_the_blend_after():
    cfg = ViTCAELossConfig(lambda_cls=0.3, lambda_pt_reg=0.2, lambda_ce=0.5, warmup_epochs=3, mmd_mix=0.8)
    out, x, y = fake_output(), torch.randn(6, 1, 4, 4), torch.randint(0, 5, (6,))

    warm = vitcae_loss(out, x, y, epoch=3, cfg=cfg)
    base = warm["rec"] + warm["pt_est"] + 0.5 * warm["ce"]
    torch.testing.assert_close(warm["loss"], base + 0.3 * warm["kl_cls"] + 0.2 * warm["kl_pt"])
    assert not warm["mmd_cls"].requires_grad and not warm["mmd_pt"].requires_grad

    blend = vitcae_loss(out, x, y, epoch=4, cfg=cfg)
    reg_cls = 0.8 * blend["mmd_cls"] + 0.2 * blend["kl_cls"]
    reg_pt = 0.8 * blend["mmd_pt"] + 0.2 * blend["kl_pt"]
    torch.testing.assert_close(blend["loss"], base + 0.3 * reg_cls + 0.2 * reg_pt)
    assert blend["mmd_cls"].requires_grad and blend["mmd_pt"].requires_grad


def test_every_term_is_returned_and_weighted_as_documented():
    cfg = ViTCAELossConfig(lambda_l1=2.0, lambda_l2=3.0, lambda_pt=4.0)
    out, x, y = fake_output(), torch.randn(6, 1, 4, 4), torch.randint(0, 5, (6,))
    terms = vitcae_loss(out, x, y, epoch=1, cfg=cfg)
    expected_keys = {"loss", "monitor", "rec", "rec_l1", "rec_l2", "pt_est", "kl_cls", "kl_pt", "mmd_cls", "mmd_pt"}
    expected_keys |= {"ce", "mmd_share_cls", "mmd_share_pt"}
    assert terms.keys() == expected_keys
    torch.testing.assert_close(terms["rec"], 2.0 * terms["rec_l1"] + 3.0 * terms["rec_l2"])
    torch.testing.assert_close(terms["pt_est"], 4.0 * patch_estimator_loss(out.mu_pt, out.pt_estimate))
    torch.testing.assert_close(terms["ce"], torch.nn.functional.cross_entropy(out.logits, y))


@pytest.mark.parametrize("detach", [False, True])
def test_mmd_detach_prior_decides_whether_w_pt_trains_the_prior(detach):
    cfg = ViTCAELossConfig(warmup_epochs=0, mmd_mix=1.0, mmd_detach_prior=detach)
    out = fake_output()
    vitcae_loss(out, torch.randn(6, 1, 4, 4), torch.randint(0, 5, (6,)), epoch=1, cfg=cfg)["loss"].backward()
    prior_grad = out.prior_mu_pt.grad.abs().sum()
    assert (prior_grad == 0) if detach else (prior_grad > 0)


def test_every_parameter_receives_a_gradient_once_mmd_is_live():
    torch.manual_seed(0)
    model = ViTCAE(
        img_size=8,
        patch_size=4,
        in_chans=1,
        num_classes=3,
        embed_dim=8,
        depth=2,
        num_heads=2,
        mlp_ratio=1.0,
        latent_dim=4,
        patch_latent_dim=2,
        decoder_dim=8,
        decoder_depth=1,
        decoder_heads=2,
    ).train()
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    cfg = ViTCAELossConfig(warmup_epochs=1)
    terms = vitcae_loss(model(x), x, y, epoch=2, cfg=cfg)
    terms["loss"].backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"parameters without gradient: {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(mmd_mix=1.5), "mmd_mix"),
        (dict(lambda_cls=-1.0), "lambda_cls"),
        (dict(mmd_scales=[]), "mmd_scales"),
        (dict(mmd_kernel_scale="data"), "mmd_kernel_scale"),
        (dict(mmd_calibration="auto"), "mmd_calibration"),
        (dict(monitor="val"), "monitor"),
    ],
)
def test_bad_loss_configuration_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        ViTCAELossConfig(**overrides)


def test_scales_from_yaml_lists_become_a_tuple():
    assert ViTCAELossConfig(mmd_scales=[1, 2]).mmd_scales == (1.0, 2.0)


def test_imq_kernel_scale_follows_the_prior_variance_by_hand():
    # two samples a side in 2 dimensions, one scale s = 0.5, prior variance 0.25: C = 2 * 2 * 0.5 * 0.25 = 0.5
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    # |x0-x1|^2 = 1, |y0-y1|^2 = 1, cross: (0,0)-(0,1) 1, (0,0)-(0,2) 4, (1,0)-(0,1) 2, (1,0)-(0,2) 5
    within = 0.5 / 1.5  # each within-set pair, k = C / (C + 1); both sets have one pair (counted twice over n(n-1))
    cross = (0.5 / 1.5 + 0.5 / 4.5 + 0.5 / 2.5 + 0.5 / 5.5) / 4
    expected = within + within - 2 * cross
    torch.testing.assert_close(imq_mmd(x, y, (0.5,), variance=0.25), torch.tensor(expected))
    # WAE as printed (variance 1): C = 2
    as_printed = 2 * (2 / 3) - 2 * (2 / 3 + 2 / 6 + 2 / 4 + 2 / 7) / 4
    torch.testing.assert_close(imq_mmd(x, y, (0.5,)), torch.tensor(as_printed))


def test_conditional_prior_variance_is_the_pooled_variance_of_its_samples():
    mu = torch.tensor([[[0.0, 2.0]], [[2.0, 0.0]]])  # [B=2, N=1, d=2]: batch variance 1 in each dimension
    logvar = torch.log(torch.full((2, 1, 2), 0.25))
    torch.testing.assert_close(conditional_prior_variance(mu, logvar), torch.tensor(1.25))
    gen = torch.Generator().manual_seed(0)
    mu, logvar = torch.randn(4000, 3, 2, generator=gen) * 0.3, torch.full((4000, 3, 2), -2.0)
    samples = mu + (0.5 * logvar).exp() * torch.randn(mu.shape, generator=gen)
    torch.testing.assert_close(conditional_prior_variance(mu, logvar), samples.var(0).mean(), rtol=0.05, atol=0)


def test_monitored_loss_has_no_step_at_the_switch_while_the_objective_does():
    cfg = ViTCAELossConfig(lambda_cls=0.3, lambda_pt_reg=0.2, warmup_epochs=3)
    out, x, y = fake_output(), torch.randn(6, 1, 4, 4), torch.randint(0, 5, (6,))
    torch.manual_seed(0)
    before = vitcae_loss(out, x, y, epoch=3, cfg=cfg)
    torch.manual_seed(0)
    after = vitcae_loss(out, x, y, epoch=4, cfg=cfg)
    assert torch.equal(before["monitor"], after["monitor"])  # same network, same batch: the same number
    assert (before["loss"] - after["loss"]).abs() > 1e-3 * before["loss"].abs()  # eq. 25 itself steps
    torch.testing.assert_close(after["monitor"], after["rec"] + after["pt_est"] + cfg.lambda_ce * after["ce"])


def test_calibrated_blend_keeps_the_magnitude_and_gives_the_mmd_most_of_it():
    cfg = ViTCAELossConfig(lambda_cls=1.0, lambda_pt_reg=1.0, warmup_epochs=0, mmd_mix=0.8)
    out, x, y = fake_output(), torch.randn(6, 1, 4, 4), torch.randint(0, 5, (6,))
    torch.manual_seed(0)
    plain = vitcae_loss(out, x, y, epoch=1, cfg=cfg)
    scale = tuple(float((plain[f"kl_{n}"] / plain[f"mmd_{n}"].abs()).detach()) for n in ("cls", "pt"))
    torch.manual_seed(0)
    calibrated = vitcae_loss(out, x, y, epoch=1, cfg=cfg, mmd_scale=scale)
    assert plain["mmd_share_cls"] < 0.5  # as printed, the KL dominates the blend
    torch.testing.assert_close(calibrated["mmd_share_cls"], torch.tensor(0.8))
    torch.testing.assert_close(calibrated["mmd_share_pt"], torch.tensor(0.8))


def test_calibration_scale_is_the_kl_to_mmd_ratio_capped():
    from vitlab.families.vitcae.task import calibration_scale

    assert calibration_scale(torch.tensor([34.5, 1.3, 91.7, 0.023]), 100.0) == pytest.approx((34.5 / 1.3, 100.0))
    assert calibration_scale(torch.tensor([10.0, -0.01, 10.0, 0.0]), 50.0) == (50.0, 50.0)  # an MMD estimate <= 0

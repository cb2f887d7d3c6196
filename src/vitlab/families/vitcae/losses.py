"""The ViTCAE objective (ViTCAE paper, eq. 23-25; decisions in docs/vitcae.md) as pure functions of tensors.

Reductions, chosen once for every term:

- reconstruction and patch-estimator errors are means over all elements (pixels, latent entries), so they do not
  grow with the image or latent size;
- the KL divergences are summed over every latent entry of a sample (dimensions, and tokens for ``z_pt``) and
  averaged over the batch, the usual per-sample ELBO scale;
- the MMD terms are unbiased estimates of the squared MMD between two sets of samples.

Names of the weights against the paper: ``lambda_pt`` is the paper's ``lambda_PT`` (the patch estimator loss
``L_PT``, eq. 23) and ``lambda_pt_reg`` is the paper's ``lambda_pt`` (the weight of the patch-latent regulariser
``KL_pt`` / ``W_pt``, eq. 25); the paper tells them apart only by upper/lower case. The paper reuses ``alpha`` for
the KL/MMD blend of eq. 25 and for the temperature schedule of eq. 20; the blend is ``mmd_mix`` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vitlab.families.vitcae.config import WAE_IMQ_SCALES, ViTCAELossConfig

if TYPE_CHECKING:  # losses sit below models: the model's output type only annotates
    from vitlab.families.vitcae.model import ViTCAEOutput


def conditional_prior_variance(prior_mu: torch.Tensor, prior_logvar: torch.Tensor) -> torch.Tensor:
    """Per-dimension variance of samples of ``p(z_pt | z_cls)`` pooled over a batch, ``[B, ...] -> []``, detached:
    the mean of ``sigma_hat^2`` plus the mean over dimensions of the batch variance of ``mu_hat`` (the law of total
    variance over the batch's mixture of Gaussians)."""
    prior_mu, prior_logvar = prior_mu.detach().flatten(1), prior_logvar.detach().flatten(1)
    return prior_logvar.exp().mean() + prior_mu.var(0, unbiased=False).mean()


def reparameterize(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """A differentiable sample of ``N(mu, diag exp(logvar))``: ``mu + exp(logvar / 2) * eps``, any shape."""
    return mu + (0.5 * logvar).exp() * torch.randn_like(mu)


def reconstruction_loss(x: torch.Tensor, x_rec: torch.Tensor, lambda_l1: float, lambda_l2: float) -> torch.Tensor:
    """Eq. 23: ``L_rec = lambda_L1 * mean|x - x'| + lambda_L2 * mean (x - x')^2``; ``x, x_rec: [B, C, H, W]``."""
    if x.shape != x_rec.shape:
        raise ValueError(f"reconstruction shape {list(x_rec.shape)} does not match the input shape {list(x.shape)}")
    return lambda_l1 * F.l1_loss(x_rec, x) + lambda_l2 * F.mse_loss(x_rec, x)


def patch_estimator_loss(mu_pt: torch.Tensor, pt_estimate: torch.Tensor) -> torch.Tensor:
    """Eq. 23, unweighted ``L_PT``: mean squared error between ``mu_pt`` and ``g(z_cls)``, both ``[B, N, d_p]``.

    Not detached on either side: the estimator learns to predict the patch latents from ``z_cls`` and the encoder
    is pulled towards patch latents that ``z_cls`` explains.
    """
    return F.mse_loss(pt_estimate, mu_pt)


def kl_standard_normal(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Eq. 24, ``KL_cls = KL(N(mu, diag exp(logvar)) || N(0, I))`` in closed form.

    ``mu, logvar: [B, ...]``; summed over all non-batch axes, averaged over the batch -> scalar.
    """
    kl = 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar)
    return kl.flatten(1).sum(1).mean()


def kl_gaussians(
    mu_q: torch.Tensor, logvar_q: torch.Tensor, mu_p: torch.Tensor, logvar_p: torch.Tensor
) -> torch.Tensor:
    """Eq. 24, ``KL_pt = KL(N(mu_q, diag exp(logvar_q)) || N(mu_p, diag exp(logvar_p)))`` in closed form.

    All inputs ``[B, ...]`` (for patch latents ``[B, N, d_p]``); summed over all non-batch axes (tokens and
    latent dimensions), averaged over the batch -> scalar.
    """
    kl = 0.5 * (logvar_p - logvar_q + (logvar_q.exp() + (mu_q - mu_p).pow(2)) / logvar_p.exp() - 1.0)
    return kl.flatten(1).sum(1).mean()


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[n, D], [m, D] -> [n, m]``; via the norm expansion, which has a smooth gradient at zero distance."""
    return (a.pow(2).sum(1, keepdim=True) + b.pow(2).sum(1) - 2.0 * a @ b.T).clamp_min(0.0)


def imq_mmd(
    x: torch.Tensor,
    y: torch.Tensor,
    scales: tuple[float, ...] = WAE_IMQ_SCALES,
    variance: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Unbiased squared MMD with the inverse multiquadratic kernel (Tolstikhin et al. 2018, WAE-MMD).

    ``k(a, b) = sum_s C_s / (C_s + |a - b|^2)`` with ``C_s = 2 * dim * s * variance``; the ``W_cls`` / ``W_pt``
    surrogates of eq. 25. WAE's ``C = 2 * dim * s`` is the expected squared distance ``2 * dim * sigma^2`` between
    two samples of a ``N(0, sigma^2 I)`` prior with ``sigma = 1``, times ``s``; ``variance`` is that prior's
    per-dimension ``sigma^2`` (1: WAE as printed), so the kernel's scales stay at the prior's own distances.
    ``x: [n, ...]`` and ``y: [m, ...]`` are sets of samples along the first axis; the remaining axes are
    flattened into one vector per sample, so a patch-latent batch ``[B, N, d_p]`` is compared as ``B`` samples of
    dimension ``N * d_p`` (the joint distribution of a whole patch matrix, positions included, rather than the
    pooled marginal of single tokens). The unbiased estimate leaves out the ``i = j`` pairs of the within-set
    sums and so can be slightly negative; its expectation is 0 exactly when the distributions agree.
    """
    x, y = x.flatten(1), y.flatten(1)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"imq_mmd: samples have different dimensions, {x.shape[1]} and {y.shape[1]}")
    n, m = x.shape[0], y.shape[0]
    if n < 2 or m < 2:
        raise ValueError(
            f"imq_mmd needs at least 2 samples on each side for the unbiased estimate, got {n} and {m}; "
            "use batches of 2 or more (e.g. DataLoader(drop_last=True))"
        )
    # C_s = 2 d s sigma^2 per scale s, summed over the scales one by one: a tensor of the scales made on the device
    # would copy them from the host each call, a synchronising copy on CUDA
    base = 2.0 * x.shape[1] * variance

    def kernel_sum(d2: torch.Tensor) -> torch.Tensor:
        return sum(base * s / (base * s + d2) for s in scales)

    k_xx = kernel_sum(_squared_distances(x, x))
    k_yy = kernel_sum(_squared_distances(y, y))
    k_xy = kernel_sum(_squared_distances(x, y))
    within_x = (k_xx.sum() - k_xx.diagonal().sum()) / (n * (n - 1))
    within_y = (k_yy.sum() - k_yy.diagonal().sum()) / (m * (m - 1))
    return within_x + within_y - 2.0 * k_xy.mean()


def vitcae_loss(
    out: ViTCAEOutput,
    x: torch.Tensor,
    y: torch.Tensor,
    epoch: int,
    cfg: ViTCAELossConfig,
    mmd_scale: tuple[float, float] = (1.0, 1.0),
) -> dict[str, torch.Tensor]:
    """The total objective of eq. 25 with every term, for logging.

    ``out``: the model's forward output on ``x: [B, C, H, W]`` (in the space the model reconstructs); ``y: [B]``
    class labels; ``epoch``: the 1-based training epoch ``t``, and ``t <= T_w`` (``cfg.warmup_epochs``) uses KL only
    (the MMD terms are then computed without gradient, for logging). ``mmd_scale``: the constants ``(s_cls, s_pt)``
    that multiply ``W_cls`` and ``W_pt`` in the blend (``mmd_calibration: kl``; the task measures them at the
    switch); ``(1, 1)``: eq. 25 as printed.

    Returns ``{"loss", "monitor", "rec", "rec_l1", "rec_l2", "pt_est", "kl_cls", "kl_pt", "mmd_cls", "mmd_pt",
    "mmd_share_cls", "mmd_share_pt", "ce"}``, scalars. ``rec`` and ``pt_est`` include their weights; the
    regularisers and ``ce`` are unweighted (``mmd_*`` before ``mmd_scale``). ``monitor`` is ``rec + pt_est +
    lambda_ce ce``, the same function before and after the switch. ``mmd_share_*`` is the MMD's part of the blend,
    ``a s |W| / (a s |W| + (1 - a) KL)``, in both phases (detached).
    """
    terms = {
        "rec_l1": F.l1_loss(out.recon, x),
        "rec_l2": F.mse_loss(out.recon, x),
        "rec": reconstruction_loss(x, out.recon, cfg.lambda_l1, cfg.lambda_l2),
        "pt_est": cfg.lambda_pt * patch_estimator_loss(out.mu_pt, out.pt_estimate),
        "kl_cls": kl_standard_normal(out.mu_cls, out.logvar_cls),
        "kl_pt": kl_gaussians(out.mu_pt, out.logvar_pt, out.prior_mu_pt, out.prior_logvar_pt),
        "ce": F.cross_entropy(out.logits, y),
    }
    mmd_active = epoch > cfg.warmup_epochs
    with torch.set_grad_enabled(mmd_active and torch.is_grad_enabled()):
        terms["mmd_cls"], terms["mmd_pt"] = _mmd_terms(out, cfg)
    reg_cls, reg_pt = _regularisers(terms, cfg.mmd_mix, mmd_scale, mmd_active)
    terms["loss"] = (
        terms["rec"]
        + cfg.lambda_cls * reg_cls
        + cfg.lambda_pt_reg * reg_pt
        + terms["pt_est"]
        + cfg.lambda_ce * terms["ce"]
    )
    terms["monitor"] = terms["rec"] + terms["pt_est"] + cfg.lambda_ce * terms["ce"]
    return terms


def _regularisers(
    terms: dict[str, torch.Tensor], a: float, mmd_scale: tuple[float, float], mmd_active: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 25's regularisers of ``z_cls`` and ``z_pt``: the blend ``a s W + (1 - a) KL`` once the MMD is active, KL
    alone before; ``terms`` gains ``mmd_share_cls`` and ``mmd_share_pt``, the MMD's part of the blend (detached)."""
    for name, scale in zip(("cls", "pt"), mmd_scale, strict=True):
        mmd_part = a * scale * terms[f"mmd_{name}"].detach().abs()
        terms[f"mmd_share_{name}"] = mmd_part / (mmd_part + (1.0 - a) * terms[f"kl_{name}"].detach()).clamp_min(1e-12)
    if not mmd_active:
        return terms["kl_cls"], terms["kl_pt"]
    reg_cls = a * mmd_scale[0] * terms["mmd_cls"] + (1.0 - a) * terms["kl_cls"]
    return reg_cls, a * mmd_scale[1] * terms["mmd_pt"] + (1.0 - a) * terms["kl_pt"]


def _mmd_terms(out: ViTCAEOutput, cfg: ViTCAELossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 25's ``W_cls``, ``z_cls`` against samples of ``N(0, I)``, and ``W_pt``, ``z_pt`` against reparameterised
    samples of the conditional prior ``N(mu_hat_pt, diag sigma_hat_pt^2)`` (``ViTCAELossConfig.mmd_detach_prior``)."""
    prior_mu, prior_logvar = out.prior_mu_pt, out.prior_logvar_pt
    if cfg.mmd_detach_prior:
        prior_mu, prior_logvar = prior_mu.detach(), prior_logvar.detach()
    variance_pt = 1.0
    if cfg.mmd_kernel_scale == "prior":  # p(z_cls) = N(0, I) has variance 1 exactly
        variance_pt = conditional_prior_variance(out.prior_mu_pt, out.prior_logvar_pt)
    mmd_cls = imq_mmd(out.z_cls, torch.randn_like(out.z_cls), cfg.mmd_scales)
    return mmd_cls, imq_mmd(out.z_pt, reparameterize(prior_mu, prior_logvar), cfg.mmd_scales, variance_pt)

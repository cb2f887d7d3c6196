"""The ViTCAE family's config sections ``model`` and ``loss`` (eq. 23-25), plain data: ``vitlab.config.build_config``
checks them before anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from vitlab.config.model import ViTEncoderOptions

WAE_IMQ_SCALES: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
MMD_KERNEL_SCALES = ("prior", "unit")
MMD_CALIBRATIONS = ("kl", "none")
MONITORS = ("continuous", "objective")


@dataclass(frozen=True, kw_only=True)
class ViTCAEOptions(ViTEncoderOptions):
    """Options of :class:`vitlab.families.vitcae.model.ViTCAE` (ViTCAE, Sec. III): the encoder's (a ViT's: width D,
    blocks L, heads, FFN ratio, QKV bias; ``temperature``, the learnable per-head tau of eq. 19, on by default;
    ``temperature_form`` ``inverse``, logits * tau, or ``divide``, eq. 19 as printed), the latents' (``latent_dim``
    ``d_z`` of ``z_cls``, ``patch_latent_dim`` ``d_p`` of each patch latent) and the decoder's (width, blocks,
    heads, ``num_cond_tokens`` ``M`` conditioning tokens made from ``z_cls`` for its cross-attention). The dropout
    rates serve encoder and decoder alike; ``num_classes`` classes of the linear classifier on ``mu_cls``."""

    temperature: bool = True
    latent_dim: int = 64
    patch_latent_dim: int = 16
    decoder_dim: int = 192
    decoder_depth: int = 4
    decoder_heads: int = 3
    num_cond_tokens: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 1:
            raise ValueError(f"ViTCAE is class-conditioned and needs num_classes >= 1, got {self.num_classes}")
        if self.num_cond_tokens < 1:
            raise ValueError(f"num_cond_tokens (M) must be at least 1, got {self.num_cond_tokens}")


@dataclass
class ViTCAELossConfig:
    """Weights and curriculum of the ViTCAE objective (eq. 23-25).

    Attributes:
        lambda_l1, lambda_l2: weights of the L1 and squared-L2 reconstruction errors (paper ``lambda_L1/L2``).
        lambda_pt: weight of the patch estimator loss ``L_PT`` (paper ``lambda_PT``, eq. 23).
        lambda_cls: weight of the global-latent regulariser ``KL_cls`` / ``W_cls`` (paper ``lambda_cls``).
        lambda_pt_reg: weight of the patch-latent regulariser ``KL_pt`` / ``W_pt`` (paper ``lambda_pt``, eq. 25).
        lambda_ce: weight of the cross-entropy of the classifier on ``mu_cls`` (the project's decision where the
            ViTCAE paper is silent; docs/vitcae.md, "Class conditioning").
        warmup_epochs: ``T_w``; epochs ``1..T_w`` use the KL terms only, later epochs the KL/MMD blend.
        mmd_mix: the blend weight ``a`` of eq. 25 (``a * W + (1 - a) * KL``; the paper calls it alpha).
        mmd_scales: the ``s`` of the IMQ kernel constants ``C = 2 * dim * s``.
        mmd_kernel_scale: ``prior`` (default): the IMQ constants follow the prior's variance (``C = 2 dim s
            sigma^2``): 1 for ``N(0, I)`` (``W_cls``) and, for ``W_pt``, the per-dimension variance of the conditional
            prior's samples over the batch, ``mean(sigma_hat^2) + mean(Var_batch(mu_hat))``, detached (WAE's constant
            assumes 1; docs/vitcae.md, ``mmd_kernel_scale``); ``unit``: ``C = 2 dim s`` as printed.
        mmd_calibration: ``kl`` (default): each MMD term is multiplied by a constant fixed at the switch, the ratio of
            the epoch means of ``KL`` and ``W`` over the last warm-up epoch (``T_w``), so the blend ``a s W +
            (1 - a) KL`` starts at the magnitude of the KL it replaces and 80% of its gradient comes from the MMD:
            the switch changes the geometry of the regulariser, not only its size. Without it KL terms of 40-150
            nats against MMD terms of 0.2-2 make the blend about ``0.2 KL``. ``none``: eq. 25 as printed.
        mmd_calibration_max: the largest factor the calibration may apply (default 100): a per-batch MMD estimate
            near 0 would otherwise turn its noise into most of the gradient.
        monitor: ``continuous`` (default): ReduceLROnPlateau and ``best.ckpt`` watch ``val/monitor = rec + pt_est
            + lambda_ce ce``, the same function of the network before and after the switch; ``objective``: they watch
            ``val/loss``, eq. 25, which steps at the switch because the objective itself changes.
        mmd_detach_prior: draw the conditional-prior samples of ``W_pt`` from detached ``f(z_cls)`` parameters.
            Default ``False``: ``W_pt`` is a surrogate of ``KL_pt``, which trains the prior as well, so the
            surrogate does too; ``True`` makes the prior a fixed target for the MMD, trained by ``KL_pt`` alone.

    The paper gives no values for the weights in its text; the defaults keep the summed KL terms from swamping
    the per-pixel reconstruction error at the start of training.
    """

    lambda_l1: float = 1.0
    lambda_l2: float = 1.0
    lambda_pt: float = 1.0
    lambda_cls: float = 1e-3
    lambda_pt_reg: float = 1e-3
    lambda_ce: float = 1.0
    warmup_epochs: int = 10
    mmd_mix: float = 0.8
    mmd_scales: tuple[float, ...] = WAE_IMQ_SCALES
    mmd_kernel_scale: str = "prior"
    mmd_calibration: str = "kl"
    mmd_calibration_max: float = 100.0
    monitor: str = "continuous"
    mmd_detach_prior: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("mmd_kernel_scale", MMD_KERNEL_SCALES),
            ("mmd_calibration", MMD_CALIBRATIONS),
            ("monitor", MONITORS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"loss.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        self.mmd_scales = tuple(float(s) for s in self.mmd_scales)
        for name in ("lambda_l1", "lambda_l2", "lambda_pt", "lambda_cls", "lambda_pt_reg", "lambda_ce"):
            if getattr(self, name) < 0:
                raise ValueError(f"loss.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.mmd_mix <= 1.0:
            raise ValueError(f"loss.mmd_mix must lie in [0, 1], got {self.mmd_mix}")
        if not self.mmd_calibration_max >= 1:
            raise ValueError(f"loss.mmd_calibration_max must be >= 1, got {self.mmd_calibration_max}")
        if self.warmup_epochs < 0:
            raise ValueError(f"loss.warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if not self.mmd_scales or min(self.mmd_scales) <= 0:
            raise ValueError(f"loss.mmd_scales must be a non-empty list of positive numbers, got {self.mmd_scales}")

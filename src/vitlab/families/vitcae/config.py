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
    """Weights and curriculum of the ViTCAE objective (ViTCAE paper, eq. 23-25): ``lambda_l1``, ``lambda_l2`` the
    reconstruction errors; ``lambda_pt`` the patch estimator loss (the paper's lambda_PT, eq. 23); ``lambda_cls`` and
    ``lambda_pt_reg`` the ``KL``/``W`` regularisers of ``z_cls`` and the patch latents (the paper's lambda_cls and
    lambda_pt, eq. 25); ``lambda_ce`` the cross-entropy of the classifier on ``mu_cls``; ``warmup_epochs`` ``T_w``;
    ``mmd_mix`` the blend weight ``a`` of eq. 25. The MMD options (``mmd_*``), ``monitor`` and the reasons for the
    defaults: docs/vitcae.md, "Decisions where the paper is silent or contradicts itself"."""

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

"""The CET-ViT family's config section ``loss``, plain data: ``vitlab.config.build_config`` checks it before
anything imports torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CETLossConfig:
    """The ``loss:`` section for CET-ViT (CET-ViT v4 model card: "EI loss, as actually
    implemented", and Disclosure 1 on Dynamic K).

    ``lambda_ei`` ramps from 0 at epoch ``ei_start`` to its final value at ``ei_end`` along a cosine (the card's first
    release: 0.05, epochs 50 -> 200 of 300); ``ei_schedule: constant`` holds ``lambda_ei`` from the first step (the
    v4 card's ``entropy_reg_weight=0.01``: config ``compare/cifar10_p4_ei_card``). ``lambda_k`` weights
    ``E[K] / K_max`` of the Dynamic-K estimator (``gumbel``: added to the loss; ``exact``: inside the target
    ``argmin_c (L_c + lambda_k K_c / K_max)``, which the estimator fits by cross-entropy weighted ``k_fit_weight``).
    The EI variant (``full | two_term | entropy_only | none``) is the model option ``ei``.
    """

    lambda_ei: float = 0.05
    ei_start: float = 50
    ei_end: float = 200
    ei_schedule: str = "ramp"
    lambda_k: float = 0.01
    k_fit_weight: float = 1.0

"""CET-ViT (the card's slot-grouping ViT with the EI regulariser): its declaration as a family.

The model (``model``; ``parts``, ``options``, ``outputs``, ``presets``), the ``model`` and ``loss`` config types
(``config``), the task (``task``: cross-entropy, the EI terms of ``vitlab.losses.ei``, the Dynamic-K cost), the
grouping ablation (``grouping``) and the explanation rules (``explain``).
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="cet_vit",
        models=("vitlab.families.cet_vit.model:CETViT",),
        task="vitlab.families.cet_vit.task:CETViTTask",
        config_types={
            "model": "vitlab.families.cet_vit.config:CETViTConfig",
            "loss": "vitlab.families.cet_vit.config:CETLossConfig",
        },
        presets="vitlab.families.cet_vit.presets:CATALOGUE",
        commands=(),
        report_sections=(),
        explainer="vitlab.families.cet_vit.explain:explainer",
        bench_objective="vitlab.families.cet_vit.task:bench_objective",
    )
)

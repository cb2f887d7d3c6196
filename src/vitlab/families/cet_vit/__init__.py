"""CET-ViT (the card's slot-grouping ViT with the EI regulariser): its declaration as a family.

The model (``model``; ``parts``, ``slots``, ``options``, ``outputs``, ``presets``), the EI regulariser (``ei``), the
``model`` and ``loss`` config types (``config``), the task (``task``: cross-entropy, the EI terms, the Dynamic-K
cost), the grouping ablation (``grouping``), the metrics of ``S`` in ``vitlab evaluate`` (``evaluation``) and the
explanation rules (``explain``).
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="cet_vit",
        models=("vitlab.families.cet_vit.model:CETViT",),
        task="vitlab.families.cet_vit.task:CETViTTask",
        config_types={
            "model": "vitlab.families.cet_vit.config:CETViTOptions",
            "loss": "vitlab.families.cet_vit.config:CETLossConfig",
        },
        presets="vitlab.families.cet_vit.presets:TABLE",
        commands=("vitlab.families.cet_vit.commands",),
        report_sections=(),
        explainer="vitlab.families.cet_vit.explain:explainer",
        evaluation="vitlab.families.cet_vit.evaluation",
        bench_objective="vitlab.families.cet_vit.task:bench_objective",
    )
)

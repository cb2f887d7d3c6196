"""CET-ViT (the card's slot-grouping ViT with the EI regulariser): its declaration as a family.

Model ``vitlab.models.cet_vit``, the EI terms ``vitlab.losses.ei``, task ``vitlab.training.cet_task``, the slot
probes of ``vitlab probe slot-k`` and the report's segment maps.
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
        presets="vitlab.families.cet_vit.model:PRESETS",
        commands=(),
        report_sections=(),
        explainer="vitlab.families.cet_vit.explain:explainer",
    )
)

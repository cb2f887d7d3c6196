"""ViTCAE (the Vision Transformer conditional autoencoder): its declaration as a family.

Model ``vitlab.models.vitcae``, losses (eq. 23-25) ``vitlab.losses.vitcae``, task ``vitlab.training.vitcae_task``,
the generative tasks ``vitlab.evaluation.generative`` and the ``vitlab generate`` command.
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="vitcae",
        models=("vitlab.families.vitcae.model:ViTCAE",),
        task="vitlab.families.vitcae.task:ViTCAETask",
        config_types={
            "model": "vitlab.families.vitcae.config:ViTCAEConfig",
            "loss": "vitlab.families.vitcae.config:ViTCAELossConfig",
        },
        presets="vitlab.families.vitcae.model:PRESETS",
        commands=("vitlab.families.vitcae.commands",),
        report_sections=("vitlab.families.vitcae.report:generate_section",),
    )
)

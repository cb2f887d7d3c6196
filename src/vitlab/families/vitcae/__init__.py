"""ViTCAE (the Vision Transformer conditional autoencoder): its declaration as a family.

Model ``vitlab.models.vitcae``, losses (eq. 23-25) ``vitlab.losses.vitcae``, task ``vitlab.training.vitcae_task``,
the generative tasks ``vitlab.evaluation.generative`` and the ``vitlab generate`` command.
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="vitcae",
        models=("vitlab.models.vitcae:ViTCAE",),
        task="vitlab.training.vitcae_task:ViTCAETask",
        config_types={"loss": "vitlab.losses.vitcae:ViTCAELossConfig"},
        presets="vitlab.models.vitcae:PRESETS",
        commands=("vitlab.cli.generate",),
        report_sections=("generate",),
    )
)

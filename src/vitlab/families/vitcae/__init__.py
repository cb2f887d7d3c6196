"""ViTCAE (the Vision Transformer conditional autoencoder): its declaration as a family.

The model (``model``, its parts in ``pieces``), the ``model`` and ``loss`` config types (``config``), the losses
of eq. 23-25 (``losses``), the task (``task``), the generative tasks (``generative``), the ``vitlab generate``
command (``commands``) and the report's section (``report``).
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="vitcae",
        models=("vitlab.families.vitcae.model:ViTCAE",),
        task="vitlab.families.vitcae.task:ViTCAETask",
        config_types={
            "model": "vitlab.families.vitcae.config:ViTCAEOptions",
            "loss": "vitlab.families.vitcae.config:ViTCAELossConfig",
        },
        presets="vitlab.families.vitcae.presets:TABLE",
        commands=("vitlab.families.vitcae.commands",),
        report_sections=("vitlab.families.vitcae.report:generate_section",),
        explainer="vitlab.families.vitcae.explain:explainer",
    )
)

"""A toy third family, the way a package outside vitlab adds one: an MLP-Mixer (Tolstikhin et al. 2021, "MLP-Mixer:
An all-MLP Architecture for Vision", Section 2) with its own model, config types and task, declared by one call.

Installed through the entry-point group ``vitlab.families`` (``tests/families/test_plugin_family.py`` writes the
distribution's ``entry_points.txt``); nothing under ``src/vitlab`` names it.
"""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="toy_mixer",
        models=("vitlab_toy_mixer.model:ToyMixer",),
        task="vitlab_toy_mixer.task:ToyMixerTask",
        config_types={
            "model": "vitlab_toy_mixer.config:ToyMixerOptions",
            "loss": "vitlab_toy_mixer.config:ToyMixerLoss",
        },
        presets="vitlab_toy_mixer.config:PRESETS",
    )
)

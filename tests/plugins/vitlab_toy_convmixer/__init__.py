"""A second toy family from outside vitlab: a ConvMixer (Trockman and Kolter 2022, "Patches Are All You Need?",
Section 2) with no task or loss of its own (a plain classifier: vitlab's classification task). Installed beside the
toy MLP-Mixer, it shows that vitlab's own suite keeps to its built-in families and that the test kit
(``vitlab.testing``) checks a plug-in's presets in the plug-in's CI."""

from vitlab.family import Family, register_family

FAMILY = register_family(
    Family(
        name="toy_convmixer",
        models=("vitlab_toy_convmixer.model:ToyConvMixer",),
        task="vitlab.training.tasks:ClassificationTask",
        config_types={"model": "vitlab_toy_convmixer.config:ToyConvMixerOptions"},
        presets="vitlab_toy_convmixer.config:PRESETS",
    )
)

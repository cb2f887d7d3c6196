"""The toy family's config types and catalogue: plain data, no torch."""

from dataclasses import dataclass

from vitlab.config.model import ImageModelConfig

#: preset name -> constructor arguments
PRESETS = {"mixer_pico": dict(img_size=8, patch_size=2, in_chans=1, dim=16, depth=2)}
#: preset name -> (model class, description)
CATALOGUE = {"mixer_pico": ("ToyMixer", "toy MLP-Mixer, width 16, depth 2 (8x8 one-channel images)")}


class ToyMixerConfig(ImageModelConfig, total=False):
    """Options of :class:`vitlab_toy_mixer.model.ToyMixer`."""

    dim: int
    depth: int


@dataclass
class ToyMixerLoss:
    """The task's ``loss`` section: the weight of the squared logits added to the cross-entropy."""

    logit_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.logit_penalty < 0:
            raise ValueError(f"loss.logit_penalty must be at least 0, got {self.logit_penalty}")

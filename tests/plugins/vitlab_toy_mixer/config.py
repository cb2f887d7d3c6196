"""The toy family's config types and preset table: plain data, no torch."""

from dataclasses import dataclass

from vitlab.config.model import ImageModelOptions

#: preset name -> (model class, description, constructor arguments)
PRESETS = {
    "toy_mixer_pico": (
        "ToyMixer",
        "toy MLP-Mixer, width 16, depth 2 (8x8 one-channel images)",
        dict(img_size=8, patch_size=2, in_chans=1, dim=16, depth=2),
    )
}


@dataclass(frozen=True, kw_only=True)
class ToyMixerOptions(ImageModelOptions):
    """Options of :class:`vitlab_toy_mixer.model.ToyMixer`: the constructor's keywords, the config's keys and types."""

    img_size: int = 8
    patch_size: int = 2
    in_chans: int = 1
    dim: int = 16
    depth: int = 2


@dataclass
class ToyMixerLoss:
    """The task's ``loss`` section: the weight of the squared logits added to the cross-entropy."""

    logit_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.logit_penalty < 0:
            raise ValueError(f"loss.logit_penalty must be at least 0, got {self.logit_penalty}")

"""The ConvMixer's options and preset table: plain data, no torch."""

from dataclasses import dataclass

from vitlab.config.model import ImageModelOptions

#: preset name -> (model class, description, constructor arguments)
PRESETS = {
    "toy_convmixer_pico": (
        "ToyConvMixer",
        "toy ConvMixer, width 8, depth 2, kernel 3 (8x8 one-channel images)",
        dict(img_size=8, patch_size=2, in_chans=1, dim=8, depth=2, kernel_size=3),
    )
}


@dataclass(frozen=True, kw_only=True)
class ToyConvMixerOptions(ImageModelOptions):
    """Options of :class:`vitlab_toy_convmixer.model.ToyConvMixer`."""

    dim: int = 8
    depth: int = 2
    kernel_size: int = 3

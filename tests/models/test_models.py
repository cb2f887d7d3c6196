"""Every built-in preset: vitlab.testing's CONTRACT (the config section, a training step of its family's task in
which every parameter gets a finite nonzero gradient, the export round trip, what it claims through a protocol), and
SDPA equals eager attention."""

import pytest
import torch

from vitlab.family import family_of_class
from vitlab.layers import Attention
from vitlab.models.registry import get_preset
from vitlab.testing import build, builtin_presets, check_capabilities, check_config, check_export, check_training_step

NUM_CLASSES = 5


def _small(name: str) -> dict:
    """Constructor overrides for a small input, so every size, base included, runs quickly on a CPU."""
    # Swin's four stages halve the patch grid three times: a 16x16 grid keeps 2x2 windows in the last stage (a 1x1
    # window would leave its relative position bias without a gradient).
    patch_size = 1 if get_preset(name).cls.__name__ == "SwinTransformer" else 2 if "cet" in name else 4
    return {"img_size": 16, "patch_size": patch_size, "in_chans": 3, "num_classes": NUM_CLASSES}


def _loss(name: str) -> dict:
    """The loss section under which every parameter gets a gradient: ViTCAE's without the warm-up, CET-ViT's EI
    weight at its final value."""
    family = family_of_class(get_preset(name).cls)
    return {"vitcae": {"warmup_epochs": 0}, "cet_vit": {"ei_start": -2, "ei_end": -1}}.get(family and family.name, {})


def _param(name: str, *rest) -> pytest.param:
    """A case of ``name``; the ``*_base`` presets (ViT-Base sizes: seconds each on a CPU) are marked slow."""
    return pytest.param(name, *rest, marks=[pytest.mark.slow] if name.endswith("_base") else [])


CASES = [(name, {}) for name in builtin_presets()] + [("cet_vit_pico", {"dynamic_k": "gumbel"})]
IDS = [name + "".join(f"-{v}" for v in extra.values()) for name, extra in CASES]
CASES = [_param(name, extra) for name, extra in CASES]


@pytest.mark.parametrize(("name", "extra"), CASES, ids=IDS)
def test_every_parameter_gets_a_gradient(name, extra):
    check_training_step(name, loss=_loss(name), **_small(name), **extra)


@pytest.mark.parametrize("name", [_param(name) for name in builtin_presets()])
def test_the_config_section_the_export_and_the_protocols_keep_the_contract(name):
    check_config(name, **_small(name))
    check_export(name, **_small(name))
    check_capabilities(name, **_small(name))


@pytest.mark.parametrize("name", [_param(name) for name in builtin_presets()])
def test_sdpa_equals_eager_for_the_whole_model(name):
    """Every model built on the one shared Attention; a model of none (Swin: timm's WindowAttention, compared in
    tests/models/test_swin.py) is skipped."""
    torch.manual_seed(0)
    model = build(name, **_small(name)).eval()
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    if not attns:
        pytest.skip(f"{name} has no shared Attention")
    x = torch.randn(2, 3, 16, 16)

    def logits() -> torch.Tensor:
        out = model(x)
        return out if isinstance(out, torch.Tensor) else out.logits

    fused = logits()
    for m in attns:
        m.fused = False
    torch.testing.assert_close(logits(), fused, atol=2e-5, rtol=1e-4)

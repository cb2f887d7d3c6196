"""Every registered model: forward, backward under its training loss, every parameter gets a gradient, no NaN,
SDPA equals eager attention."""

import pytest
import torch

import vitlab
from vitlab.config import RunConfig
from vitlab.layers import Attention
from vitlab.models.registry import constructor_args, get_preset
from vitlab.training.run import build_task

NUM_CLASSES = 5


def _small(name: str, **extra) -> torch.nn.Module:
    """The preset at a small input so every size, base included, runs quickly on a CPU."""
    accepted = constructor_args(get_preset(name).cls)
    # Swin's four stages halve the patch grid three times: a 16x16 grid keeps 2x2 windows in the last stage (a 1x1
    # window would leave its relative position bias without a gradient).
    patch_size = 1 if "swin" in name else 2 if "cet" in name else 4
    kwargs = {"img_size": 16, "patch_size": patch_size, "in_chans": 3, "num_classes": NUM_CLASSES}
    return vitlab.create_model(name, **{k: v for k, v in kwargs.items() if k in accepted}, **extra)


def _task(model: torch.nn.Module):
    hparams = {"config": {}, "model_kwargs": model.init_kwargs, "data_info": {"num_classes": NUM_CLASSES}}
    cfg = RunConfig(model={"name": model.preset}, loss={"warmup_epochs": 0} if "vitcae" in model.preset else {})
    if "cet_vit" in model.preset:
        cfg.loss = {"ei_start": -2, "ei_end": -1}  # the EI weight at its final value
    return build_task(cfg, model, hparams)


def _param(name: str, *rest) -> pytest.param:
    """A case of ``name``; the ``*_base`` presets (ViT-Base sizes: seconds each on a CPU) are marked slow."""
    return pytest.param(name, *rest, marks=[pytest.mark.slow] if name.endswith("_base") else [])


CASES = [(name, {}) for name in vitlab.list_models()] + [("cet_vit_pico", {"dynamic_k": "gumbel"})]
IDS = [name + "".join(f"-{v}" for v in extra.values()) for name, extra in CASES]
CASES = [_param(name, extra) for name, extra in CASES]


@pytest.mark.parametrize(("name", "extra"), CASES, ids=IDS)
def test_every_parameter_gets_a_gradient(name, extra):
    torch.manual_seed(0)
    model = _small(name, **extra).train()
    task = _task(model)
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([0, 1, 2, 3])
    losses = task.compute_losses((x, y), "train")
    assert torch.isfinite(losses["loss"]), losses
    losses["loss"].backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    zero = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() == 0]
    assert not missing, f"parameters with no gradient: {missing}"
    assert not zero, f"parameters with an all-zero gradient: {zero}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", [_param(name) for name in vitlab.list_models()])
def test_sdpa_equals_eager_for_the_whole_model(name):
    """Every model built on the one shared Attention; a model of none (Swin: timm's WindowAttention, compared in
    tests/models/test_swin.py) is skipped."""
    torch.manual_seed(0)
    model = _small(name).eval()
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

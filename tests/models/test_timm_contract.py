"""timm's model contract on every built-in preset: the checks of timm's ``tests/test_models.py`` (backward with 42
classes; ``num_classes=0``, ``reset_classifier``, ``forward_intermediates``, ``features_only``: ``vitlab.testing``'s
``TIMM_CONTRACT``; ``pretrained_cfg``) and the parts its training scripts rely on (``set_grad_checkpointing``,
``group_matcher`` with timm's layer-decay optimiser), at 32x32 inputs and 10 classes. ViTCAE's encoder is checked
as a model of its own."""

import pytest
import timm.data
import timm.optim
import torch
from timm.models import group_parameters

from vitlab.models.contract import module_mode
from vitlab.models.protocols import GenerativeModel
from vitlab.models.registry import get_preset
from vitlab.testing import TIMM_CONTRACT, builtin_presets, timm_model

B, SIZE, CLASSES = 2, 32, 10
SMALL = {"img_size": SIZE, "in_chans": 3, "num_classes": CLASSES}


def _build(name: str, num_classes: int = CLASSES, **extra) -> torch.nn.Module:
    """The preset at 32x32 RGB; for a ViTCAE preset its encoder (a ViT with a new head of ``num_classes``)."""
    return timm_model(name, **{**SMALL, "num_classes": num_classes, **extra})


def _case(name: str) -> pytest.param:
    column = f"{name}.encoder" if issubclass(get_preset(name).cls, GenerativeModel) else name
    return pytest.param(name, id=column, marks=[pytest.mark.slow] if name.endswith("_base") else [])


CASES = [_case(name) for name in builtin_presets()]


def _x() -> torch.Tensor:
    return torch.randn(B, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", CASES)
def test_backward_with_42_classes_reaches_every_parameter(name):
    torch.manual_seed(0)
    model = _build(name, num_classes=42).train()
    out = model(_x())
    out.mean().backward()
    assert out.shape == (B, 42) and not out.isnan().any()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize("check", TIMM_CONTRACT, ids=lambda check: check.__name__)
@pytest.mark.parametrize("name", CASES)
def test_timms_model_contract_of_the_test_kit(name, check):
    """vitlab.testing's checks: the classifier and ``reset_classifier``, ``forward_intermediates`` against
    ``feature_info``, ``features_only`` at ``out_indices`` from the model's depth."""
    check(name, **SMALL)


def _loss_and_grads(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the dropout and stochastic-depth masks
    loss = torch.nn.functional.cross_entropy(model(x), torch.arange(B) % CLASSES)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward pass of one forward."""
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(saved)


@pytest.mark.parametrize("name", CASES)
def test_grad_checkpointing_keeps_less_and_gives_the_same_loss_and_gradients(name):
    torch.manual_seed(0)
    dropout = {"drop_rate": 0.1, "drop_path_rate": 0.1}
    model = _build(name, **dropout).train()
    x = _x()
    loss, grads = _loss_and_grads(model, x)
    kept = _saved_bytes(model, x)
    model.set_grad_checkpointing(True)
    loss_ckpt, grads_ckpt = _loss_and_grads(model, x)
    assert _saved_bytes(model, x) < 0.6 * kept
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    for n, g in grads.items():
        torch.testing.assert_close(grads_ckpt[n], g, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("name", CASES)
def test_group_matcher_orders_the_layers_for_timms_layer_decay(name):
    model = _build(name)
    layer_of = group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    top = max(layer_of.values())
    assert set(layer_of) == {n for n, _ in model.named_parameters()} and top >= 3
    first_conv, classifier = model.pretrained_cfg["first_conv"], model.pretrained_cfg["classifier"]
    assert layer_of[f"{first_conv}.weight"] == 0 and layer_of[f"{classifier}.weight"] == top
    coarse = group_parameters(model, model.group_matcher(coarse=True), reverse=True)
    assert set(coarse) == set(layer_of) and max(coarse.values()) <= top
    groups = timm.optim.param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g["lr_scale"] for g in groups})
    assert scales[0] == 0.5**top and scales[-1] == 1.0
    optimizer = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, layer_decay=0.75)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


@pytest.mark.parametrize("name", CASES)
def test_pretrained_cfg_names_the_input_the_classifier_and_the_first_conv(name):
    model = _build(name)
    cfg = model.pretrained_cfg
    state = model.state_dict()
    assert cfg == model.default_cfg and cfg["input_size"] == (3, SIZE, SIZE) and cfg["num_classes"] == CLASSES
    assert f"{cfg['classifier']}.weight" in state and f"{cfg['first_conv']}.weight" in state
    assert len(cfg["mean"]) == len(cfg["std"]) == 3 and cfg["license"] and cfg["interpolation"] == "bicubic"
    assert timm.data.resolve_data_config(model=model)["input_size"] == (3, SIZE, SIZE)
    model.pretrained_cfg = {"mean": [0.1, 0.2, 0.3]}  # as vitlab fit sets the data's
    assert model.pretrained_cfg["mean"] == (0.1, 0.2, 0.3) and model.pretrained_cfg["std"] == cfg["std"]
    model.default_cfg = {"std": [0.3, 0.2, 0.1]}  # as timm's builder assigns its older name (issue 46)
    assert model.pretrained_cfg["std"] == (0.3, 0.2, 0.1) and model.default_cfg == model.pretrained_cfg
    assert model.no_weight_decay() <= set(dict(model.named_parameters())) | {"relative_position_bias_table"}


def test_cet_vit_intermediates_are_its_three_streams():
    torch.manual_seed(0)
    model = _build("cet_vit_pico").eval()
    streams = [info["stream"] for info in model.feature_info]
    assert streams == ["micro"] * 4 + ["macro"] + ["fused"] * 2  # 4 stages, 1 macro block, cross-scale + 1 deep
    x = _x()
    tokens = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
    assert tokens[4].shape == (B, model.num_slots, 64) and tokens[-1].shape == (B, 256, 64)
    maps = model.forward_intermediates(x, indices=[4], intermediates_only=True)
    aux = model.forward_with_aux(x)[1]
    torch.testing.assert_close(maps[0], (aux.S @ tokens[4]).transpose(1, 2).reshape(B, 64, 16, 16))
    with pytest.raises(ValueError, match="no final norm"):
        model.forward_intermediates(x, norm=True)


def test_tome_feature_maps_give_each_patch_the_token_it_was_merged_into():
    torch.manual_seed(0)
    model = _build("tome_pico", tome_r=16).eval()
    maps = model.forward_intermediates(_x(), indices=[-1], intermediates_only=True)[0]  # [B, 64, 8, 8]
    tokens = model.forward_intermediates(_x(), indices=[-1], output_fmt="NLC", intermediates_only=True)[0]
    per_image = maps.flatten(2).transpose(1, 2)  # [B, 64 patches, 64]
    for b in range(B):
        distinct = torch.unique(per_image[b], dim=0)
        assert len(distinct) <= tokens.shape[1]  # patches share the few tokens left
        assert all((tokens[b] == row).all(-1).any() for row in distinct)


@pytest.mark.parametrize("training", [False, True])
def test_module_mode_gives_every_submodule_its_own_mode_back(training):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.BatchNorm1d(2), torch.nn.Dropout()))
    model[1][0].eval()
    before = [m.training for m in model.modules()]
    with module_mode(model, training=training):
        assert all(m.training == training for m in model.modules())
    assert [m.training for m in model.modules()] == before

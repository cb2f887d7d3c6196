"""Steering the heads of HF transformers', torchvision's and timm's attention (ViTCAE eq. 19 and 26) through hooks:
the logits unchanged at tau = 1, tau scales the named head only, a frozen head's rows never move, refusals by name."""

import math
from copy import deepcopy

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import VisionTransformer
from transformers import (
    DeiTConfig,
    DeiTForImageClassification,
    Dinov2Config,
    Dinov2ForImageClassification,
    ViTConfig,
    ViTForImageClassification,
)

from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.capture import capture_attention
from vitlab.dynamics import DynamicsPolicy
from vitlab.dynamics.freezing import SteeredHeadGuard
from vitlab.dynamics.layer_freezing import LayerFreezer
from vitlab.errors import ConfigError
from vitlab.layers.head_steering import steer, steer_temperature, steerable
from vitlab.models import create_model

HF = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=4)


class Logits(nn.Module):
    """An HF classifier as ``x -> logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def build(kind: str, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    hf = {**HF, "num_hidden_layers": layers, "num_labels": 3}
    if kind == "hf_vit":
        return Logits(ViTForImageClassification(ViTConfig(**hf)))
    if kind == "hf_deit":
        return Logits(DeiTForImageClassification(DeiTConfig(**hf)))
    if kind == "hf_dinov2":
        return Logits(Dinov2ForImageClassification(Dinov2Config(**{**hf, "mlp_ratio": 2})))
    if kind == "tv_vit":
        model = VisionTransformer(
            image_size=16, patch_size=4, num_layers=layers, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=3
        )
        nn.init.normal_(model.heads.head.weight, std=0.5)  # torchvision starts its head at zero: logits all 0
        return model
    if kind == "timm_eva":
        return timm.create_model("eva02_tiny_patch14_224", img_size=16, patch_size=4, depth=layers, num_classes=3)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, depth=layers, num_classes=3, qk_norm=True
    )


KINDS = ["hf_vit", "hf_deit", "hf_dinov2", "tv_vit", "timm_eva", "timm_qknorm"]


def attention_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if steerable(module)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_temperature_of_one_keeps_the_models_own_logits(kind):
    model = build(kind).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        own = model(x)
    names = steer_temperature(model)
    assert len(names) == 2  # one attention per block
    guard = SteeredHeadGuard([steer(model.get_submodule(n)) for n in names])
    guard.freeze(torch.zeros(2, guard.modules[0].num_heads, dtype=torch.bool))
    with torch.no_grad():
        steered = model(x)
    assert (steered - own).abs().max() <= 1e-6
    assert all(model.get_submodule(n).log_tau.shape == (steer(model.get_submodule(n)).num_heads,) for n in names)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["inverse", "divide"])
def test_tau_scales_the_logits_of_the_named_head_only(kind, form):
    model = build(kind).eval()
    names = steer_temperature(model, form)
    x = torch.randn(2, 3, 16, 16)
    before = capture_attention(model, x)[names[0]]
    with torch.no_grad():
        model.get_submodule(names[0]).log_tau[1] = math.log(2.0)
    after = capture_attention(model, x)[names[0]]
    factor = 2.0 if form == "inverse" else 0.5
    # softmax(c * s) = softmax(c * log softmax(s)): the row's log-sum-exp is a constant
    expected = F.softmax(factor * before[:, 1].double().log(), dim=-1)
    torch.testing.assert_close(after[:, 1].double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(after[:, [0, 2]], before[:, [0, 2]], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 1], before[:, 1], atol=1e-3)


@pytest.mark.parametrize("kind", ["hf_vit", "tv_vit", "timm_eva"])
def test_a_copy_of_a_steered_model_steers_its_own_heads(kind):
    model = build(kind).eval()
    name = steer_temperature(model)[0]
    copy = deepcopy(model)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        before = model(x)
        copy.get_submodule(name).log_tau.fill_(math.log(3.0))
        assert torch.equal(model(x), before)
        assert not torch.allclose(copy(x), before)


def head_rows(handle, head: int, parts: str = "qkv") -> list[torch.Tensor]:
    d = handle.head_dim
    return [
        rows.parameter.detach()[rows.offset + head * d : rows.offset + (head + 1) * d].clone()
        for part in parts
        for rows in handle.rows[part]
    ]


@pytest.mark.parametrize("kind", ["hf_vit", "hf_dinov2", "tv_vit", "timm_eva"])
@pytest.mark.parametrize("scope", ["heads", "pattern"])
def test_a_frozen_heads_rows_get_no_update(kind, scope):
    model = build(kind).train()
    names = steer_temperature(model)
    handles = [steer(model.get_submodule(n)) for n in names]
    for handle in handles:
        handle.train_frozen_values = scope == "pattern"
    guard = SteeredHeadGuard(handles)
    frozen = torch.zeros(len(handles), handles[0].num_heads, dtype=torch.bool)
    frozen[0, 1] = True
    guard.freeze(frozen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    guard.attach(optimizer)
    kept = head_rows(handles[0], 1, "qk" if scope == "pattern" else "qkv")
    tau = handles[0].log_tau.detach().clone()
    active = head_rows(handles[0], 0)
    for _ in range(2):
        optimizer.zero_grad()
        F.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 0])).backward()
        if kind != "tv_vit":  # the hooks detach a frozen head's q and k: no gradient reaches their rows
            d = handles[0].head_dim
            for rows in handles[0].rows["q"] + handles[0].rows["k"]:
                assert rows.parameter.grad[rows.offset + d : rows.offset + 2 * d].abs().max() == 0
        optimizer.step()
    for rows, now in zip(kept, head_rows(handles[0], 1, "qk" if scope == "pattern" else "qkv"), strict=True):
        assert torch.equal(rows, now)
    assert handles[0].log_tau[1] == tau[1]
    assert all(not torch.equal(a, b) for a, b in zip(active, head_rows(handles[0], 0), strict=True))
    if scope == "pattern":  # the frozen head's values train
        assert not torch.equal(head_rows(handles[0], 1, "v")[0], kept[0])


@pytest.mark.parametrize("kind", ["hf_vit", "tv_vit", "timm_eva"])
def test_the_schedule_writes_tau_into_foreign_heads(kind):
    """Eq. 20 on an HF, a torchvision and an EVA model: the heads are steered, not only observed."""
    model = build(kind)
    steer_temperature(model)
    probe = torch.randn(6, 3, 16, 16)
    policy = DynamicsPolicy(DynamicsConfig(mode="schedule", alpha=4.0, kappa_images=2), probe=probe)
    policy.attach(model)
    assert isinstance(policy.guard, SteeredHeadGuard)
    policy.advance(policy.measure(probe), epoch=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    record = policy.advance(policy.measure(probe), epoch=1)
    tau = torch.tensor(record["tau"], dtype=torch.float64)
    assert (tau < 1).all()
    torch.testing.assert_close(policy.modules[1].tau.double(), tau[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["hf_vit", "tv_vit"])
def test_layer_freezing_freezes_whole_blocks_of_foreign_models(kind):
    model = build(kind, layers=3)
    freezer = LayerFreezer(model)
    assert freezer.blocks == 3
    blocks = freezer.block_modules(model)
    freezer.freeze(1)
    assert not any(p.requires_grad for p in blocks[0].parameters())
    assert all(p.requires_grad for block in blocks[1:] for p in block.parameters())
    embedding = model.model.vit.embeddings.cls_token if kind == "hf_vit" else model.class_token
    assert not embedding.requires_grad


def test_heads_whose_pattern_shares_parameters_are_not_frozen():
    """A qk-norm's weight is shared by every head: freezing one would still move its pattern."""
    model = build("timm_qknorm")
    policy = DynamicsPolicy(DynamicsConfig(mode="fixed"), probe=torch.randn(2, 3, 16, 16))
    with pytest.raises(ConfigError, match=r"blocks.0.attn \(Attention\) holds q_norm.weight.*set dynamics.freeze"):
        policy.check(model)


def test_attention_whose_query_vitlab_cannot_reach_is_refused_by_name():
    swin = dict(img_size=8, patch_size=2, window_size=2, depths=[1, 1], num_heads=[1, 2], embed_dim=8)
    model = timm.create_model("swin_tiny_patch4_window7_224", num_classes=3, **swin)
    policy = DynamicsPolicy(DynamicsConfig(mode="schedule"), probe=torch.randn(2, 3, 8, 8))
    with pytest.raises(ConfigError, match=r"attends with WindowAttention, whose heads vitlab cannot scale"):
        policy.check(model)


def test_a_timm_model_beyond_the_plain_attention_takes_the_temperature():
    torch.manual_seed(0)
    options = dict(img_size=16, patch_size=4, depth=2, num_classes=3)
    plain = create_model("timm:eva02_tiny_patch14_224", **options).eval()
    steered = create_model("timm:eva02_tiny_patch14_224", temperature=True, **options).eval()
    missing, unexpected = steered.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing == ["blocks.0.attn.log_tau", "blocks.1.attn.log_tau"]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (steered(x) - plain(x)).abs().max() <= 1e-6


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("hf:vit", dict(patch_size=2, depth=1, embed_dim=16, num_heads=2, intermediate_size=32)),
        ("tv:vision_transformer", dict(patch_size=2, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32)),
    ],
)
def test_a_foreign_model_built_with_temperature_saves_and_reloads_its_taus(name, sizes):
    """``model.temperature=true`` on ``hf:``/``tv:`` models: the builder steers the heads, so a run's weights (with
    their ``log_tau``) load into the model rebuilt by name, and at tau = 1 the logits are the model's own."""
    from vitlab import create_model

    kw = dict(img_size=8, in_chans=1, num_classes=3, **sizes)
    steered = create_model(name, temperature=True, **kw)
    taus = [key for key in steered.state_dict() if key.endswith("log_tau")]
    assert len(taus) == 1
    rebuilt = create_model(name, temperature=True, **kw)
    rebuilt.load_state_dict(steered.state_dict())  # strict: the rebuilt model has the same keys
    plain = create_model(name, **kw)
    plain.load_state_dict({k: v for k, v in steered.state_dict().items() if k not in taus})
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(steered.eval()(x), plain.eval()(x), atol=1e-6, rtol=0)


def test_temperature_on_a_foreign_model_whose_heads_cannot_be_reached_is_refused():
    from vitlab import create_model

    with pytest.raises(ConfigError, match="model.temperature=true, but tv:swin_transformer attends with"):
        create_model(
            "tv:swin_transformer", temperature=True, img_size=16, in_chans=1, num_classes=3, patch_size=[2, 2],
            embed_dim=8, depths=[2], num_heads=[2], window_size=[4, 4],
        )  # fmt: skip

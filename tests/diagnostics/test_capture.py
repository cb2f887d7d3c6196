"""Attention captured by operation type (vitlab.diagnostics.capture) on models vitlab was never told about: timm's,
torchvision's and HF transformers', tiny and randomly initialised (no hub)."""

from __future__ import annotations

import pytest
import timm
import torch
import torchvision
from torch import nn

import vitlab
from vitlab.diagnostics.capture import attention_recording, capture_attention
from vitlab.explain.recording import recorded_attention

transformers = pytest.importorskip("transformers")

HF = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=4)
TIMM = dict(img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, num_classes=5)


def _timm(name: str, **kwargs):
    return lambda: timm.create_model(name, pretrained=False, **{**TIMM, **kwargs})


#: architecture -> (builder, expected {kind of map: count}); every model takes [2, 3, 16, 16]
ARCHITECTURES = {
    "vitlab vit": (lambda: vitlab.create_model("vit_pico", img_size=16, patch_size=4, num_classes=5, depth=2), 17),
    "timm deit (distilled)": (_timm("deit_tiny_distilled_patch16_224"), 18),
    "timm eva02 (rope)": (_timm("eva02_tiny_patch14_224"), 17),
    "timm vit_relpos (relative position, no CLS)": (_timm("vit_relpos_small_patch16_224"), 16),
    "timm swin": (
        lambda: timm.create_model(
            "swin_tiny_patch4_window7_224",
            img_size=16,
            patch_size=2,
            window_size=4,
            embed_dim=16,
            depths=(1, 1),
            num_heads=(1, 2),
            num_classes=5,
        ),
        16,
    ),
    "torchvision vit": (
        lambda: torchvision.models.VisionTransformer(
            image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=5
        ),
        17,
    ),
    "torchvision swin": (
        lambda: torchvision.models.SwinTransformer(
            patch_size=[2, 2], embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=[4, 4], num_classes=5
        ),
        16,
    ),
    "hf vit (eager)": (
        lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**HF, attn_implementation="eager")),
        17,
    ),
    "hf vit (sdpa)": (
        lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**HF, attn_implementation="sdpa")),
        17,
    ),
    "hf deit": (lambda: transformers.DeiTForImageClassification(transformers.DeiTConfig(**HF)), 18),
    "hf beit (relative position)": (
        lambda: transformers.BeitForImageClassification(transformers.BeitConfig(**HF, use_relative_position_bias=True)),
        17,
    ),
    "hf dinov2": (lambda: transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**HF)), 17),
    "hf swin": (
        lambda: transformers.SwinForImageClassification(
            transformers.SwinConfig(
                image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4
            )
        ),
        16,
    ),
    "hf clip vision": (
        lambda: transformers.CLIPVisionModelWithProjection(
            transformers.CLIPVisionConfig(**HF, projection_dim=8, attn_implementation="eager")
        ),
        17,
    ),
}


def _first_tensor(out) -> torch.Tensor:
    """The logits: a tensor, or the first field of a tuple or an HF output."""
    return out if isinstance(out, torch.Tensor) else out[0]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_capture_reads_softmax_rows_and_leaves_the_logits_alone(arch):
    torch.manual_seed(0)
    build, tokens = ARCHITECTURES[arch]
    model = build().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        plain = _first_tensor(model(x))
        with attention_recording(model) as record:
            captured = _first_tensor(model(x))
    torch.testing.assert_close(captured, plain, rtol=0, atol=1e-6)
    assert len(record.maps) >= 2, record.maps.keys()  # one per block (two blocks or stages each)
    for name, probs in record.maps.items():
        assert probs.shape[0] == 2 and probs.shape[-1] == probs.shape[-2], (name, probs.shape)
        assert probs.min() >= 0
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5, rtol=0)
        if name in record.windows:  # [B, W, H, Q, K]: the first stage's 8x8 grid in four 4x4 windows
            assert probs.ndim == 5 and probs.shape[1] == record.windows[name] == 4 and probs.shape[-1] == tokens
        else:
            assert probs.ndim == 4 and probs.shape[-1] == tokens


def test_capture_names_modules_and_states_the_window_layout():
    model = ARCHITECTURES["timm swin"][0]().eval()
    maps = capture_attention(model, torch.randn(3, 3, 16, 16))
    assert list(maps) == ["layers.0.blocks.0.attn", "layers.1.blocks.0.attn"]  # not the nn.Softmax inside
    assert maps["layers.0.blocks.0.attn"].shape == (3, 4, 1, 16, 16)  # [B, W, H, Q, K]: 4 windows of 4x4
    assert maps["layers.1.blocks.0.attn"].shape == (3, 2, 16, 16)  # one window: plain [B, H, Q, K]


def test_capture_equals_the_attention_computed_by_hand():
    """timm's eager path written out: the SDPA interception must give the same matrix."""
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, **TIMM).eval()
    x = torch.randn(2, 3, 16, 16)
    attn = model.blocks[0].attn
    tokens = model.patch_embed(x)
    tokens = model.norm_pre(model._pos_embed(tokens))
    q, k, _ = attn.qkv(model.blocks[0].norm1(tokens)).reshape(2, 17, 3, 2, 16).permute(2, 0, 3, 1, 4)
    expected = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)
    torch.testing.assert_close(capture_attention(model, x)["blocks.0.attn"], expected.detach())


def test_multihead_attention_gives_the_caller_what_it_asked_for():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        out, averaged = mha(x, x, x)  # need_weights=True, averaged over heads
        with attention_recording(mha) as record:
            out2, averaged2 = mha(x, x, x)
            out3, none = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(averaged2, averaged)
    torch.testing.assert_close(out3, out, atol=1e-6, rtol=1e-5)
    assert none is None
    assert record.maps[""].shape == (2, 2, 5, 5)
    torch.testing.assert_close(record.maps[""].mean(1), averaged)


def test_a_model_without_attention_is_refused_by_name():
    with pytest.raises(ValueError, match="Sequential computed no attention"):
        capture_attention(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), torch.randn(1, 3, 8, 8))


def test_unknown_names_are_an_error_that_lists_the_computed_ones():
    model = ARCHITECTURES["timm deit (distilled)"][0]().eval()
    with pytest.raises(KeyError, match="blocks.0.attn"):
        capture_attention(model, torch.randn(1, 3, 16, 16), names=["blocks.9.attn"])


class _MaskedAttention(nn.Module):
    """SDPA with a boolean mask, a causal mask and grouped-query heads (4 query heads, 2 key heads)."""

    def forward(self, q, k, mask):
        return (
            torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
            + torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
            + torch.nn.functional.scaled_dot_product_attention(q, k[:, :2], k[:, :2], enable_gqa=True)
        )


def test_sdpa_probabilities_follow_its_masks():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True  # no row fully masked
    model = _MaskedAttention()
    with attention_recording(model) as record:
        model(q, k, mask)
    maps = record.maps
    logits = q @ k.transpose(-2, -1) / 8**0.5
    torch.testing.assert_close(maps[""], logits.masked_fill(~mask, float("-inf")).softmax(-1))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(maps["#2"], logits.masked_fill(~causal, float("-inf")).softmax(-1))
    grouped = (q @ k[:, :2].repeat_interleave(2, 1).transpose(-2, -1) / 8**0.5).softmax(-1)
    torch.testing.assert_close(maps["#3"], grouped)


def test_channel_attention_is_captured_as_what_it_is():
    """XCiT's cross-covariance attention normalises over channels: [B, H, d, d], not tokens; its class-attention
    layers give the CLS query's row over the tokens, [B, H, 1, 1 + patches]."""
    model = timm.create_model(
        "xcit_nano_12_p16_224", img_size=32, patch_size=8, depth=2, cls_attn_layers=1, num_classes=3
    ).eval()
    maps = capture_attention(model, torch.randn(2, 3, 32, 32))
    head_dim = model.embed_dim // 4
    assert maps["blocks.0.attn"].shape == (2, 4, head_dim, head_dim)
    assert maps["cls_attn_blocks.0.attn"].shape == (2, 4, 1, 17)


@pytest.mark.parametrize("arch", ["timm deit (distilled)", "vitlab vit", "torchvision vit"])
def test_nested_recordings_give_each_matrix_once(arch):
    """SDPA read again in float32 by the inner recording, vitlab's own switch and nn.MultiheadAttention: the outer
    recording sees each matrix once, the inner one too, and the outer keeps reading after the inner one ends."""
    torch.manual_seed(0)
    model = ARCHITECTURES[arch][0]().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), attention_recording(model) as outer:
        inner = capture_attention(model, x)
        after = len(outer.maps)
        model(x)
    assert after == len(inner) == 2, (list(outer.maps), list(inner))
    assert len(outer.maps) == 4  # two forward passes, two blocks
    for name, probs in inner.items():
        torch.testing.assert_close(outer.maps[name], probs)
        torch.testing.assert_close(outer.maps[f"{name}#2"], probs)


def test_a_recording_around_the_explainers_reads_vitlabs_attention_once():
    """The attention methods' recording (vitlab.explain.recording) replaces the forward of vitlab's Attention: a
    recording around it still gets each matrix, the same one."""
    model = ARCHITECTURES["vitlab vit"][0]().eval()
    with torch.no_grad(), attention_recording(model) as outer, recorded_attention(model) as inner:
        model(torch.randn(2, 3, 16, 16))
    assert list(outer.maps) == inner.names == ["blocks.0.attn", "blocks.1.attn"]
    for name, probs in zip(inner.names, inner.probs, strict=True):
        torch.testing.assert_close(outer.maps[name], probs)


class _PrototypeClassifier(nn.Module):
    """``softmax(z @ protos.T)`` over five prototypes: a product of two non-parameters that relates no tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * 16 * 16, 8)
        self.protos = nn.Parameter(torch.randn(5, 8))

    def forward(self, x):
        z = nn.functional.normalize(self.embed(x.flatten(1)), dim=-1)
        return torch.softmax(z @ nn.functional.normalize(self.protos, dim=-1).T, -1)


def test_a_softmax_over_prototypes_is_not_attention():
    with pytest.raises(ValueError, match="_PrototypeClassifier computed no attention"):
        capture_attention(_PrototypeClassifier(), torch.randn(2, 3, 16, 16))
    model = nn.Sequential(ARCHITECTURES["timm deit (distilled)"][0](), nn.Linear(5, 3 * 16 * 16))
    model.append(_PrototypeClassifier()).eval()
    assert list(capture_attention(model, torch.randn(2, 3, 16, 16))) == ["0.blocks.0.attn", "0.blocks.1.attn"]


class _CrossAttention(nn.Module):
    """3 queries of one sequence over 7 keys of another, a learned bias per head and query-key offset added, and
    the logits soft-capped (``cap * tanh(logits / cap)``) before the softmax."""

    def __init__(self, heads: int = 2, dim: int = 8, cap: float = 2.0) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(dim, heads * dim), nn.Linear(dim, heads * dim)
        self.bias = nn.Parameter(torch.randn(heads, 3, 7))
        self.heads, self.cap = heads, cap

    def logits(self, queries, keys):
        q = self.q(queries).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        k = self.k(keys).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        return torch.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] ** 0.5 + self.bias

    def forward(self, queries, keys):
        return (self.cap * torch.tanh(self.logits(queries, keys) / self.cap)).softmax(-1) @ keys.unsqueeze(1)


def test_cross_attention_with_a_bias_and_capped_logits_is_read_as_computed():
    torch.manual_seed(0)
    model, queries, keys = _CrossAttention().eval(), torch.randn(2, 3, 8), torch.randn(2, 7, 8)
    with torch.no_grad(), attention_recording(model) as record:
        model(queries, keys)
    expected = (2.0 * torch.tanh(model.logits(queries, keys) / 2.0)).softmax(-1).detach()
    assert list(record.maps) == [""] and not record.unread
    torch.testing.assert_close(record.maps[""], expected)  # [B, H, Q, K] = [2, 2, 3, 7]


class _MixedHeads(_CrossAttention):
    """Talking heads written with einsum: a learned mix of the heads' logits before the softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.randn(2, 2))

    def forward(self, queries, keys):
        return torch.einsum("bhqk,hg->bgqk", self.logits(queries, keys), self.mix).softmax(-1) @ keys.unsqueeze(1)


def test_talking_heads_are_refused_by_name_not_returned_in_part():
    """A learned mix across heads between the query-key product and the softmax (CaiT's talking heads, written as
    linear layers; or as one einsum) is attention the capture cannot read: named, never a set that looks whole."""
    with attention_recording(model := _MixedHeads()) as record:
        model(torch.randn(2, 3, 8), torch.randn(2, 7, 8))
    assert record.unread == {"": "einsum"} and not record.maps
    cait = timm.create_model("cait_xxs24_224", pretrained=False, img_size=16, patch_size=4, depth=2, num_classes=5)
    x = torch.randn(2, 3, 16, 16)
    with pytest.raises(ValueError, match=r"Cait .* in blocks.0.attn, blocks.1.attn through permute, linear in proj_l"):
        capture_attention(cait.eval(), x)
    kept = capture_attention(cait, x, names=["blocks_token_only.0.attn"])  # the class attention it does read
    assert kept["blocks_token_only.0.attn"].shape == (2, 4, 1, 17)

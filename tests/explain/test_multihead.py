"""LRP through ``nn.MultiheadAttention``: its function re-expressed in linear, bilinear and softmax operations
computes what torch's does, and the relevance through it conserves the logit with every option of the module, in
torchvision's ViT, a SigLIP-style attention-pool head and a CLIP-style encoder."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import vitlab
from vitlab.explain import hilrp
from vitlab.layers import operations
from vitlab.testing_models import tiny_model

LRP_METHODS = ("lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma")

#: nn.MultiheadAttention's options: (constructor keywords, call keywords)
OPTIONS = {
    "batch_first": ({"batch_first": True}, {}),
    "sequence_first": ({"batch_first": False}, {}),
    "separate_kv_dims": ({"batch_first": True, "kdim": 6, "vdim": 5}, {}),
    "bias_kv": ({"batch_first": True, "add_bias_kv": True}, {}),
    "zero_attn": ({"batch_first": False, "add_zero_attn": True}, {}),
    "key_padding_mask": ({"batch_first": True}, {"key_padding_mask": "bool"}),
    "float_key_padding_mask": ({"batch_first": True}, {"key_padding_mask": "float"}),
    "attn_mask_2d": ({"batch_first": True}, {"attn_mask": "bool"}),
    "attn_mask_3d_float": ({"batch_first": False}, {"attn_mask": "float"}),
    "causal": ({"batch_first": True}, {"attn_mask": "causal", "is_causal": True}),
    "everything": (
        {"batch_first": False, "kdim": 6, "vdim": 5, "add_bias_kv": True, "add_zero_attn": True},
        {"key_padding_mask": "float", "attn_mask": "float"},
    ),
    "no_weights": ({"batch_first": True}, {"need_weights": False}),
    "no_weights_masked": ({"batch_first": True}, {"need_weights": False, "attn_mask": "causal", "is_causal": True}),
    "per_head_weights": ({"batch_first": True}, {"average_attn_weights": False}),
}


class _OneAttention(nn.Module):
    """Patches of an 8 x 8 image (4 tokens of width 8) through one ``nn.MultiheadAttention`` (2 heads) with the
    given options; the attention weights, where returned, gate the output so that their path is explained too."""

    def __init__(self, build: dict, call: dict) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.keys = nn.Linear(8, build.get("kdim", 8))
        self.values = nn.Linear(8, build.get("vdim", 8))
        self.attention = nn.MultiheadAttention(8, 2, **build)
        self.call = call
        self.head = nn.Linear(8, 4)

    def _masks(self, batch: int, tokens: int) -> dict[str, torch.Tensor]:
        masks = {}
        padding = torch.zeros(batch, tokens, dtype=torch.bool)
        padding[:, -1] = True  # the last key is padding
        if self.call.get("key_padding_mask"):
            bool_mask = self.call["key_padding_mask"] == "bool"
            masks["key_padding_mask"] = padding if bool_mask else padding.double() * -3.0
        kind = self.call.get("attn_mask")
        if kind == "bool":
            masks["attn_mask"] = torch.eye(tokens, dtype=torch.bool).roll(1, 1)
        elif kind == "float":
            per_head = torch.linspace(-1, 1, 2 * tokens * tokens, dtype=torch.float64).reshape(2, tokens, tokens)
            masks["attn_mask"] = per_head.repeat(batch, 1, 1)  # [B * H, L, S]
        elif kind == "causal":
            masks["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(tokens, dtype=torch.float64)
        return masks

    def attend(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens = self.embed(x).flatten(2).transpose(1, 2)  # [B, N, 8]
        query, key, value = tokens, self.keys(tokens), self.values(tokens)
        if not self.attention.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        flags = {k: v for k, v in self.call.items() if k in ("need_weights", "average_attn_weights", "is_causal")}
        out, weights = self.attention(query, key, value, **flags, **self._masks(*tokens.shape[:2]))
        return (out if self.attention.batch_first else out.transpose(0, 1)), weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, weights = self.attend(x)
        if weights is not None:  # [B, L, S'] or [B, H, L, S']: each image's largest weight scales its output
            out = out * weights.flatten(1, -2).amax((1, 2)).reshape(-1, 1, 1)
        return self.head(out.mean(1))


def _one_attention(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _OneAttention(*OPTIONS[name]).double().eval(), torch.randn(2, 3, 8, 8, dtype=torch.float64)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_decomposition_computes_what_torch_does(name: str, monkeypatch) -> None:
    model, x = _one_attention(name)
    model.train()  # torch's fused inference path would bypass both functions
    expected = model.attend(x)
    calls = []

    def decomposed(*args, **kwargs):
        calls.append(kwargs)
        return operations.multi_head_attention_forward(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "multi_head_attention_forward", decomposed)
    out, weights = model.attend(x)
    assert len(calls) == 1  # the module ran the decomposition
    torch.testing.assert_close(out, expected[0], rtol=1e-12, atol=1e-12)
    assert (weights is None) == (expected[1] is None)
    if weights is not None:
        torch.testing.assert_close(weights, expected[1], rtol=1e-12, atol=1e-12)


def test_unbatched_inputs_and_static_keys_compute_what_torch_does() -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2).double()
    query, source = torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    args = (8, 2, attention.in_proj_weight, attention.in_proj_bias, None, None, False, 0.0)
    args += (attention.out_proj.weight, attention.out_proj.bias)
    expected = torch.nn.functional.multi_head_attention_forward(query, source, source, *args, training=False)
    got = operations.multi_head_attention_forward(query, source, source, *args, training=False)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    static = {
        "static_k": torch.randn(2, 5, 4, dtype=torch.float64),
        "static_v": torch.randn(2, 5, 4, dtype=torch.float64),
    }
    batched = (query[:, None], source[:, None], source[:, None])
    expected = torch.nn.functional.multi_head_attention_forward(*batched, *args, training=False, **static)
    torch.testing.assert_close(
        operations.multi_head_attention_forward(*batched, *args, training=False, **static),
        expected,
        rtol=1e-12,
        atol=1e-12,
    )


@pytest.mark.parametrize("name", list(OPTIONS))
def test_lrp_through_multihead_attention_conserves(name: str) -> None:
    model, x = _one_attention(name)
    for method in LRP_METHODS:
        e = vitlab.explain(model, x, method=method)
        assert e.conservation.max() <= 1e-12, (method, e.conservation)
        torch.testing.assert_close(e.score, model(x).gather(1, e.target[:, None])[:, 0], rtol=1e-12, atol=1e-12)
        assert e.maps.abs().sum() > 0


def test_the_check_fails_when_the_decomposition_runs_outside_the_rules(monkeypatch) -> None:
    """Run without the mode, the decomposition's softmax and products pass their plain gradients: the shares no
    longer add up, so conservation through ``nn.MultiheadAttention`` is the rules' doing."""
    model, x = tiny_model("torchvision_vit", trained=True)
    rules = dict(hilrp._RULES)
    rules["multi_head_attention_forward"] = lambda mode, name, args, kwargs: operations.multi_head_attention_forward(
        *args, **kwargs
    )
    monkeypatch.setattr(hilrp, "_RULES", rules)
    assert vitlab.explain(model, x, method="lrp").conservation.min() > 1e-6


def _as_timm(torchvision_vit: nn.Module) -> nn.Module:
    """timm's ViT (qkv linear and ``scaled_dot_product_attention``) with the weights of torchvision's tiny ViT."""
    renames = {"class_token": "cls_token", "conv_proj": "patch_embed.proj", "encoder.pos_embedding": "pos_embed"}
    renames |= {"encoder.layers.encoder_layer_": "blocks.", "ln_1": "norm1", "ln_2": "norm2", "mlp.0": "mlp.fc1"}
    renames |= {"mlp.3": "mlp.fc2", "self_attention.in_proj_": "attn.qkv.", "self_attention.out_proj": "attn.proj"}
    renames |= {"encoder.ln": "norm", "heads.head": "head"}
    state = {}
    for key, value in torchvision_vit.state_dict().items():
        for old, new in renames.items():
            key = key.replace(old, new)
        state[key] = value
    shape = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_ratio": 2}
    model = timm.create_model("vit_tiny_patch16_224", num_classes=5, **shape).double()
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("method", LRP_METHODS)
def test_torchvision_vit_has_the_relevance_of_the_same_weights_in_timm(method: str) -> None:
    """The relevance through ``nn.MultiheadAttention`` equals that through timm's attention (a qkv linear and SDPA,
    with its own rule) carrying the same weights: the decomposition is the same attention, not just a consistent one."""
    model, x = tiny_model("torchvision_vit", trained=True)
    ours, reference = vitlab.explain(model, x, method=method), vitlab.explain(_as_timm(model), x, method=method)
    torch.testing.assert_close(ours.score, reference.score, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.maps, reference.maps, rtol=1e-9, atol=1e-12)
    assert ours.conservation.max() <= 1e-8


class _AttentionPool(nn.Module):
    """SigLIP's attention-pool head: a learned probe query attends over the tokens through
    ``nn.MultiheadAttention``, then a residual MLP (the MAP head of Zhai et al., "Scaling Vision Transformers",
    CVPR 2022, used by SigLIP, Zhai et al., ICCV 2023). ``tokens: [B, N, C] -> [B, C]``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, width))
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pooled = self.attention(self.probe.expand(tokens.shape[0], -1, -1), tokens, tokens)[0]
        pooled = pooled + self.fc2(nn.functional.gelu(self.fc1(self.norm(pooled)), approximate="tanh"))
        return pooled[:, 0]


class _QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class _ClipBlock(nn.Module):
    """CLIP's residual attention block (Radford et al., "Learning Transferable Visual Models From Natural Language
    Supervision", ICML 2021, sec. 2.4): pre-norm ``nn.MultiheadAttention`` on sequence-first tokens ``[N, B, C]``
    and a QuickGELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads)
        self.c_fc, self.gelu, self.c_proj = nn.Linear(width, 4 * width), _QuickGELU(), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class _TinyEncoder(nn.Module):
    """Patches, a class token and position embeddings, a LayerNorm before the blocks (CLIP's ``ln_pre``), two CLIP
    blocks, and a head: on the class token (``pool="clip"``) or by SigLIP's attention pool (``pool="siglip"``)."""

    def __init__(self, pool: str, width: int = 16, heads: int = 2, classes: int = 5) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4, bias=False)
        self.cls = nn.Parameter(torch.randn(width) * width**-0.5)
        self.position = nn.Parameter(torch.randn(17, width) * width**-0.5)
        self.ln_pre, self.ln_post = nn.LayerNorm(width), nn.LayerNorm(width)
        self.blocks = nn.Sequential(_ClipBlock(width, heads), _ClipBlock(width, heads))
        self.pool = _AttentionPool(width, heads) if pool == "siglip" else None
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)  # [B, 16, C]
        tokens = torch.cat([self.cls.expand(tokens.shape[0], 1, -1), tokens], 1) + self.position
        tokens = self.blocks(self.ln_pre(tokens).transpose(0, 1)).transpose(0, 1)
        pooled = tokens[:, 0] if self.pool is None else self.pool(tokens)
        return self.head(self.ln_post(pooled))


@pytest.mark.parametrize("pool", ["clip", "siglip"])
@pytest.mark.parametrize("method", LRP_METHODS)
def test_clip_and_siglip_style_encoders_conserve(pool: str, method: str) -> None:
    torch.manual_seed(0)
    model = _TinyEncoder(pool).double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    e = vitlab.explain(model, x, method=method)
    assert e.conservation.max() <= 1e-8, e.conservation
    torch.testing.assert_close(e.score, model(x).gather(1, e.target[:, None])[:, 0], rtol=1e-12, atol=1e-12)
    assert e.maps.abs().sum() > 0

"""HiLRP against the reference implementation (lxt 2.1, the AttnLRP authors' package) and its conditional
equivariance: patches permuted on a ViT without position embeddings, whole windows shifted on Swin."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

import vitlab


def _timm(name: str, **kw) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=5, **kw).double().eval()


def _lxt_rules():
    """lxt's efficient rules (``lxt/efficient/rules.py``: ``divide_gradient``, ``stop_gradient``,
    ``identity_rule_implicit``), read from the file: ``lxt.efficient`` itself imports transformers."""
    lxt = pytest.importorskip("lxt", reason="the AttnLRP reference is the optional lxt package (pip install lxt)")
    spec = importlib.util.spec_from_file_location("lxt_rules", Path(lxt.__path__[0]) / "efficient" / "rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lxt_relevance(model: nn.Module, x: torch.Tensor, target: int, softmax: str) -> torch.Tensor:
    """Gradient x Input of ``model`` patched as lxt patches a ViT: the identity rule on GELU, the normaliser of
    LayerNorm held constant, and in the attention the uniform rule on both products (AttnLRP) or the query and key
    held constant (CP-LRP)."""
    rules = _lxt_rules()

    def layer_norm(m: nn.LayerNorm):
        def forward(h):
            centred = h - h.mean(-1, keepdim=True)
            std = rules.stop_gradient((centred.pow(2).mean(-1, keepdim=True) + m.eps).sqrt())
            return centred / std * m.weight + m.bias

        return forward

    def attention(m: nn.Module):
        def forward(h, attn_mask=None, is_causal=False):
            B, N, C = h.shape
            q, k, v = m.qkv(h).reshape(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            if softmax == "attnlrp":
                logits = rules.divide_gradient(q * m.scale, 2) @ rules.divide_gradient(k, 2).transpose(-2, -1)
                attn = logits.softmax(-1)
                out = rules.divide_gradient(attn, 2) @ rules.divide_gradient(v, 2)
            else:
                attn = rules.stop_gradient(((q * m.scale) @ k.transpose(-2, -1)).softmax(-1))
                out = attn @ v
            return m.proj(out.transpose(1, 2).reshape(B, N, C))

        return forward

    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.forward = layer_norm(m)
        elif isinstance(m, nn.GELU):
            m.forward = lambda h: rules.identity_rule_implicit(nn.functional.gelu, h)
        elif type(m).__name__ == "Attention":
            m.forward = attention(m)
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x)[0, target], x)
    return (x * grad).sum(1).detach()


@pytest.mark.parametrize(("method", "softmax"), [("lrp", "attnlrp"), ("cp_lrp", "constant")])
def test_lrp_equals_the_attnlrp_reference_on_a_vit(method: str, softmax: str) -> None:
    kw = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2)
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours = vitlab.explain(_timm("vit_tiny_patch16_224", **kw), x, method=method, target=2).maps
    reference = _lxt_relevance(_timm("vit_tiny_patch16_224", **kw), x, 2, softmax)
    assert (ours - reference).abs().max() <= 1e-6 * reference.abs().max()


def _patches(x: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, C, H, W] -> [B, h*w, C, p, p]``."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C, p, p)


def _image(patches: torch.Tensor, side: int) -> torch.Tensor:
    B, _, C, p, _ = patches.shape
    h = side // p
    return patches.reshape(B, h, h, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, C, side, side)


def test_relevance_permutes_with_the_patches_of_a_vit_without_position_embeddings() -> None:
    model = _timm(
        "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, pos_embed="none"
    )
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    moved = _image(_patches(x, 4)[:, perm], 16)
    a, b = (vitlab.explain(model, img, method="lrp", target=1) for img in (x, moved))
    expected = _image(_patches(a.maps[:, None], 4)[:, perm], 16)[:, 0]
    torch.testing.assert_close(b.score, a.score, rtol=1e-12, atol=0)
    assert (b.maps - expected).abs().max() <= 1e-12 * a.maps.abs().max()


def test_relevance_shifts_with_whole_windows_on_swin_without_shifted_windows() -> None:
    """One block per stage: no shifted windows; a cyclic shift of the image by a window of the last stage (2 tokens
    of 4 pixels = 8 pixels) moves every window of every stage whole, so the prediction stays and the map shifts."""
    kw = dict(img_size=16, patch_size=2, window_size=2, embed_dim=8, depths=(1, 1), num_heads=(1, 2))
    model = _timm("swin_tiny_patch4_window7_224", **kw)
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    a, b = (vitlab.explain(model, img, method="lrp", target=0) for img in (x, x.roll((8, 8), (-2, -1))))
    torch.testing.assert_close(b.score, a.score, rtol=1e-12, atol=0)
    assert (b.maps - a.maps.roll((8, 8), (-2, -1))).abs().max() <= 1e-12 * a.maps.abs().max()
    c = vitlab.explain(model, x.roll((2, 2), (-2, -1)), method="lrp", target=0)
    assert (c.maps - a.maps.roll((2, 2), (-2, -1))).abs().max() > 1e-6 * a.maps.abs().max(), "conditional: a part"

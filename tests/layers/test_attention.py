"""The shared Attention: SDPA equals eager, capture, temperature forms (frozen heads: tests/dynamics)."""

import pytest
import torch

from vitlab.diagnostics.capture import capture_attention
from vitlab.layers import Attention, Block, attention_capture


def _attn(**kw):
    torch.manual_seed(0)
    return Attention(32, num_heads=4, **kw).eval()


@pytest.mark.parametrize("temperature", [False, True])
def test_sdpa_equals_eager(temperature):
    m = _attn(temperature=temperature)
    if temperature:
        with torch.no_grad():
            m.log_tau.copy_(torch.tensor([-0.5, 0.0, 0.3, 1.0]))
    x = torch.randn(3, 7, 32)
    fused = m(x)
    m.fused = False
    eager = m(x)
    torch.testing.assert_close(fused, eager, atol=1e-6, rtol=1e-5)


def test_size_bias_sdpa_equals_eager():
    m = _attn()
    x = torch.randn(2, 5, 32)
    size = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0]).view(1, 5, 1).expand(2, 5, 1)
    fused = m(x, size=size)
    m.fused = False
    torch.testing.assert_close(fused, m(x, size=size), atol=1e-6, rtol=1e-5)


def _manual_attention(m: Attention, x: torch.Tensor, form: str) -> torch.Tensor:
    B, N, _ = x.shape
    q, k, _ = m.qkv(x).view(B, N, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-2, -1) / m.head_dim**0.5
    tau = m.log_tau.exp().view(1, -1, 1, 1)
    logits = logits * tau if form == "inverse" else logits / tau
    return logits.softmax(-1)


@pytest.mark.parametrize("form", ["inverse", "divide"])
def test_temperature_multiplies_or_divides(form):
    m = _attn(temperature=True, temperature_form=form)
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.7, -0.7, 0.0, 1.2]))
    x = torch.randn(2, 6, 32)
    with attention_capture(m) as cap:
        m(x)
    got = cap.maps[""]
    torch.testing.assert_close(got, _manual_attention(m, x, form), atol=1e-6, rtol=1e-5)
    # high tau sharpens in the inverse form: the head with the largest tau has the lowest entropy
    ent = -(got * got.clamp_min(1e-12).log()).sum(-1).mean((0, 2))
    assert (ent.argmin() == 3) == (form == "inverse")


def test_capture_returns_stochastic_maps_and_resets():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(32, num_heads=4), Block(32, num_heads=4)).eval()
    maps = capture_attention(model, torch.randn(2, 9, 32))
    assert set(maps) == {"0.attn", "1.attn"}
    for a in maps.values():
        assert a.shape == (2, 4, 9, 9)
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 4, 9))
    assert all(not m.capture and m.captured is None for m in model.modules() if isinstance(m, Attention))


def test_capture_raises_without_attention():
    with pytest.raises(ValueError, match="computed no attention"):
        capture_attention(torch.nn.Linear(3, 3), torch.randn(1, 3))


def test_bad_head_count_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        Attention(30, num_heads=4)


@pytest.mark.parametrize("form", ["inverse", "divide"])
def test_temperature_gradient_matches_a_reference_formulation(form):
    """The temperature is folded into the q rows of W_qkv; its gradient must equal that of scaling the logits."""
    m = _attn(temperature=True, temperature_form=form).train()
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.4, -0.3, 0.0, 0.8]))
    x = torch.randn(2, 6, 32)
    target = torch.randn(2, 6, 32)
    (m(x) - target).square().sum().backward()
    got = m.log_tau.grad.clone()

    log_tau = m.log_tau.detach().clone().requires_grad_(True)
    B, N, C = x.shape
    q, k, v = m.qkv(x).view(B, N, 3, 4, 8).permute(2, 0, 3, 1, 4)
    tau = (log_tau if form == "inverse" else -log_tau).exp().view(1, -1, 1, 1)
    attn = (q @ k.transpose(-2, -1) / 8**0.5 * tau).softmax(-1)
    out = m.proj((attn @ v).transpose(1, 2).reshape(B, N, C))
    (out - target).square().sum().backward()
    torch.testing.assert_close(got, log_tau.grad, atol=1e-5, rtol=1e-4)

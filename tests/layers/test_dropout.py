"""vitlab's dropout draws only the dropped positions (p <= SPARSE_MAX_P) or its mask from the bits of one random call,
and keeps torch's dropout's distribution: the same keep rate and scaling (statistically), exact expectation,
independent elements, seeded masks, the mask's gradient, identity in eval, bit for bit what a masked fill gives."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers import dropout as dropout_module
from vitlab.layers.dropout import (
    SPARSE_MAX_P,
    Dropout,
    drop_mask,
    dropout,
    dropped_positions,
    keep_multiplier,
    kept_bits,
    quantized_drop_probability,
    realised_drop_probability,
    use_fast_dropout,
)
from vitlab.models import create_model


@pytest.fixture
def sparse(monkeypatch):
    """The sparse way on (``VITLAB_DROPOUT=sparse`` at import)."""
    monkeypatch.setattr(dropout_module, "SPARSE_MAX_P", 0.25)


@pytest.mark.parametrize("way", ["mask", "sparse"])
@pytest.mark.parametrize("p", [0.05, 0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_rate_and_scaling_match_torchs_dropout(p, dtype, way, monkeypatch):
    monkeypatch.setattr(dropout_module, "SPARSE_MAX_P", 0.25 if way == "sparse" else -1.0)
    torch.manual_seed(0)
    x = torch.ones(256, 65, 64, dtype=dtype)
    ours, theirs = dropout(x, p), F.dropout(x, p)
    n = x.numel()
    sigma = math.sqrt(p * (1 - p) / n)
    for out in (ours, theirs):  # both keep a share 1 - p of the elements, within 5 binomial standard deviations
        assert abs((out == 0).float().mean().item() - p) < 5 * sigma
    kept_ours, kept_theirs = ours[ours != 0].float().unique(), theirs[theirs != 0].float().unique()
    assert kept_ours.numel() == kept_theirs.numel() == 1  # every kept element is scaled by one factor
    assert kept_ours.item() == pytest.approx(kept_theirs.item(), rel=2e-3 if dtype == torch.bfloat16 else 1e-4)
    assert abs(quantized_drop_probability(p) - p) <= 2**-16


@pytest.mark.parametrize("way", ["mask", "sparse"])
@pytest.mark.parametrize("p", [0.2, 0.3])
def test_the_expectation_is_the_input_and_masks_are_independent_across_elements(p, way, monkeypatch):
    monkeypatch.setattr(dropout_module, "SPARSE_MAX_P", 0.25 if way == "sparse" else -1.0)
    torch.manual_seed(1)
    x = torch.randn(64, 1000)
    draws = torch.stack([dropout(x, p) for _ in range(200)])
    assert torch.allclose(draws.mean(0), x, atol=6 * x.abs().max().item() * math.sqrt(p / (1 - p) / 200))
    dropped = (draws == 0).float()
    # neighbouring elements (one 64-bit word; one geometric gap) are uncorrelated: P(both dropped) = p^2
    both = (dropped[:, :, :-1] * dropped[:, :, 1:]).mean().item()
    assert abs(both - p * p) < 0.005
    # and so are elements two apart, and the first and last of a row (the gaps do not restart per row)
    assert abs((dropped[:, :, :-2] * dropped[:, :, 2:]).mean().item() - p * p) < 0.005
    assert abs((dropped[:, :, 0] * dropped[:, :, -1]).mean().item() - p * p) < 0.01


def test_dropped_positions_are_a_bernoulli_process_over_the_whole_range(sparse):
    torch.manual_seed(0)
    n, p = 1_000_000, 0.05
    positions = dropped_positions(n, p)
    assert positions.dtype == torch.int64 and (positions.diff() > 0).all()
    assert positions[0] >= 0 and positions[-1] < n
    assert abs(len(positions) / n - p) < 5 * math.sqrt(p * (1 - p) / n)
    # each tenth of the range holds its share (no shortfall at the end), and the gaps are geometric: P(gap = 1) = p
    counts = torch.bincount(positions // (n // 10), minlength=10).float()
    assert (counts - n * p / 10).abs().max() < 5 * math.sqrt(n / 10 * p * (1 - p))
    gaps = positions.diff()
    assert abs((gaps == 1).float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / len(gaps))
    torch.manual_seed(0)
    # drawn 7 gaps at a time (the loop that tops up a short draw): the same generator stream, the same positions
    assert torch.equal(dropped_positions(n, p, draw=7), positions)
    assert realised_drop_probability(0.05) == 0.05 and realised_drop_probability(0.5) == quantized_drop_probability(0.5)


def test_the_default_is_the_mask_way_and_the_switch_is_read_from_the_environment():
    import subprocess
    import sys

    code = "import vitlab.layers.dropout as d; print(d.SPARSE_MAX_P)"
    values = {}
    for setting in ("", "sparse", "mask"):
        env = {k: v for k, v in __import__("os").environ.items() if k != "VITLAB_DROPOUT"}
        if setting:
            env["VITLAB_DROPOUT"] = setting
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        values[setting] = float(out.stdout)
    assert values == {"": -1.0, "sparse": 0.25, "mask": -1.0}


def test_masks_are_reproducible_under_a_seed_and_differ_without():
    x = torch.randn(8, 33, 17)
    torch.manual_seed(3)
    a = dropout(x, 0.2)
    torch.manual_seed(3)
    b = dropout(x, 0.2)
    assert torch.equal(a, b) and not torch.equal(a, dropout(x, 0.2))


def test_the_gradient_is_the_mask_times_the_scale_and_eval_is_identity():
    x = torch.randn(4, 10, 32, requires_grad=True)
    torch.manual_seed(0)
    out = dropout(x, 0.25)
    out.sum().backward()
    scale = 1 / (1 - quantized_drop_probability(0.25))
    assert torch.allclose(x.grad, (out != 0).float() * scale)
    module = Dropout(0.25).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\], got 1.5"):
        dropout(x, 1.5)


def test_models_built_by_create_model_use_it_and_keep_their_keys():
    model = create_model("swin_pico", img_size=16, drop_rate=0.1)
    plain = [m for m in model.modules() if type(m) is nn.Dropout]
    ours = [m for m in model.modules() if isinstance(m, Dropout)]
    assert not plain and ours and all(m.p in (0.0, 0.1) for m in ours)
    assert set(use_fast_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1))).state_dict()) == {"0.weight", "0.bias"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_positions_give_what_a_masked_fill_and_a_scale_give_bit_for_bit(dtype, sparse):
    x = torch.randn(3, 37, 29).to(dtype).transpose(1, 2).requires_grad_()  # not contiguous
    p = 0.1
    torch.manual_seed(5)
    out = dropout(x, p)
    torch.manual_seed(5)
    dropped = torch.zeros(x.numel(), dtype=torch.bool)
    dropped[dropped_positions(x.numel(), p)] = True
    dropped = dropped.view(x.shape)
    assert dropped.any() and not dropped.all()
    assert out.dtype == dtype and torch.equal(out, x.detach().masked_fill(dropped, 0).mul_(1 / (1 - p)))
    grad = torch.randn_like(out).transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous either
    out.backward(grad)
    assert torch.equal(x.grad, grad.masked_fill(dropped, 0).mul_(1 / (1 - p)))


@pytest.mark.parametrize("p", [0.3, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_multiplier_gives_what_a_masked_fill_and_a_scale_give_bit_for_bit(dtype, p):
    x = torch.randn(3, 37, 29).to(dtype).requires_grad_()
    assert p > SPARSE_MAX_P or SPARSE_MAX_P < 0  # the dense way
    scale = 1 / (1 - quantized_drop_probability(p))
    torch.manual_seed(5)
    out = dropout(x, p)
    torch.manual_seed(5)
    dropped = drop_mask(x.shape, p)
    assert dropped.any() and not dropped.all()
    assert out.dtype == dtype and torch.equal(out, x.detach().masked_fill(dropped, 0).mul_(scale))
    grad = torch.randn_like(out)
    out.backward(grad)
    assert torch.equal(x.grad, grad.masked_fill(dropped, 0).mul_(scale))
    torch.manual_seed(5)
    kept = keep_multiplier(x.shape, p, dtype, 1.0)
    assert kept.dtype == dtype and torch.equal(kept == 0, dropped) and set(kept.unique().tolist()) == {0.0, 1.0}


@pytest.mark.parametrize("p", [0.0001, 0.05, 0.3, 0.5, 0.99, 1.0])
def test_over_every_16_bit_pattern_the_mask_drops_exactly_the_quantized_share(p):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    kept = kept_bits(bits.clone(), p)
    assert set(kept.unique().tolist()) <= {-1, 0}  # all ones or all zeros: a bit pattern to select with
    assert (kept == 0).sum().item() == round(quantized_drop_probability(p) * 2**16)
    assert torch.equal(kept == 0, (bits >> 1) < dropout_module._threshold(p))  # drop_mask's rule


@pytest.mark.parametrize("way", ["mask", "sparse"])
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_a_compiled_dropout_is_drawn_inside_the_graph(p, way, monkeypatch):
    """Under torch.compile the compiler's own dropout: no graph break, each element dropped with probability p and
    the kept ones scaled by 1 / (1 - p)."""
    monkeypatch.setattr(dropout_module, "SPARSE_MAX_P", 0.25 if way == "sparse" else -1.0)
    torch._dynamo.reset()
    x = torch.rand(64, 32, 64) + 1.0
    explained = torch._dynamo.explain(lambda t: dropout(t, p) * 2)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    out = torch.compile(lambda t: dropout(t, p) * 2, backend="aot_eager")(x)
    kept = out != 0
    torch.testing.assert_close(out[kept], x[kept] * 2 / (1 - p))
    assert abs((~kept).float().mean().item() - p) < 0.02  # 131,072 draws: the share is p within 6 standard errors

"""HiLRP never books a term it has no rule for as absorbed: a square is the product ``x * x``, an integer power the
product of its factors, and every operation held constant enters only as a gain (a factor); used otherwise (in a
sum, or as the logit itself) it is refused by name."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vitlab
from vitlab.explain import MethodRefused, hilrp


class _Head(torch.nn.Module):
    """A bias-free linear map to 4 values ``t``, then ``f(t)``: nothing is absorbed unless ``f`` makes it so."""

    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.f = f
        self.linear = torch.nn.Linear(48, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.linear(x.flatten(1)))


def _explain(f: Callable[[torch.Tensor], torch.Tensor]):
    torch.manual_seed(0)
    model = _Head(f).double().eval()
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    return vitlab.explain(model, x, method="lrp", target=torch.tensor([0, 1]))


@pytest.mark.parametrize(
    "square",
    [lambda t: t * t, lambda t: t.square(), lambda t: t.pow(2), lambda t: t**2, lambda t: torch.pow(t, 2.0)],
    ids=["t*t", "square", "pow(2)", "**2", "torch.pow(t, 2.0)"],
)
def test_a_square_is_the_bilinear_product_and_its_share_is_the_inputs(square):
    e = _explain(lambda t: t + square(t))
    torch.testing.assert_close(e.input_share, torch.ones(2, dtype=torch.float64))  # nothing absorbed
    assert e.conservation.max() <= 1e-12


def test_an_integer_power_conserves_and_a_power_of_the_input_is_refused():
    e = _explain(lambda t: t**3 - t.pow(4))
    torch.testing.assert_close(e.input_share, torch.ones(2, dtype=torch.float64))
    with pytest.raises(MethodRefused, match="no relevance rule for pow with an exponent that carries relevance"):
        _explain(lambda t: 2**t)


#: every operation the engine holds constant, applied to ``t`` so that its value is defined (and a rounding one to
#: ``100 t``, so that no logit rounds to 0)
HELD: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sqrt": lambda t: (t.abs() + 1).sqrt(),
    "rsqrt": lambda t: (t.abs() + 1).rsqrt(),
    "norm": lambda t: t.norm(dim=-1, keepdim=True),
    "vector_norm": lambda t: torch.linalg.vector_norm(t, dim=-1, keepdim=True),
    "var": lambda t: t.var(-1, keepdim=True),
    "std": lambda t: t.std(-1, keepdim=True),
    "var_mean": lambda t: torch.var_mean(t, -1, keepdim=True)[0],
    "std_mean": lambda t: torch.std_mean(t, -1, keepdim=True)[0],
    "reciprocal": lambda t: (t.abs() + 1).reciprocal(),
    "sign": lambda t: t.sign(),
    "floor": lambda t: (100 * t).floor(),
    "ceil": lambda t: (100 * t).ceil(),
    "round": lambda t: (100 * t).round(),
    "trunc": lambda t: (100 * t).trunc(),
    "frac": lambda t: (100 * t).frac(),
}


def test_every_operation_held_constant_is_tested_here():
    assert set(HELD) == hilrp.CONSTANT


@pytest.mark.parametrize("name", sorted(HELD))
def test_an_operation_held_constant_enters_only_as_a_gain(name):
    """As a factor it scales the relevance and keeps it the input's; in a sum, or as the logit, it is refused by
    name, since its share would otherwise be booked as absorbed (or autograd would fail on a logit without one)."""
    held = HELD[name]
    e = _explain(lambda t: t * held(t))
    torch.testing.assert_close(e.input_share, torch.ones(2, dtype=torch.float64))
    assert e.conservation.max() <= 1e-12
    with pytest.raises(MethodRefused, match=rf"the output of {name}, which carries no relevance back .* enters a sum"):
        _explain(lambda t: t + held(t))
    with pytest.raises(MethodRefused, match=rf"no relevance reaches the logit: {name} carries none back"):
        _explain(lambda t: held(t).expand(-1, 4))


def test_a_cut_that_is_no_gain_is_refused_by_name_too():
    with pytest.raises(MethodRefused, match="the output of long, which carries no relevance back"):
        _explain(lambda t: t + (100 * t).long().double())  # not all 0: a sum of zeros (or -inf) books nothing
    with pytest.raises(MethodRefused, match="no relevance reaches the logit: detach carries none back"):
        _explain(lambda t: t.detach() * 2)


def _masked_softmax(t: torch.Tensor, additive: bool) -> torch.Tensor:
    """``softmax`` over the values above the row's median, the others masked as empty slots are: a key bias of
    ``log(occupied)`` (0 or ``-inf``) computed from the detached values, added or passed to SDPA as its mask."""
    occupied = (t.detach() > t.detach().median(-1, keepdim=True).values).to(t.dtype)
    if additive:
        return torch.softmax(t + occupied.log(), -1) * t
    q = t[:, None, :, None]  # [B, 1, 4, 1]: four tokens of one channel, attending to each other
    bias = occupied.log()[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bias)[:, 0, :, 0]


@pytest.mark.parametrize("additive", [True, False], ids=["added", "sdpa mask"])
def test_a_mask_of_zeros_and_minus_infinity_computed_from_the_input_is_a_mask(additive):
    """Its share is zero (a masked logit takes no gradient), so it may enter the sum: nothing is absorbed for it."""
    e = _explain(lambda t: _masked_softmax(t, additive))
    assert torch.isfinite(e.maps).all() and e.conservation.max() <= 1e-12
    with pytest.raises(MethodRefused, match="the output of detach, which carries no relevance back"):
        _explain(lambda t: torch.softmax(t + t.detach().clamp_min(0).log1p(), -1) * t)  # a bias, not a mask

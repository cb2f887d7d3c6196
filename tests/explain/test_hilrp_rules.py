"""HiLRP's rules pin which input receives relevance, not only that it is conserved: two-token examples worked by
hand (a rule that moved relevance between the tokens while keeping the sum would fail them). The logit is
``f(x)`` of an input ``x = (x0, x1)`` held as a ``[1, 1, 1, 2]`` image; the relevance of ``x_i`` is
``x_i * dlogit/dx_i`` under the rules (Gradient x Input, AttnLRP sec. 3)."""

import pytest
import torch
from torch import nn

from vitlab.explain.hilrp import Variant, relevance

X = torch.tensor([[[[3.0, 1.0]]]], dtype=torch.float64)  # x0 = 3, x1 = 1
TARGET = torch.tensor([0])
LRP_0 = Variant()  # linear maps take the gradient


def _linear() -> nn.Linear:
    """``z = 1 * x0 - 2 * x1 + 0.5`` = 1.5 at X."""
    layer = nn.Linear(2, 1).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -2.0]]))
        layer.bias.fill_(0.5)
    return layer


def _run(model, logits_of, x=X, variant=LRP_0):
    maps, absorbed, logit = relevance(model, logits_of, x, TARGET, variant)
    return maps.flatten().tolist(), float(absorbed[0]), float(logit[0])


def _of_linear(model, x):
    return model(x.flatten(1))


def test_a_product_of_two_tokens_gives_each_half():
    """AttnLRP prop. 3.2, the uniform rule: ``x0 * x1`` = 6 gives (3, 3) whatever the tokens' sizes; the gradient
    alone would give (3, 3) twice over (12 in all), and a 70/30 split (4.2, 1.8) keeps the sum."""
    x = torch.tensor([[[[2.0, 3.0]]]], dtype=torch.float64)

    def product(model, x):
        a, b = x.flatten(1).unbind(1)
        return torch.mul(a, b).reshape(1, 1)

    maps, absorbed, logit = _run(nn.Identity(), product, x)
    assert logit == 6.0 and absorbed == 0.0
    assert maps == pytest.approx([3.0, 3.0])


def test_a_product_with_a_constant_gives_the_token_all():
    """One side constant (a weight, a mask): no split, the token takes all of ``c * x1`` = 4 * 3."""
    x = torch.tensor([[[[2.0, 3.0]]]], dtype=torch.float64)

    def scaled(model, x):
        return torch.mul(x.flatten(1)[:, 1:], 4.0)

    maps, absorbed, logit = _run(nn.Identity(), scaled, x)
    assert logit == 12.0 and maps == pytest.approx([0.0, 12.0]) and absorbed == 0.0


def test_lrp_zero_gives_each_token_its_term_and_the_bias_is_absorbed():
    maps, absorbed, logit = _run(_linear(), _of_linear)
    assert logit == pytest.approx(1.5)
    assert maps == pytest.approx([3.0, -2.0]) and absorbed == pytest.approx(0.5)


def test_epsilon_shrinks_each_term_by_z_over_z_plus_eps():
    """``R_i = x_i w_i z / (z + eps sign z)``: with eps = 0.01, (3, -2) * 1.5 / 1.51; the rest is absorbed."""
    maps, absorbed, logit = _run(_linear(), _of_linear, variant=Variant(linear="epsilon", epsilon=0.01))
    factor = 1.5 / 1.51
    assert maps == pytest.approx([3.0 * factor, -2.0 * factor])
    assert absorbed == pytest.approx(1.5 - factor) and sum(maps) + absorbed == pytest.approx(logit)


def test_gamma_favours_the_token_behind_the_positive_weight():
    """``R_i = x_i (w_i + gamma w_i+) z / (x . (w + gamma w+) + b)`` (Montavon et al. 2019, sec. 10.2): with
    gamma = 0.25, w + gamma w+ = (1.25, -2), the boosted z = 3.75 - 2 + 0.5 = 2.25, so R = (3.75, -2) * 1.5 / 2.25
    = (2.5, -4/3): the positive token gains on LRP-0's (3, -2) ratio of -1.5, now -1.875."""
    maps, absorbed, logit = _run(_linear(), _of_linear, variant=Variant(linear="gamma", gamma=0.25))
    assert maps == pytest.approx([2.5, -4.0 / 3.0])
    assert absorbed == pytest.approx(1.5 - 1.75 * 1.5 / 2.25) and sum(maps) + absorbed == pytest.approx(logit)

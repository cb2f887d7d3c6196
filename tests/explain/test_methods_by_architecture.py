"""Every method on every architecture: a finite map at input resolution, or a refusal that names the method and
the reason; the gradient methods against autograd written out."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.explain import METHODS, MethodRefused
from vitlab.testing_models import ARCHITECTURES, tiny_model


def _every_method_applies_or_is_refused(name: str) -> None:
    model, x = tiny_model(name)
    x = x[:1]
    applied = 0
    for method in METHODS:
        try:
            e = vitlab.explain(model, x, method=method)
        except MethodRefused as err:
            assert str(err).startswith(f"{method} does not apply to "), err
            continue
        assert e.maps.shape == (1, *x.shape[2:]) and torch.isfinite(e.maps).all(), method
        applied += 1
    assert applied >= 10  # the LRP variants and the captum methods apply to every architecture


@pytest.mark.parametrize("name", ["deit"])
def test_every_method_applies_or_is_refused(name: str) -> None:
    _every_method_applies_or_is_refused(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ARCHITECTURES) - {"deit"}))
def test_every_method_applies_or_is_refused_everywhere(name: str) -> None:
    _every_method_applies_or_is_refused(name)


def test_saliency_and_input_x_gradient_are_the_gradient_written_out() -> None:
    model, x = tiny_model("xcit")
    x = x[:1].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x)[0, 2], x)
    saliency = vitlab.explain(model, x.detach(), method="saliency", target=2).maps
    product = vitlab.explain(model, x.detach(), method="input_x_gradient", target=2).maps
    torch.testing.assert_close(saliency, grad.abs().sum(1))
    torch.testing.assert_close(product, (x * grad).sum(1).detach())

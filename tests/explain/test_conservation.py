"""HiLRP's conservation on every architecture: input relevance plus what the rules absorb equals the logit."""

from __future__ import annotations

import pytest
import torch

import vitlab
from benchmarks.experiments.explain_architectures import ARCHITECTURES, tiny_model
from vitlab.explain import MethodRefused, hilrp

LRP_METHODS = ("lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma")
#: timm's EfficientViT runs its linear attention in float32 whatever the model's dtype (``LiteMla`` casts q, k, v)
TOLERANCE = {"efficientvit": 1e-6}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
@pytest.mark.parametrize("trained", [False, True], ids=["init", "trained"])
def test_lrp_conserves_the_logit_in_float64(name: str, trained: bool) -> None:
    model, x = tiny_model(name, trained=trained)
    e = vitlab.explain(model, x, method="lrp")
    assert e.maps.shape == x.shape[:1] + x.shape[2:]
    assert e.conservation.max() <= TOLERANCE.get(name, 1e-10), e.conservation
    assert e.maps.abs().sum() > 0


@pytest.mark.parametrize("name", ["vit", "swin", "cet_vit", "pvt_v2", "xcit", "efficientvit"])
@pytest.mark.parametrize("method", LRP_METHODS[1:])
def test_every_lrp_variant_conserves(name: str, method: str) -> None:
    model, x = tiny_model(name, trained=True)
    assert vitlab.explain(model, x, method=method).conservation.max() <= TOLERANCE.get(name, 1e-10)


def test_lrp_conserves_to_float32_precision() -> None:
    model, x = tiny_model("swin", trained=True)
    assert vitlab.explain(model.float(), x.float(), method="lrp").conservation.max() <= 1e-3


def test_the_check_fails_when_a_nonlinearity_passes_its_gradient(monkeypatch) -> None:
    """The ledger is a real check: with GELU's plain gradient instead of its rule, the shares no longer add up."""
    model, x = tiny_model("vit", trained=True)
    monkeypatch.setattr(hilrp, "ELEMENTWISE", hilrp.ELEMENTWISE - {"gelu"})
    monkeypatch.setattr(hilrp, "PASS", hilrp.PASS | {"gelu"})
    assert vitlab.explain(model, x, method="lrp").conservation.min() > 1e-6


class _LogModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x.abs() + 1).flatten(1)[:, :4]


def test_an_operation_without_a_rule_is_refused_by_name() -> None:
    with pytest.raises(MethodRefused, match=r"^lrp has no relevance rule for log on a tensor that carries relevance"):
        vitlab.explain(_LogModel(), torch.randn(1, 3, 4, 4), method="lrp")


def test_the_input_share_is_reported_beside_conservation() -> None:
    model, x = tiny_model("cet_vit", trained=True)
    e = vitlab.explain(model, x, method="lrp")
    total = e.maps.flatten(1).sum(1)
    torch.testing.assert_close(e.input_share, total / e.score)

"""HiLRP's conservation on every architecture: input relevance plus what the rules absorb equals the logit."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.explain import MethodRefused, hilrp
from vitlab.testing_models import ARCHITECTURES, HF_TINY, hf_model, tiny_model

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


@pytest.mark.parametrize("name", ["vit", "swin", "cet_vit", "pvt_v2", "xcit", "efficientvit", "hf_siglip"])
@pytest.mark.parametrize("method", LRP_METHODS[1:])
def test_every_lrp_variant_conserves(name: str, method: str) -> None:
    model, x = tiny_model(name, trained=True)
    assert vitlab.explain(model, x, method=method).conservation.max() <= TOLERANCE.get(name, 1e-10)


def test_lrp_conserves_to_float32_precision() -> None:
    model, x = tiny_model("swin", trained=True)
    assert vitlab.explain(model.float(), x.float(), method="lrp").conservation.max() <= 1e-3


def test_hf_eager_attention_conserves_to_its_float32_softmax() -> None:
    """HF transformers' eager attention takes its softmax in float32 whatever the model's dtype; its SDPA path (the
    default, in ``ARCHITECTURES``) conserves in float64."""
    torch.manual_seed(0)
    model = hf_model("ViT", **HF_TINY, attn_implementation="eager").double().eval()
    e = vitlab.explain(model, torch.randn(2, 3, 16, 16, dtype=torch.float64), method="lrp")
    assert e.conservation.max() <= 1e-6, e.conservation


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
    message = r"^lrp does not apply to _LogModel: no relevance rule for log on a tensor that carries relevance; "
    with pytest.raises(MethodRefused, match=message):
        vitlab.explain(_LogModel(), torch.randn(1, 3, 4, 4), method="lrp")


def test_the_input_share_is_reported_beside_conservation() -> None:
    model, x = tiny_model("cet_vit", trained=True)
    e = vitlab.explain(model, x, method="lrp")
    total = e.maps.flatten(1).sum(1)
    torch.testing.assert_close(e.input_share, total / e.score)


class _Handmade(torch.nn.Module):
    """A network no adapter knows, written with plain tensor operations of every rule type: a class token by ``cat``,
    a manual RMSNorm, einsum attention with a manual softmax under a mask, a sigmoid gate, in-place writes into a
    constant buffer, ``where`` with a number, ``F.pad`` with ones, ``F.normalize`` and a ``+=``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.token = torch.nn.Parameter(torch.randn(1, 1, 8))
        self.qkv = torch.nn.Linear(8, 24)
        self.gate = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(9, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], 1)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        q, k, v = self.qkv(h).chunk(3, -1)
        logits = torch.einsum("bnc,bmc->bnm", q, k).masked_fill(torch.eye(h.shape[1], dtype=torch.bool), -1e4)
        weights = (logits - logits.amax(-1, keepdim=True)).exp()
        h2 = torch.einsum("bnm,bmc->bnc", weights / weights.sum(-1, keepdim=True), v)
        h2 = h2 * torch.sigmoid(self.gate(h))
        buffer = torch.full_like(h2, 0.5)
        buffer[:, 1:] = h2[:, 1:]
        buffer += h
        pooled = torch.nn.functional.normalize(torch.where(buffer > 0, buffer, 0.1), dim=-1)
        return self.head(torch.nn.functional.pad(pooled[:, 0], (0, 1), value=1.0))


def test_a_network_no_adapter_knows_conserves() -> None:
    torch.manual_seed(0)
    model = _Handmade().double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    for method in LRP_METHODS:
        e = vitlab.explain(model, x, method=method)
        assert e.conservation.max() <= 1e-12, (method, e.conservation)


def test_the_check_fails_when_an_in_place_write_passes_without_its_rule(monkeypatch) -> None:
    torch.manual_seed(0)
    model = _Handmade().double().eval()
    rules = dict(hilrp._RULES)
    del rules["setitem"]
    monkeypatch.setattr(hilrp, "_RULES", rules)
    monkeypatch.setattr(hilrp, "PASS", hilrp.PASS | {"setitem"})
    assert vitlab.explain(model, torch.randn(2, 3, 8, 8, dtype=torch.float64), method="lrp").conservation.min() > 1e-6

"""The conservative LRP rules: input relevance plus the absorbed share equals the logit, on every family."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.models import create_model

#: small models of each family at 16 x 16 (patch 4: a 4 x 4 grid; Swin patch 2 with window 2, two stages)
FAMILIES = {
    "vit": dict(name="vit_pico", img_size=16, patch_size=4, depth=2),
    "tome": dict(name="tome_pico", img_size=16, patch_size=4, depth=2, tome_r=3),
    "swin": dict(name="swin_pico", img_size=16, patch_size=2, window_size=2, depths=(1, 1), num_heads=(1, 2)),
    "cet_vit": dict(name="cet_vit_pico", img_size=16, patch_size=2),
    "vitcae": dict(name="vitcae_pico", img_size=16, patch_size=4, depth=2, in_chans=3),
}


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = dict(FAMILIES[kind])
    return create_model(kw.pop("name"), num_classes=5, **kw)


def _train_a_few_steps(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Three Adam steps on random labels, so that the rules are checked away from the initial weights too."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    labels = torch.arange(x.shape[0]) % 5
    model.train()
    for _ in range(3):
        out = model(x)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        torch.nn.functional.cross_entropy(logits, labels).backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("kind", list(FAMILIES))
@pytest.mark.parametrize("trained", [False, True], ids=["init", "trained"])
def test_lrp_conserves_the_logit_in_float64(kind: str, trained: bool) -> None:
    model = _model(kind)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    if trained:
        _train_a_few_steps(model, x)
    model = model.double()
    explanation = vitlab.explain(model, x.double(), method="lrp")
    assert explanation.kind == kind
    assert explanation.maps.shape == (3, 16, 16)
    assert explanation.conservation.max() <= 1e-6, explanation.conservation
    assert explanation.maps.abs().sum() > 0


@pytest.mark.parametrize("kind", ["vit", "swin", "cet_vit"])
def test_lrp_conserves_to_float32_precision(kind: str) -> None:
    model = _model(kind)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    assert vitlab.explain(model, x, method="lrp").conservation.max() <= 1e-3


def test_lrp_without_the_detached_gains_does_not_conserve() -> None:
    """The check can fail: plain Gradient x Input (no rules) leaves a large part of the logit unaccounted for."""
    from vitlab.explain.adapters import explainer_for
    from vitlab.explain.api import lrp_relevance

    model = _model("vit").double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    target = torch.tensor([0, 1])
    for linearise, conserved in ((False, False), (True, True)):
        relevance, absorbed, score = lrp_relevance(model, explainer_for(model), x, target, linearise=linearise)
        error = (relevance.flatten(1).sum(1) + absorbed - score).abs() / score.abs()
        assert bool((error <= 1e-6).all()) is conserved, error

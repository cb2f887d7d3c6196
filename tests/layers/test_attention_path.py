"""The attention path is chosen by measurement, once per key: every path computes the same attention and gradients,
the choice is cached and listed, the measurement leaves the random state alone, and a path can be forced."""

from __future__ import annotations

import pytest
import torch

from vitlab.layers import attention_path
from vitlab.layers.attention_path import PATHS, attend, clear_decisions, decisions, force_attention_path, run_path
from vitlab.models import create_model


@pytest.fixture(autouse=True)
def fresh_decisions():
    clear_decisions()
    yield
    force_attention_path(None)
    clear_decisions()


def _qkv(requires_grad: bool = True):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 9, 8, generator=g, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("path", PATHS)
def test_every_path_gives_the_same_attention_and_gradients(path):
    bias = torch.randn(2, 1, 1, 9)
    reference_inputs, inputs = _qkv(), _qkv()
    reference = run_path("sdpa", *reference_inputs, bias, scale=0.3, dropout_p=0.0)
    out = run_path(path, *inputs, bias, scale=0.3, dropout_p=0.0)
    assert torch.allclose(out, reference, atol=1e-5)
    reference.square().sum().backward()
    out.square().sum().backward()
    for ours, theirs in zip(inputs, reference_inputs, strict=True):
        assert torch.allclose(ours.grad, theirs.grad, atol=1e-4)


def test_the_choice_is_measured_once_per_key_and_listed():
    q, k, v = _qkv()
    attend(q, k, v, scale=0.3)
    attend(q, k, v, scale=0.3)
    with torch.no_grad():
        attend(q, k, v, scale=0.3)
    listed = decisions()
    assert [d["backward"] for d in listed] == [True, False]
    assert all(d["path"] in PATHS and set(d["seconds"]) == set(PATHS) for d in listed)
    assert listed[0]["shape"] == (2, 3, 9, 8) and listed[0]["dtype"] == "torch.float32"


def test_the_measurement_leaves_the_random_state_as_it_was():
    q, k, v = _qkv()
    torch.manual_seed(5)
    attend(q, k, v, scale=0.3)  # measures every path
    assert len(decisions()) == 1
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), after)


def test_with_attention_dropout_the_eager_path_draws_vitlabs_mask_without_measuring():
    q, k, v = _qkv()
    torch.manual_seed(5)
    out = attend(q, k, v, scale=0.3, dropout_p=0.5)
    torch.manual_seed(5)
    assert torch.equal(out, run_path("eager", q, k, v, None, scale=0.3, dropout_p=0.5)) and decisions() == []


def test_a_forced_path_is_used_without_measuring_and_a_bad_one_is_refused(monkeypatch):
    calls = []
    monkeypatch.setattr(attention_path, "run_path", lambda path, *a, **kw: calls.append(path) or a[0])
    force_attention_path("math")
    attend(*_qkv(), scale=0.3)
    force_attention_path(None)
    monkeypatch.setenv("VITLAB_ATTENTION_PATH", "eager")
    attend(*_qkv(), scale=0.3)
    assert calls == ["math", "eager"] and decisions() == []
    monkeypatch.setenv("VITLAB_ATTENTION_PATH", "flash2")
    with pytest.raises(ValueError, match="VITLAB_ATTENTION_PATH='flash2' is not an attention path"):
        attend(*_qkv(), scale=0.3)
    with pytest.raises(ValueError, match="attention path must be one of sdpa, math, eager"):
        force_attention_path("fast")


def test_swin_window_attention_is_chosen_too_and_both_of_its_paths_agree():
    torch.manual_seed(0)
    model = create_model("swin_pico", img_size=16).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        chosen = model(x)
        assert {d["kind"] for d in decisions()} == {"window"}
        outs = []
        for path in ("sdpa", "eager"):
            force_attention_path(path)
            outs.append(model(x))
    assert torch.allclose(outs[0], outs[1], atol=1e-5) and torch.allclose(chosen, outs[0], atol=1e-5)

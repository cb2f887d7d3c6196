"""The attention methods against hand-computed products, integrated gradients against an independent sum, and the
refusals of methods that do not apply."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab.explain import MethodRefused
from vitlab.explain.methods import attention_rollout, gradient_rollout
from vitlab.models import create_model


def _vit(depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("vit_pico", num_classes=4, img_size=16, patch_size=4, depth=depth).double().eval()


def _images(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def _patch_values(maps: torch.Tensor, patch: int = 4) -> torch.Tensor:
    """``[B, H, W]`` nearest-upsampled patch maps -> ``[B, patches]``."""
    return maps[:, ::patch, ::patch].flatten(1)


def test_rollout_is_the_product_of_the_mixed_attention_of_both_layers() -> None:
    model, x = _vit(), _images()
    maps = vitlab.capture_attention(model, x)  # the model's own capture path, not the explainer's recorder
    eye = torch.eye(17, dtype=torch.float64)
    first, second = (0.5 * maps[f"blocks.{i}.attn"].mean(1) + 0.5 * eye for i in (0, 1))
    expected = (second @ first)[:, 0, 1:]
    got = _patch_values(vitlab.explain(model, x, method="rollout").maps)
    torch.testing.assert_close(got, expected)
    last = _patch_values(vitlab.explain(model, x, method="attention").maps)
    torch.testing.assert_close(last, maps["blocks.1.attn"].mean(1)[:, 0, 1:])


def test_rollout_of_one_head_worked_by_hand() -> None:
    a = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]]]])  # [B=1, H=1, 2, 2]
    # 0.5 A + 0.5 I = [[0.6, 0.4], [0.3, 0.7]]; two layers: row 0 of its square = [0.48, 0.52]
    torch.testing.assert_close(attention_rollout([a, a], prefix=0), torch.tensor([[0.48, 0.52]]))


def test_gradient_rollout_worked_by_hand() -> None:
    a = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]], [[0.5, 0.5], [0.1, 0.9]]]])  # [B=1, H=2, 2, 2]
    g = torch.tensor([[[[1.0, 2.0], [0.0, 1.0]], [[-4.0, 1.0], [3.0, -1.0]]]])
    # (g * A)^+ per head: [[0.2, 1.6], [0, 0.4]] and [[0, 0.5], [0.3, 0]]; head mean [[0.1, 1.05], [0.15, 0.2]]
    # one layer: R = I + A_bar; row 0 = [1.1, 1.05]; two layers: R2 = R + A_bar R, row 0 = [1.1 + 0.2675, 1.05 + 1.365]
    one = gradient_rollout([a], [g], prefix=0)
    torch.testing.assert_close(one, torch.tensor([[1.1, 1.05]]))
    two = gradient_rollout([a, a], [g, g], prefix=0)
    torch.testing.assert_close(two, torch.tensor([[1.3675, 2.415]]))


def test_gradient_rollout_uses_the_gradient_of_the_explained_class() -> None:
    model, x = _vit(), _images(1)
    maps = [vitlab.explain(model, x, method="grad_rollout", target=c).maps for c in range(2)]
    assert not torch.allclose(maps[0], maps[1])
    assert (maps[0] >= 0).all()


def _riemann_integrated_gradients(model: torch.nn.Module, x: torch.Tensor, target: int, steps: int) -> torch.Tensor:
    """IG from a zero baseline by the midpoint rule (Sundararajan et al. 2017, eq. 3), written out."""
    total = torch.zeros_like(x)
    for k in range(steps):
        point = ((k + 0.5) / steps * x).requires_grad_()
        total += torch.autograd.grad(model(point)[:, target].sum(), point)[0]
    return (x * total / steps).sum(1)


def test_integrated_gradients_match_an_independent_sum_and_are_complete() -> None:
    model, x = _vit(), _images(1)
    explanation = vitlab.explain(model, x, method="integrated_gradients", target=1)
    reference = _riemann_integrated_gradients(model, x, 1, steps=200)
    torch.testing.assert_close(explanation.maps, reference, rtol=1e-3, atol=1e-3 * reference.abs().max().item())
    with torch.no_grad():
        gap = model(x)[0, 1] - model(torch.zeros_like(x))[0, 1]
    assert abs(explanation.maps.sum() - gap) <= 1e-3 * abs(explanation.score[0])
    assert explanation.conservation[0] <= 1e-3


def test_gradcam_matches_the_library_on_the_last_block() -> None:
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model, x = _vit(), _images(2)
    got = vitlab.explain(model, x, method="gradcam", target=2).maps

    def grid(t: torch.Tensor) -> torch.Tensor:
        return t[:, 1:].reshape(t.shape[0], 4, 4, -1).permute(0, 3, 1, 2)

    with GradCAM(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=grid) as cam:
        expected = cam(input_tensor=x, targets=[ClassifierOutputTarget(2)] * 2)
    torch.testing.assert_close(got, torch.as_tensor(expected))


@pytest.mark.parametrize(
    ("preset", "kw", "method", "reason"),
    [
        ("tome_pico", dict(img_size=16, patch_size=4, depth=2, tome_r=3), "rollout", "Token Merging"),
        ("tome_pico", dict(img_size=16, patch_size=4, depth=2, tome_r=3), "gradcam", "Token Merging"),
        (
            "swin_pico",
            dict(img_size=16, patch_size=2, window_size=2, depths=(1, 1), num_heads=(1, 2)),
            "attention",
            "windows",
        ),
        ("cet_vit_pico", dict(img_size=16, patch_size=2), "grad_rollout", "slots"),
        ("vit_pico", dict(img_size=16, patch_size=4, depth=1, global_pool="avg"), "rollout", "CLS"),
    ],
)
def test_methods_that_do_not_apply_are_refused_by_name(preset, kw, method, reason) -> None:
    model = create_model(preset, num_classes=4, **kw)
    with pytest.raises(MethodRefused, match=rf"^{method} does not apply to .*{reason}"):
        vitlab.explain(model, torch.randn(1, 3, 16, 16), method=method)


def test_unknown_method_and_bad_target_are_one_line_errors() -> None:
    model = _vit(1)
    with pytest.raises(ValueError, match="unknown explanation method 'lime'; choose one of attention"):
        vitlab.explain(model, _images(1), method="lime")
    with pytest.raises(ValueError, match=r"target classes must lie in \[0, 4\)"):
        vitlab.explain(model, _images(1), method="rollout", target=7)


def test_a_timm_model_is_told_which_methods_apply_to_it() -> None:
    model = create_model("timm:resnet18", num_classes=4)
    with pytest.raises(MethodRefused) as refused:
        vitlab.explain(model, torch.randn(1, 3, 16, 16), method="rollout")
    message = str(refused.value)
    assert "these methods apply to it: lrp, cp_lrp, lrp_epsilon, lrp_gamma, saliency" in message
    assert "Family" not in message  # advice for a family's author, not for a user of timm's model

"""``vitlab.explain(model, images, method=..., target=None) -> Explanation``: which pixels a prediction rests on.

Methods (what each applies to: docs/explain.md, "Methods"):

- ``attention``, ``rollout``, ``grad_rollout``: from the attention of a CLS-token ViT (:mod:`vitlab.explain.methods`).
- ``lrp``, ``cp_lrp``, ``lrp_epsilon``, ``lrp_gamma``: relevance rules by operation type (:mod:`vitlab.explain.hilrp`);
  ``conservation`` is ``|sum(input relevance) + absorbed - logit| / |logit|``, ``input_share`` is
  ``sum(input relevance) / logit``.
- ``gradcam``: Grad-CAM (Selvaraju et al., ICCV 2017) on a token grid, through ``pytorch-grad-cam``.
- through ``captum``: ``saliency`` (Simonyan et al., 2014), ``input_x_gradient``, ``smoothgrad`` (Smilkov et al.,
  2017), ``gradient_shap`` (Lundberg & Lee, NeurIPS 2017), ``occlusion`` (Zeiler & Fergus, ECCV 2014) and
  ``integrated_gradients`` (Sundararajan et al., ICML 2017; ``conservation`` is its completeness error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import ConfigError
from vitlab.explain.adapters import ATTENTION_METHODS, Explainer, UnsupportedOperation, explainer_for
from vitlab.explain.hilrp import Variant, relevance
from vitlab.explain.methods import attention_rollout, gradient_rollout, last_attention
from vitlab.explain.recording import recorded_attention
from vitlab.models.contract import module_mode

#: integration steps of integrated gradients (Gauss-Legendre; completeness is checked per image)
IG_STEPS = 32
#: noisy samples of SmoothGrad and GradientShap (noise drawn from a fixed seed: same inputs, same maps)
NOISE_SAMPLES = 16
#: the rules of each LRP variant
LRP_VARIANTS = {
    "lrp": Variant(),
    "cp_lrp": Variant(softmax="constant"),
    "lrp_epsilon": Variant(linear="epsilon"),
    "lrp_gamma": Variant(linear="gamma"),
}
INSTALL_HINT = "pip install 'vitlab[explain]'"


@dataclass
class Explanation:
    """``maps: [B, H, W]`` relevance at input resolution (signed for ``lrp`` and ``integrated_gradients``),
    ``target: [B]`` the explained class, ``score: [B]`` its logit, ``conservation: [B]`` (relative) or None,
    ``input_share: [B]`` the input's own share of the logit (the LRP variants) or None."""

    method: str
    kind: str
    maps: torch.Tensor
    target: torch.Tensor
    score: torch.Tensor
    conservation: torch.Tensor | None = None
    input_share: torch.Tensor | None = None


def optional_import(module: str) -> Any:
    """``import module`` for a method that needs the ``explain`` extra; a one-line
    :class:`~vitlab.errors.MissingLibraryError` names the install."""
    from importlib import import_module

    from vitlab.errors import MissingLibraryError

    try:
        return import_module(module)
    except ImportError as e:
        raise MissingLibraryError(f"this explanation method needs {module.split('.')[0]}; {INSTALL_HINT}") from e


def explainer_on(model: nn.Module, example: torch.Tensor, among: Sequence[str]) -> Explainer:
    """:func:`explainer_for` with the refusals that only a pass shows: each LRP variant of ``among`` runs its rules on
    ``example: [1, C, H, W]`` (one image as the model takes it), so a method that those rules refuse at run time is
    refused before any work (:meth:`Explainer.check`) and left out of :meth:`Explainer.applicable`."""
    explainer = explainer_for(model)
    refused = dict(explainer.refused)
    target = torch.zeros(1, dtype=torch.long, device=example.device)
    with module_mode(model, training=False):
        for method in dict.fromkeys(among):
            if method in LRP_VARIANTS and method not in refused:
                try:
                    relevance(model, explainer.logits, example[:1].detach(), target, LRP_VARIANTS[method])
                except UnsupportedOperation as e:
                    refused[method] = str(e)
    return replace(explainer, refused=refused)


def explain(
    model: nn.Module, images: torch.Tensor, method: str = "lrp", target: torch.Tensor | int | None = None
) -> Explanation:
    """Explain ``model``'s logit of class ``target`` (default: the predicted class) on ``images: [B, C, H, W]``
    (normalised, as the model takes them). The computation runs in the images' dtype (float64 for exact checks).

    Raises ``MethodRefused`` (a ``ValueError``) when the method does not apply to the model's structure.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be [B, C, H, W], got shape {list(images.shape)}")
    explainer = explainer_for(model)
    explainer.check(method)
    images = images.detach()
    with module_mode(model, training=False):
        with torch.no_grad():
            logits = explainer.logits(model, images)
        if target is None:
            target = logits.argmax(-1)
        target = torch.as_tensor(target, device=images.device).long().expand(images.shape[0]).clone()
        if ((target < 0) | (target >= logits.shape[1])).any():
            raise ConfigError(
                f"target classes must lie in [0, {logits.shape[1]}), got {target.tolist()}; pass a class index of "
                "the model (--target)"
            )
        score = logits.gather(1, target[:, None])[:, 0]
        maps, conservation, *share = _METHODS[method](model, explainer, images, target)
    share = share[0] if share else None
    return Explanation(method, explainer.kind, maps.detach().cpu(), target.cpu(), score.cpu(), conservation, share)


# ----------------------------------------------------------------------------------------------------------------
def _patch_map(values: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """``[B, h*w]`` patch values -> ``[B, H, W]``, each patch's value over its pixels."""
    return F.interpolate(values.reshape(-1, 1, *grid), size=size, mode="nearest")[:, 0]


def _attention_method(method: str):
    def run(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
        vit = ex.token_model
        with recorded_attention(vit) as record, torch.enable_grad():
            x = x.clone().requires_grad_(method == "grad_rollout")
            score = ex.logits(model, x).gather(1, target[:, None]).sum()
            if method == "grad_rollout":
                grads = torch.autograd.grad(score, record.probs)
                values = gradient_rollout([a.detach() for a in record.probs], grads, vit.num_prefix_tokens)
            elif method == "rollout":
                values = attention_rollout([a.detach() for a in record.probs], vit.num_prefix_tokens)
            else:
                values = last_attention([a.detach() for a in record.probs], vit.num_prefix_tokens)
        return _patch_map(values, vit.grid_size, x.shape[-2:]), None

    return run


def _lrp(name: str, variant: Variant):
    def run(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
        try:
            r, absorbed, score = relevance(model, ex.logits, x, target, variant)
        except UnsupportedOperation as e:
            raise UnsupportedOperation(f"{name} does not apply to {ex.kind}: {e}") from None
        total = r.flatten(1).sum(1)
        error = (total + absorbed - score).abs() / score.abs().clamp_min(1e-30)
        return r.sum(1), error.cpu(), (total / score).cpu()

    return run


class _Logits(nn.Module):
    """``images -> logits`` of the explained model, the callable the libraries take."""

    def __init__(self, model: nn.Module, ex: Explainer) -> None:
        super().__init__()
        self.model, self.ex = model, ex

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ex.logits(self.model, x)


def _gradcam(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
    cam_module = optional_import("pytorch_grad_cam")
    targets_module = optional_import("pytorch_grad_cam.utils.model_targets")
    layer, reshape = ex.gradcam_layer
    with cam_module.GradCAM(model=_Logits(model, ex), target_layers=[layer], reshape_transform=reshape) as cam:
        maps = cam(input_tensor=x, targets=[targets_module.ClassifierOutputTarget(int(t)) for t in target])
    return torch.as_tensor(maps), None


def _captum(method: str):
    """A captum attribution of the target logits, summed over channels to ``[B, H, W]`` (noise from a fixed seed)."""

    def run(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
        captum = optional_import("captum.attr")
        f, x = _Logits(model, ex), x.clone().requires_grad_(True)
        with torch.enable_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            if method == "saliency":
                out = captum.Saliency(f).attribute(x, target=target)
            elif method == "input_x_gradient":
                out = captum.InputXGradient(f).attribute(x, target=target)
            elif method == "smoothgrad":
                noise = 0.15 * float(x.detach().max() - x.detach().min())
                tunnel = captum.NoiseTunnel(captum.Saliency(f))
                out = tunnel.attribute(x, nt_type="smoothgrad", nt_samples=NOISE_SAMPLES, stdevs=noise, target=target)
            elif method == "gradient_shap":
                baselines = torch.zeros_like(x[:1])
                out = captum.GradientShap(f).attribute(x, baselines, n_samples=NOISE_SAMPLES, stdevs=0.1, target=target)
            else:
                side = max(1, x.shape[-1] // 8)
                out = captum.Occlusion(f).attribute(
                    x, sliding_window_shapes=(x.shape[1], side, side), strides=(x.shape[1], side, side), target=target
                )
        return out.detach().sum(1), None

    return run


def _integrated_gradients(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
    captum = optional_import("captum.attr")
    ig = captum.IntegratedGradients(_Logits(model, ex))
    with torch.enable_grad():
        attribution, delta = ig.attribute(
            x, baselines=torch.zeros_like(x), target=target, n_steps=IG_STEPS, return_convergence_delta=True
        )
    with torch.no_grad():
        score = ex.logits(model, x).gather(1, target[:, None])[:, 0]
    return attribution.detach().sum(1), (delta.abs() / score.abs().clamp_min(1e-30)).detach().cpu()


_METHODS = {
    **{name: _attention_method(name) for name in ATTENTION_METHODS},
    **{name: _lrp(name, variant) for name, variant in LRP_VARIANTS.items()},
    "gradcam": _gradcam,
    **{name: _captum(name) for name in ("saliency", "input_x_gradient", "smoothgrad", "gradient_shap", "occlusion")},
    "integrated_gradients": _integrated_gradients,
}

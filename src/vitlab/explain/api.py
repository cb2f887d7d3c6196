"""``vitlab.explain(model, images, method=..., target=None) -> Explanation``: which pixels a prediction rests on.

Methods (the papers each follows are in :mod:`vitlab.explain.methods` and :mod:`vitlab.explain.rules`):

- ``attention``, ``rollout``, ``grad_rollout``: from the attention matrices of a CLS-token ViT.
- ``lrp``: Gradient x Input of the network made locally linear by the conservative rules (CP-LRP / AttnLRP);
  ``conservation`` is ``|sum(input relevance) + absorbed - logit| / |logit|``, where ``absorbed`` is what the
  additive parameters (biases, LayerNorm betas, embeddings) take.
- ``gradcam``: Grad-CAM (Selvaraju et al., ICCV 2017) on a token grid, through ``pytorch-grad-cam``.
- ``integrated_gradients``: Sundararajan et al., ICML 2017, through ``captum``, from a zero (dataset-mean) input;
  ``conservation`` is its completeness error ``|sum(attribution) - (f(x) - f(0))| / |logit|``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.errors import ConfigError
from vitlab.explain.adapters import ADDITIVE_PARAMETERS, Explainer, explainer_for
from vitlab.explain.methods import attention_rollout, gradient_rollout, last_attention
from vitlab.explain.rules import linearised, recorded_attention

#: integration steps of integrated gradients (Gauss-Legendre; completeness is checked per image)
IG_STEPS = 32
INSTALL_HINT = "pip install 'vitlab[explain]'"


@dataclass
class Explanation:
    """``maps: [B, H, W]`` relevance at input resolution (signed for ``lrp`` and ``integrated_gradients``),
    ``target: [B]`` the explained class, ``score: [B]`` its logit, ``conservation: [B]`` (relative) or None."""

    method: str
    kind: str
    maps: torch.Tensor
    target: torch.Tensor
    score: torch.Tensor
    conservation: torch.Tensor | None = None


def optional_import(module: str) -> Any:
    """``import module`` for a method that needs the ``explain`` extra; a one-line error names the install."""
    from importlib import import_module

    try:
        return import_module(module)
    except ImportError as e:
        raise ImportError(f"this explanation method needs {module.split('.')[0]}; {INSTALL_HINT}") from e


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = [m.training for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, mode in zip(model.modules(), modes, strict=True):
            m.training = mode


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
    with _eval_mode(model):
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
        maps, conservation = _METHODS[method](model, explainer, images, target)
    return Explanation(method, explainer.kind, maps.detach().cpu(), target.cpu(), score.cpu(), conservation)


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


def additive_parameters(model: nn.Module, ex: Explainer) -> list[tuple[str, nn.Parameter]]:
    """The parameters that enter the activations additively: biases, LayerNorm betas, the embeddings."""
    suffixes = ("bias", *ADDITIVE_PARAMETERS, *ex.additive)
    return [(n, p) for n, p in model.named_parameters() if n.endswith(suffixes)]


def lrp_relevance(
    model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor, *, linearise: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image: input relevance ``[B, C, H, W]``, ``absorbed: [B]`` (the additive parameters' share) and the
    explained logit ``[B]`` of the linearised network (one image at a time, so each image's absorbed share is
    its own). ``linearise=False``: the same products on the network as it is (plain Gradient x Input, the naive
    extension the rules replace), whose shares do not add up to the logit."""
    params = [p for _, p in additive_parameters(model, ex)]
    flags = [p.requires_grad for p in params]
    relevance, absorbed, scores = [], [], []
    try:
        for p in params:
            p.requires_grad_(True)
        with linearised(model, ex.rules) if linearise else nullcontext(), torch.enable_grad():
            for i in range(x.shape[0]):
                xi = x[i : i + 1].clone().requires_grad_(True)
                score = ex.logits(model, xi)[0, target[i]]
                grads = torch.autograd.grad(score, [xi, *params], allow_unused=True)
                relevance.append((xi * grads[0]).detach())
                absorbed.append(sum((p * g).sum() for p, g in zip(params, grads[1:], strict=True) if g is not None))
                scores.append(score.detach())
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
    return torch.cat(relevance), torch.stack([torch.as_tensor(a).detach() for a in absorbed]), torch.stack(scores)


def _lrp(model: nn.Module, ex: Explainer, x: torch.Tensor, target: torch.Tensor):
    relevance, absorbed, score = lrp_relevance(model, ex, x, target)
    error = (relevance.flatten(1).sum(1) + absorbed - score).abs() / score.abs().clamp_min(1e-30)
    return relevance.sum(1), error.cpu()


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
    "attention": _attention_method("attention"),
    "rollout": _attention_method("rollout"),
    "grad_rollout": _attention_method("grad_rollout"),
    "lrp": _lrp,
    "gradcam": _gradcam,
    "integrated_gradients": _integrated_gradients,
}

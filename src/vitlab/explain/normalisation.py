"""HiLRP's rules for normalisation (:mod:`vitlab.explain.hilrp`): layer, RMS, group and batch norm and
``F.normalize`` divide by a statistic that is held constant as a gain (CP-LRP, Ali et al., "XAI for Transformers:
Better Explanations through Conservative Propagation", ICML 2022, sec. 3), so the relevance passes through the
centring and the scale unchanged; the affine bias is a constant whose share is absorbed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vitlab.explain.adapters import UnsupportedOperation

if TYPE_CHECKING:
    from vitlab.explain.hilrp import RelevanceMode


def _params(args, kwargs, start: int, **defaults: Any) -> list[Any]:
    """The arguments ``defaults`` names, from ``args[start:]`` by position or from ``kwargs``, else the default."""
    given = dict(zip(defaults, args[start:], strict=False)) | kwargs
    return [given.get(k, d) for k, d in defaults.items()]


def _norm_stats(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    centred = x - x.mean(dims, keepdim=True)
    return centred, (centred.pow(2).mean(dims, keepdim=True) + eps).sqrt().detach()


def _affine_out(mode, y: torch.Tensor, weight, bias, shape: tuple[int, ...]) -> torch.Tensor:
    if weight is not None:
        y = y * weight.reshape(shape)
    return y + mode.constant(bias.reshape(shape), y) if bias is not None else y


def _layer_norm(mode: RelevanceMode, name: str, args, kwargs):
    x, shape = args[0], args[1]
    weight, bias, eps = _params(args, kwargs, 2, weight=None, bias=None, eps=1e-5)
    centred, std = _norm_stats(x, tuple(range(-len(shape), 0)), eps)
    return _affine_out(mode, centred / std, weight, bias, tuple(shape))


def _rms_norm(mode: RelevanceMode, name: str, args, kwargs):
    x, shape = args[0], args[1]
    weight, eps = _params(args, kwargs, 2, weight=None, eps=None)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rms = (x.pow(2).mean(tuple(range(-len(shape), 0)), keepdim=True) + eps).sqrt().detach()
    return _affine_out(mode, x / rms, weight, None, tuple(shape))


def _group_norm(mode: RelevanceMode, name: str, args, kwargs):
    x, groups = args[0], args[1] if len(args) > 1 else kwargs["num_groups"]
    weight, bias, eps = _params(args, kwargs, 2, weight=None, bias=None, eps=1e-5)
    centred, std = _norm_stats(x.reshape(x.shape[0], groups, -1), (-1,), eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return _affine_out(mode, (centred / std).reshape(x.shape), weight, bias, shape)


def _batch_norm(mode: RelevanceMode, name: str, args, kwargs):
    names = ("running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    p = dict(zip(names, args[1:], strict=False)) | kwargs
    if p.get("training"):
        raise UnsupportedOperation("BatchNorm needs eval mode (running statistics) for its rule; call model.eval()")
    x, shape = args[0], (1, -1) + (1,) * (args[0].ndim - 2)
    scale = (p["running_var"] + p.get("eps", 1e-5)).rsqrt()
    weight = scale if p.get("weight") is None else scale * p["weight"]
    shift = -p["running_mean"] * weight + (0 if p.get("bias") is None else p["bias"])
    return x * weight.reshape(shape) + mode.constant(shift.reshape(shape), x)


def _normalize(mode: RelevanceMode, name: str, args, kwargs):
    x = args[0]
    p, dim, eps = _params(args, kwargs, 1, p=2.0, dim=1, eps=1e-12)
    return x / x.norm(p, dim, keepdim=True).clamp_min(eps).detach()


NORMALISATION_RULES = dict(
    layer_norm=_layer_norm, rms_norm=_rms_norm, group_norm=_group_norm, batch_norm=_batch_norm, normalize=_normalize
)

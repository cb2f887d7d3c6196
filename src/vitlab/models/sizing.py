"""Model size: parameters per part, FLOPs per image, and :func:`match_width`, which sizes a baseline to a target
parameter count (a family's size-matched baselines are found with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from math import gcd, lcm
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from vitlab.models.contract import module_mode
from vitlab.models.registry import constructor_args, get_preset, resolved_kwargs


# ------------------------------------------------------------------------------------------------------------------
# Counting
# ------------------------------------------------------------------------------------------------------------------
def parameter_count(module: nn.Module, *, trainable: bool = False) -> int:
    """The number of parameters of ``module`` (shared ones once); ``trainable``: only those with ``requires_grad``.
    The one count of the project: the fit's model line, the report, the benchmarks and the sizing rules use it."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable)


def count_params(model: nn.Module) -> dict[str, int]:
    """``{"total": n, <part>: n, ...}``: the parameter count, and per top-level part in definition order.

    A part is a direct child module (``patch_embed``, ``blocks``, ``layers``, ``head``, ...) or a parameter held by
    the model itself (``cls_token``, ``pos_embed``). Shared parameters count once; the parts add up to the total.
    """
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        part = name.split(".", 1)[0]
        parts[part] = parts.get(part, 0) + p.numel()
    return {"total": sum(parts.values()), **parts}


def input_shape_of(model: nn.Module) -> tuple[int, int, int]:
    """``(C, H, W)`` of the images a model was built for, read from its timm ``patch_embed``."""
    embed = getattr(model, "patch_embed", None)
    if embed is None or getattr(embed, "img_size", None) is None:
        raise ValueError(f"cannot tell the input size of a {type(model).__name__}; pass input_shape=(C, H, W)")
    return (embed.proj.in_channels, *embed.img_size)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """FLOPs of the fused CPU attention kernel, which torch's counter does not know (same formula as on CUDA)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def flops_per_image(model: nn.Module, input_shape: Sequence[int] | None = None) -> int:
    """Forward FLOPs for one image of shape ``(C, H, W)`` (default: the model's own input), in eval mode.

    Counted by ``torch.utils.flop_counter.FlopCounterMode``: matrix products, convolutions and attention, with a
    multiply-add counted as two FLOPs (papers that quote "FLOPs" for ViTs often mean multiply-adds, half this);
    element-wise operations (norms, activations, softmax) are not counted. With ToMe the count reflects the
    tokens merged away.
    """
    shape = tuple(input_shape) if input_shape is not None else input_shape_of(model)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {shape}")
    param = next(model.parameters())
    x = torch.zeros(1, *shape, device=param.device, dtype=param.dtype)
    custom = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
    counter = FlopCounterMode(display=False, custom_mapping=custom)
    with module_mode(model, training=False), torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops()


# ------------------------------------------------------------------------------------------------------------------
# Matching
# ------------------------------------------------------------------------------------------------------------------
def width_step(num_heads: int | Sequence[int]) -> int:
    """The smallest width increment that keeps every stage divisible by its heads.

    An int is a single-stage model (ViT): the head count. A sequence is per stage with the width doubling at each
    stage (Swin): stage ``i`` needs ``width * 2**i`` divisible by ``num_heads[i]``.
    """
    heads = (num_heads,) if isinstance(num_heads, int) else tuple(num_heads)
    return lcm(*(h // gcd(h, 2**stage) for stage, h in enumerate(heads)))


def _param_count(cls: type[nn.Module], kwargs: dict[str, Any]) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        return parameter_count(cls(**kwargs))


def match_width(
    preset: str, target_params: int, *, tolerance: float = 0.02, width_key: str = "embed_dim", **fixed: Any
) -> dict[str, Any]:
    """The keyword arguments of ``preset`` (with ``fixed`` applied) whose width lands closest to ``target_params``.

    The width ``width_key`` runs over multiples of :func:`width_step` of the preset's ``num_heads``; the parameter
    count grows with the width, so a bisection finds the two widths around the target and the closer one wins.
    Returns the full keyword arguments (``create_model(preset, **result)`` builds the match). Raises
    ``ValueError`` when the closest width is more than ``tolerance`` (relative) away.
    """
    if target_params <= 0:
        raise ValueError(f"target_params must be positive, got {target_params}")
    cls = get_preset(preset).cls
    kwargs = resolved_kwargs(preset, **fixed)
    if width_key in fixed:
        raise ValueError(f"{width_key} is what match_width chooses; do not fix it")
    heads = kwargs.get("num_heads", constructor_args(cls)["num_heads"].default)
    step = width_step(heads)

    @cache
    def count(multiple: int) -> int:
        return _param_count(cls, {**kwargs, width_key: multiple * step})

    high = 1
    while count(high) < target_params:
        high *= 2
    low = high // 2  # count(low) < target (or low == 0)
    while high - low > 1:
        mid = (low + high) // 2
        if count(mid) < target_params:
            low = mid
        else:
            high = mid
    candidates = [m for m in (low, high) if m >= 1]
    best = min(candidates, key=lambda m: abs(count(m) - target_params))
    error = count(best) / target_params - 1
    if abs(error) > tolerance:
        raise ValueError(
            f"no width of {preset} is within {100 * tolerance:g}% of {target_params:,} parameters: the closest, "
            f"{width_key}={best * step}, gives {count(best):,} ({error:+.1%}); change the depth or the head count "
            "(a finer width step) in the fixed arguments"
        )
    return {**kwargs, width_key: best * step}

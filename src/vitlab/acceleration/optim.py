"""AdamW with the implementation ``optim.fused`` picks (``"auto"``, ``True``, ``False``): fused where the device
has the kernel; docs/benchmarks.md, "Compiled and fused"."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from vitlab.errors import ConfigError


def adamw_implementation(fused: bool | str, parameters: Iterable[torch.Tensor]) -> dict[str, bool]:
    """``torch.optim.AdamW`` keyword arguments for ``fused`` (``"auto"``, ``True``, ``False``; module doc)."""
    if not (fused == "auto" or isinstance(fused, bool)):
        raise ConfigError(f"optim.fused must be auto, true or false, got {fused!r}")
    if fused is False:
        return {}
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    devices = {p.device.type for p in parameters}
    fusable = bool(devices) and devices <= supported and all(p.is_floating_point() for p in parameters)
    if fused is True and not fusable:
        raise ConfigError(
            f"optim.fused=true, but torch has no fused AdamW for parameters on {', '.join(sorted(devices))} "
            f"(it has one for {', '.join(sorted(supported))}); set optim.fused=auto or false"
        )
    return {"fused": True} if fusable else {}


def adamw(
    params: list[dict[str, Any]] | list[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.05,
    fused: bool | str = "auto",
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params`` (tensors or parameter groups) with the implementation ``fused`` picks."""
    groups = list(params)
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay, **adamw_implementation(fused, tensors)
    )

"""Training FLOPs per image of a network: the counted forward, 3x forward for training, and the counted
backward-over-forward ratio as a check."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count

from vitlab.bench.specs import TRAINING_FLOPS_PER_FORWARD
from vitlab.models.sizing import flops_per_image as flops_per_image_forward
from vitlab.models.sizing import input_shape_of


# -------------------------------------------------------------------------------------------------------------------
# FLOPs
def _cpu_flash_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def training_flops_per_image(network: nn.Module, images: int = 2) -> dict[str, float]:
    """FLOPs per image: ``forward`` (:func:`vitlab.models.sizing.flops_per_image`); ``training``, 3x forward, the
    convention of the MFU; ``backward_over_forward``, counted by ``FlopCounterMode`` on a real backward pass (with
    the CPU SDPA backward kernel, which the counter does not know), a check of the 3x."""
    forward = flops_per_image_forward(network)
    device = next(network.parameters()).device
    out = network(torch.randn(images, *input_shape_of(network), device=device))
    backward_kernel = {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_attention_backward_flops
    }
    with FlopCounterMode(display=False, custom_mapping=backward_kernel) as backward_counter:
        out.float().square().mean().backward()
    network.zero_grad(set_to_none=True)
    return {
        "forward": forward,
        "training": TRAINING_FLOPS_PER_FORWARD * forward,
        "backward_over_forward": backward_counter.get_total_flops() / images / forward,
    }

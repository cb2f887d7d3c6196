"""The hand count of a ViTCAE training step's FLOPs (``benchmarks/experiments/freezing_flops.py``) against
``torch.utils.flop_counter`` on the math attention path, where the counter sees every product, and what freezing
every encoder head removes, worked by hand."""

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.experiments import freezing_flops as ff
from vitlab.families.vitcae.config import ViTCAEOptions
from vitlab.layers.attention_path import forcing
from vitlab.models import create_model

SMALL = dict(img_size=8, patch_size=2, in_chans=3, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, latent_dim=4)
SMALL |= dict(patch_latent_dim=2, decoder_dim=8, decoder_depth=1, decoder_heads=2, num_classes=3, num_cond_tokens=3)


def test_the_hand_count_equals_the_flop_counter_on_the_math_path():
    torch.manual_seed(0)
    model = create_model("vitcae_pico", **SMALL).train()
    x = torch.randn(5, 3, 8, 8)
    with forcing("math"), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as forward:
            out = model(x)
        loss = sum(getattr(out, f.name).sum() for f in dataclasses.fields(out))
        with FlopCounterMode(display=False) as backward:
            loss.backward()
    parts = ff.vitcae_step_flops(ViTCAEOptions(**SMALL), batch=5)
    assert sum(p["forward"] for p in parts.values()) == forward.get_total_flops()
    assert sum(p["backward"] for p in parts.values()) == backward.get_total_flops()


def test_what_freezing_every_head_removes_worked_by_hand():
    # 2 layers, width 16, 2 heads of 8, T = 4 * 4 + 1 = 17 tokens, batch 5
    saved = ff.frozen_savings(ViTCAEOptions(**SMALL), batch=5)
    assert saved["qkv_weight_grad"] == 2 * 2 * (5 * 17) * 16 * 48  # per layer: 2 * rows * C * 3C
    assert saved["qk_input_grad"] == 2 * 2 * (5 * 17) * 32 * 16  # through q and k: 2 * rows * 2C * C
    # the math backward's four products (8 B T^2 C) less the dV call, Q K^T and P V on d + 1 columns (4 B T^2 (C + H))
    assert saved["attention_backward"] == 2 * (8 * 5 * 17**2 * 16 - 4 * 5 * 17**2 * 18)
    assert saved["attention_recompute"] == 2 * 2 * 5 * 17**2 * 16
    record = ff.flops_record(ViTCAEOptions(**SMALL), batch=5)
    assert record["flash_kernel"]["saved"] == sum(saved.values())
    assert record["flash_kernel"]["step"] > record["math_path"]["step"]
    assert 0 < record["math_path"]["share"] < record["flash_kernel"]["share"] < 1
    # one layer's whole backward: qkv, proj, MLP (2 * 2 * rows * (3 + 1 + 2 + 2) C^2, C = 16, MLP 32), attention
    assert record["one_encoder_layer_backward"]["math_path"] == 2 * 2 * (5 * 17) * 8 * 16**2 + 8 * 5 * 17**2 * 16


def test_the_first_layers_frozen_whole_remove_their_backward_and_the_input_gradient_below_the_rest():
    o = ViTCAEOptions(**SMALL)  # 2 layers, T = 17, batch 5
    layer = ff.flops_record(o, batch=5)["one_encoder_layer_backward"]["flash_kernel"]
    embed = 2 * (5 * 16) * 12 * 16  # the patch embedding's weight gradient: 16 patches of 2 * 2 * 3 values
    first, both = ff.whole_layer_savings(o, batch=5)
    assert first == embed + layer + 2 * (5 * 17) * 48 * 16  # and layer 2's QKV input gradient
    assert both == embed + 2 * layer + 2 * 2 * 5 * 16 * (4 + 16 * 2)  # and the posterior heads' input gradients


@pytest.mark.parametrize("depth", [1, 3])
def test_the_encoder_parts_scale_with_depth(depth):
    parts = ff.vitcae_step_flops(ViTCAEOptions(**{**SMALL, "depth": depth}), batch=5)
    one = ff.vitcae_step_flops(ViTCAEOptions(**{**SMALL, "depth": 1}), batch=5)
    assert parts["encoder.mlp"]["forward"] == depth * one["encoder.mlp"]["forward"]
    assert parts["decoder.mlp_film"] == one["decoder.mlp_film"]

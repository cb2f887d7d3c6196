"""Model size: parameter counts per part, FLOPs against hand-counted formulas, width matching, the size-matched
baselines of every CET-ViT preset, and ``vitlab params``."""

import re

import pytest
import torch
from torch import nn

import vitlab
from vitlab.cli.main import main
from vitlab.config import build_config, to_dict
from vitlab.families.cet_vit.model import param_breakdown
from vitlab.families.cet_vit.presets import BASELINES, MATCH_INPUTS, TOME_R
from vitlab.models import count_params, create_model, flops_per_image, match_width, parameter_count
from vitlab.models.sizing import width_step


def _meta(name: str, **kwargs) -> nn.Module:
    with torch.device("meta"):
        return vitlab.create_model(name, **kwargs)


def _vit_flops(depth, dim, hidden, heads, tokens, patches, patch_dim, classes, r=0):
    """Forward FLOPs of a ViT counted by hand (a multiply-add is 2): patch projection, per block QKV, attention
    (QK^T and AV), output projection, MLP, and the head. With ToMe the MLP runs on the tokens left after merging,
    and the matching scores the ``N_A x N_B`` pairs on the head-averaged keys."""
    flops = 2 * patches * patch_dim * dim + 2 * dim * classes
    n = tokens
    for _ in range(depth):
        flops += 2 * n * dim * 3 * dim + 4 * n * n * dim + 2 * n * dim * dim
        if r:
            n_a, n_b = (n + 1) // 2, n // 2
            flops += 2 * n_a * n_b * (dim // heads)
            n -= min(r, (n - 1) // 2)
        flops += 4 * n * dim * hidden
    return flops


def test_count_params_per_part_adds_up():
    model = vitlab.create_model("vit_pico", img_size=16, patch_size=4, num_classes=5)
    counts = count_params(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert sum(v for k, v in counts.items() if k != "total") == counts["total"]
    assert list(counts)[1:] == ["cls_token", "pos_embed", "patch_embed", "blocks", "norm", "head"]
    assert counts["cls_token"] == 64 and counts["pos_embed"] == 17 * 64 and counts["head"] == 64 * 5 + 5


def test_count_params_agrees_with_cet_vit_breakdown_and_counts_shared_weights_once():
    cet = vitlab.create_model("cet_vit_pico", img_size=16, num_classes=5)
    counts = count_params(cet)
    assert {k: v for k, v in counts.items() if k != "total"} == {k: v for k, v in param_breakdown(cet).items() if v}

    tied = nn.Module()
    tied.encoder = nn.Linear(4, 3, bias=False)
    tied.decoder = nn.Linear(3, 4, bias=False)
    tied.decoder.weight = tied.encoder.weight
    assert count_params(tied) == {"total": 12, "encoder": 12}


def test_flops_of_a_linear_model_counted_by_hand():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 2 * 2, 5))
    assert flops_per_image(model, (3, 2, 2)) == 2 * 12 * 5


@pytest.mark.parametrize("r", [0, 2])
def test_vit_flops_match_the_hand_count_with_fused_and_eager_attention(r):
    model = vitlab.create_model("tome_pico", img_size=16, patch_size=4, num_classes=5, tome_r=r)
    want = _vit_flops(depth=4, dim=64, hidden=128, heads=4, tokens=17, patches=16, patch_dim=48, classes=5, r=r)
    assert flops_per_image(model) == want  # SDPA's CPU kernel
    for block in model.blocks:
        block.attn.fused = False
    assert flops_per_image(model, (3, 16, 16)) == want  # eager matrix products
    assert model.training  # the count runs in eval mode and restores the mode


def test_flops_need_an_input_shape_when_the_model_cannot_tell():
    with pytest.raises(ValueError, match=r"pass input_shape=\(C, H, W\)"):
        flops_per_image(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))


@pytest.mark.parametrize(
    ("heads", "step"), [(4, 4), (3, 3), ((3, 6, 12, 24), 3), ((2, 4, 8, 16), 2), ((4, 4, 4), 4), ((1, 2, 4, 8), 1)]
)
def test_width_step(heads, step):
    assert width_step(heads) == step


def test_match_width_finds_the_width_of_a_known_count():
    target = count_params(_meta("vit_pico", img_size=16, patch_size=4, embed_dim=96))["total"]
    kwargs = match_width("vit_pico", target, img_size=16, patch_size=4)
    assert kwargs["embed_dim"] == 96 and kwargs["depth"] == 4 and kwargs["img_size"] == 16
    swin_target = count_params(_meta("swin_pico", img_size=16, patch_size=1, embed_dim=21))["total"]
    assert match_width("swin_pico", swin_target, img_size=16, patch_size=1)["embed_dim"] == 21


def test_match_width_picks_the_closer_neighbour_and_fails_clearly_when_none_is_close():
    def params(width: int) -> int:
        return count_params(_meta("vit_pico", img_size=16, patch_size=4, embed_dim=width))["total"]

    low, high = params(96), params(100)
    target = (2 * low + high) // 3  # a third of the way up: 96 is the closer width
    kwargs = match_width("vit_pico", target, tolerance=0.05, img_size=16, patch_size=4)
    assert kwargs["embed_dim"] == 96
    assert abs(params(96) - target) < abs(params(100) - target)
    with pytest.raises(
        ValueError, match=r"no width of vit_pico is within 0.01% .* embed_dim=96, gives .* change the depth"
    ):
        match_width("vit_pico", target, tolerance=1e-4, img_size=16, patch_size=4)
    with pytest.raises(ValueError, match="embed_dim is what match_width chooses"):
        match_width("vit_pico", target, embed_dim=64)


@pytest.mark.parametrize("name", BASELINES)
def test_matched_presets_are_within_two_percent_of_their_cet_vit(name):
    _, cet, _, kwargs = BASELINES[name]
    target = count_params(_meta(cet, **MATCH_INPUTS[cet]))["total"]
    model = _meta(name)
    assert model.init_kwargs["patch_size"] == 2 and model.init_kwargs["img_size"] == 32
    params = count_params(model)["total"]
    assert abs(params / target - 1) <= 0.02, f"{name}: {params:,} vs {cet}: {target:,}"
    # the hard-coded width is still the closest one match_width can pick (the count grows with the width)
    width, step = kwargs["embed_dim"], width_step(kwargs["num_heads"])
    for neighbour in (width - step, width + step):
        other = count_params(_meta(name, embed_dim=neighbour))["total"]
        assert abs(params - target) <= abs(other - target), f"embed_dim={neighbour} is closer than {width}"


def test_every_cet_vit_preset_has_three_matched_baselines():
    names = set(vitlab.list_models("*_matched_*"))
    for cet in MATCH_INPUTS:
        assert {f"vit_matched_{cet}", f"tome_matched_{cet}", f"swin_matched_{cet}"} <= names
        tome, vit = _meta(f"tome_matched_{cet}"), _meta(f"vit_matched_{cet}")
        assert tome.tome_r == TOME_R and vit.tome_r == 0
        assert count_params(tome) == count_params(vit)


def test_params_command(capsys):
    assert main(["params", "tome_pico", "img_size=16", "patch_size=4", "num_classes=5", "tome_r=2"]) == 0
    out = capsys.readouterr().out
    model = vitlab.create_model("tome_pico", img_size=16, patch_size=4, num_classes=5, tome_r=2)
    assert "input 3x16x16" in out
    assert re.search(rf"\n  total +{count_params(model)['total']:,} ", out)
    assert re.search(rf"\n  pos_embed +{17 * 64:,} ", out)
    assert f"FLOPs per image: {flops_per_image(model):,} " in out


def test_params_command_names_a_bad_option(capsys):
    assert main(["params", "vit_pico", "embed_dims=3"]) == 2
    assert "has no option 'embed_dims'. Did you mean embed_dim?" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["cifar10_cpu", "cifar10_p4"])
def test_compare_configs_share_one_protocol_and_differ_only_in_the_model_and_its_loss(protocol):
    resolved, losses = {}, {}
    for variant in ("", "_vit", "_tome", "_swin"):
        cfg = to_dict(build_config(f"compare/{protocol}{variant}"))
        resolved[cfg["model"].pop("name")] = cfg
        losses[variant] = cfg.pop("loss")
        cfg["run"].pop("name")
    assert set(resolved) == {"cet_vit_nano", *(f"{f}_matched_cet_vit_nano" for f in ("vit", "tome", "swin"))}
    assert losses[""] and losses["_vit"] == losses["_tome"] == losses["_swin"] == {}
    protocols = list(resolved.values())
    assert all(p == protocols[0] for p in protocols[1:])
    # the baselines stay within 2% of CET-ViT's parameters at the protocol's input (patch 4 moves all of them)
    inputs = dict(img_size=32, in_chans=3, num_classes=10, patch_size=protocols[0]["model"].get("patch_size", 2))
    target = count_params(_meta("cet_vit_nano", **inputs))["total"]
    for name in resolved:
        params = count_params(_meta(name, **inputs))["total"]
        assert abs(params / target - 1) <= 0.02, f"{name} at {inputs}: {params:,} vs cet_vit_nano: {target:,}"


def test_cet_vit_nano_wide_keeps_nano_size_with_the_parameters_in_the_micro_encoder():
    """The ablation preset (docs/experiments/cet_vit_ablation.md, "Which element costs the accuracy") at
    compare/cifar10_p4's input: within 2% of cet_vit_nano and of its matched ViT, with most of its parameters in the
    micro encoder."""
    inputs = dict(img_size=32, in_chans=3, num_classes=10, patch_size=4)
    wide = count_params(_meta("cet_vit_nano_wide", **inputs))
    nano = count_params(_meta("cet_vit_nano", **inputs))
    for name in ("cet_vit_nano", "vit_matched_cet_vit_nano"):
        target = count_params(_meta(name, **inputs))["total"]
        assert abs(wide["total"] / target - 1) <= 0.02, f"cet_vit_nano_wide {wide['total']:,} vs {name} {target:,}"
    assert wide["micro_encoder"] / wide["total"] > 0.8 > 0.5 > nano["micro_encoder"] / nano["total"]


def test_cet_vit_nano_global_keeps_nano_size_and_attends_globally_at_patch_4():
    """The preset of docs/experiments/cet_vit_ablation.md ("The micro encoder's shape is the cost") at
    compare/cifar10_p4's input: within 1% of cet_vit_nano and of its matched ViT, and its micro encoder's windows
    cover the whole 8x8 grid."""
    inputs = dict(img_size=32, in_chans=3, num_classes=10, patch_size=4)
    total = count_params(_meta("cet_vit_nano_global", **inputs))["total"]
    for name in ("cet_vit_nano", "vit_matched_cet_vit_nano"):
        target = count_params(_meta(name, **inputs))["total"]
        assert abs(total / target - 1) <= 0.01, f"cet_vit_nano_global {total:,} vs {name} {target:,}"
    model = create_model("cet_vit_nano_global", **inputs)
    windows = {tuple(m.window_size) for m in model.micro_encoder.modules() if hasattr(m, "relative_position_index")}
    assert windows == {(8, 8)} and model.num_slots == 8 and model.pos_embed is not None


@pytest.mark.parametrize(
    "config", ["compare/cifar10_p4", "compare/cifar10_p4_vit", "compare/cifar10_p4_swin", "compare/cifar10_p4_global"]
)
def test_every_model_of_the_p4_protocol_trains_at_patch_4_with_its_dropouts_and_matched_size(config):
    """A config that names another preset gives its model options again (a new model.name starts the model section
    afresh), so each model of compare/cifar10_p4 has the protocol's patch 4 and regularisation, at the matched size."""
    model_cfg = dict(build_config(config).model)
    assert {k: model_cfg[k] for k in ("patch_size", "drop_path_rate", "drop_rate", "attn_drop_rate")} == {
        "patch_size": 4,
        "drop_path_rate": 0.1,
        "drop_rate": 0.05,
        "attn_drop_rate": 0.05,
    }
    name = model_cfg.pop("name")
    total = count_params(_meta(name, img_size=32, in_chans=3, num_classes=10, **model_cfg))["total"]
    target = count_params(_meta("vit_matched_cet_vit_nano", img_size=32, in_chans=3, num_classes=10, patch_size=4))
    assert abs(total / target["total"] - 1) <= 0.02, f"{config}: {name} {total:,} vs {target['total']:,}"


def test_parameter_count_is_the_breakdown_total_and_trainable_leaves_out_frozen_tensors():
    model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2)
    total = parameter_count(model)
    assert total == count_params(model)["total"] == sum(p.numel() for p in model.parameters())
    model.patch_embed.requires_grad_(False)
    frozen = sum(p.numel() for p in model.patch_embed.parameters())
    assert frozen > 0 and parameter_count(model, trainable=True) == total - frozen

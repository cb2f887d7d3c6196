"""``vitlab fit`` of a timm model by name (``model.name=timm:NAME``), the dynamics controller on it, and what is
refused before the run folder exists."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.refusals import assert_refused
from vitlab.cli.main import main
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.capture import capture_attention
from vitlab.diagnostics.dynamics import temperature_update
from vitlab.dynamics import DynamicsPolicy, FrozenHeadAttention
from vitlab.dynamics.probe import observed_modules, unit_temperature
from vitlab.errors import ConfigError
from vitlab.export import checkpoint_hparams, read_checkpoint
from vitlab.layers import Attention
from vitlab.models import create_model

FAST = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "run.test=false",
    "run.export=false",
    "run.report=false",
]
TINY_TIMM = ["model.img_size=8", "model.patch_size=2", "model.depth=2"]
TINY_SWIN = ["model.img_size=8", "model.patch_size=2", "model.window_size=2", "model.depths=[1,1]"]
TINY_SWIN += ["model.num_heads=[1,2]", "model.embed_dim=8"]
TINY_BEIT = ["model.embed_dim=32", "model.num_heads=2"]  # BEiT's attention: a relative position bias, no q_norm


def _fit(tmp_path, *overrides: str) -> tuple[int, object]:
    run_dir = tmp_path / "run"
    return main(["fit", "--config", "vit/digits", *overrides, *FAST, f"run.dir={run_dir}"]), run_dir


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("deit_tiny_patch16_224", ["dynamics.mode=fixed", "dynamics.freeze=false"]),  # the command
        ("eva02_tiny_patch14_224", ["dynamics.mode=fixed", "dynamics.freeze=false"]),  # observed only (rotary)
        ("eva02_tiny_patch14_224", ["model.temperature=true", "dynamics.mode=schedule"]),  # steered by hooks
        ("deit_tiny_patch16_224", ["model.temperature=true", "dynamics.mode=schedule"]),  # steered and frozen
    ],
)
def test_fit_trains_a_timm_model_by_name_and_records_every_heads_drift(tmp_path, name, options):
    probe = ["dynamics.probe_size=16", "dynamics.kappa_images=4"]
    code, run_dir = _fit(tmp_path, f"model.name=timm:{name}", *TINY_TIMM, *options, *probe)
    assert code == 0
    records = [json.loads(line) for line in (run_dir / "dynamics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    assert records[1]["modules"] == ["blocks.0.attn", "blocks.1.attn"]
    drift = torch.tensor(records[1]["drift"])
    assert drift.shape == (2, 3) and torch.isfinite(drift).all() and (drift > 0).all()  # deit/eva tiny: 3 heads
    tau = torch.tensor(records[1]["tau"], dtype=torch.float64)
    if "dynamics.mode=schedule" in options:  # eq. 20 from the epoch's drift
        torch.testing.assert_close(tau, temperature_update(drift.double(), 4.0))
    else:
        assert (tau == 1).all()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name=timm:deit_tiny_patch16_22"], "timm has no model 'deit_tiny_patch16_22'. Did you mean"),
        (["model.name=timm:deit_tiny_patch16_224", *TINY_TIMM, "model.foo=3"], "unexpected keyword argument 'foo'"),
        (
            ["model.name=timm:beit_base_patch16_224", *TINY_TIMM, *TINY_BEIT, "dynamics.mode=fixed"],
            "dynamics.freeze=true freezes heads whose parameters vitlab knows (vitlab's, timm's with q_norm/k_norm",
        ),
        (
            ["model.name=timm:beit_base_patch16_224", *TINY_TIMM, *TINY_BEIT, "model.temperature=true"],
            "attends with Attention, whose heads' query and key vitlab cannot reach",
        ),
        (["model.name=timm:eva02_tiny_patch14_224", *TINY_TIMM, "dynamics.mode=schedule"], "model.temperature=true"),
        (
            [
                "model.name=timm:swin_tiny_patch4_window7_224",
                "model.img_size=8",
                "model.patch_size=2",
                "model.window_size=2",
                "model.depths=[1,1]",
                "model.num_heads=[1,2]",
                "model.embed_dim=8",
                "dynamics.mode=fixed",
                "dynamics.freeze=false",
            ],
            "none of its attention covers",
        ),
        (
            [
                "model.name=timm:vit_relpos_small_patch16_224",
                *TINY_TIMM,
                "dynamics.mode=fixed",
                "dynamics.freeze=false",
            ],
            "has no CLS token",
        ),
        (
            ["model.name=timm:cait_xxs24_224", *TINY_TIMM, "dynamics.mode=fixed", "dynamics.freeze=false"],
            "a query-key product that reaches its softmax in blocks.0.attn, blocks.1.attn through permute, linear",
        ),
    ],
)
def test_what_cannot_be_built_or_controlled_is_refused_before_the_run_folder(tmp_path, capsys, overrides, message):
    code, run_dir = _fit(tmp_path, *overrides)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


NO_CLS = ["model.class_token=false", "model.global_pool=avg", "dynamics.mode=fixed", "dynamics.freeze=false"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.name=timm:"], "model.name must be a preset's name, got {'timm': None} (YAML reads `timm:`"),
        (["model.name='timm:'"], "model.name=timm: names no timm model; write timm:NAME"),
        (
            ["model.name=timm:deit_tiny_patch16_224.fb_in1k"],
            "set model.name=timm:deit_tiny_patch16_224 and model.pretrained=timm:deit_tiny_patch16_224.fb_in1k",
        ),
        (  # the patch grid of the model built, in the words of vitlab's own models
            ["model.name=timm:deit_tiny_patch16_224", "model.img_size=8", "model.patch_size=3", "model.depth=1"],
            "image size 8 is not divisible by the patch size 3; set model.patch_size to a divisor of 8",
        ),
        (  # the token layout of the model built: no class token, or register tokens only
            ["model.name=timm:deit_tiny_patch16_224", *TINY_TIMM, *NO_CLS],
            "VisionTransformer has no CLS token, and the drift reads the CLS row of attention",
        ),
        (
            ["model.name=timm:deit_tiny_patch16_224", *TINY_TIMM, *NO_CLS, "model.reg_tokens=2"],
            "VisionTransformer has no CLS token",
        ),
        (  # every reason at once
            ["model.name=timm:swin_tiny_patch4_window7_224", *TINY_SWIN, "dynamics.mode=fixed"],
            "check dynamics.target. Also, dynamics.freeze=true freezes heads whose parameters vitlab knows",
        ),
        (
            ["model.name=timm:resnet18", "dynamics.mode=fixed", "dynamics.freeze=false"],
            "ResNet has no attention module and no patch grid, and the dynamics controller measures",
        ),
    ],
)
def test_a_timm_model_is_refused_in_one_line_with_every_reason(tmp_path, capsys, overrides, message):
    code, run_dir = _fit(tmp_path, *overrides)
    assert_refused(code, capsys.readouterr().err, message, run_dir)


def test_a_timm_model_refuses_a_patch_size_that_does_not_tile_the_image_as_vitlab_models_do():
    refusals = []
    for name in ("timm:deit_tiny_patch16_224", "vit_nano"):
        with pytest.raises(ConfigError) as refused:
            create_model(name, img_size=8, patch_size=3, depth=1)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1]


@pytest.mark.parametrize("img_size", [[], ["model.img_size=null"]])
def test_a_timm_cnn_trains_by_name_without_the_image_size_it_does_not_take(tmp_path, img_size):
    # fp32: a ResNet on 8x8 images is a degenerate network whose bf16 first step can overflow on some CPUs
    code, run_dir = _fit(tmp_path, "model.name=timm:resnet18", *img_size, "trainer.precision=32-true")
    assert code == 0
    hparams = checkpoint_hparams(read_checkpoint(run_dir / "checkpoints" / "last.ckpt"))
    assert hparams["model_kwargs"] == {"in_chans": 1, "num_classes": 10}  # digits: 1 channel, 10 classes
    assert not (run_dir / "dynamics.jsonl").exists()  # no dynamics section, no controller


def test_class_attention_alone_is_refused_for_the_drift_by_its_shape():
    """CaiT's class-attention layers are read, one CLS query over the tokens, [B, H, 1, T]; the drift needs attention
    among all the tokens, so a target naming only them is refused before training, not in its first probe."""
    import timm

    model = timm.create_model("cait_xxs24_224", pretrained=False, img_size=8, patch_size=2, depth=2, num_classes=3)
    config = DynamicsConfig(mode="fixed", freeze=False, target="blocks_token_only")
    with pytest.raises(ConfigError, match=r"none of its attention covers .*blocks_token_only.0.attn \[1, 4, 1, 17\]"):
        observed_modules(model, config, torch.randn(1, 3, 8, 8), tokens=17)


def test_timm_attention_is_taken_over_with_its_weights_and_logits():
    import timm

    torch.manual_seed(0)
    options = dict(img_size=16, patch_size=4, depth=2, num_classes=3)
    theirs = timm.create_model("deit_tiny_patch16_224", **options).eval()
    ours = create_model("timm:deit_tiny_patch16_224", **options).eval()
    assert all(isinstance(block.attn, Attention) for block in ours.blocks)
    assert ours.load_state_dict(theirs.state_dict(), strict=True)  # the same keys
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_the_temperature_schedule_steers_a_timm_vit():
    """Eq. 20 written into a timm ViT's heads, which then attend at that temperature, and eq. 26's freezing."""
    torch.manual_seed(0)
    model = create_model(
        "timm:vit_tiny_patch16_224", img_size=16, patch_size=4, depth=2, num_classes=3, temperature=True
    )
    probe = torch.randn(8, 3, 16, 16)
    policy = DynamicsPolicy(DynamicsConfig(mode="schedule", alpha=4.0, kappa_images=2), probe=probe)
    policy.attach(model)
    assert all(isinstance(block.attn, FrozenHeadAttention) for block in model.blocks)
    policy.advance(policy.measure(probe), epoch=0)
    with torch.no_grad():  # a training step's worth of change
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    record = policy.advance(policy.measure(probe), epoch=1)
    drift = torch.tensor(record["drift"], dtype=torch.float64)
    expected = temperature_update(drift, 4.0)
    torch.testing.assert_close(torch.tensor(record["tau"], dtype=torch.float64), expected)
    torch.testing.assert_close(model.blocks[1].attn.tau.double(), expected[1], rtol=1e-6, atol=1e-7)
    assert not math.isclose(float(expected.min()), 1.0)
    attention = [b.attn for b in model.blocks]
    with unit_temperature(attention):
        at_one = capture_attention(model, probe)["blocks.1.attn"]
    steered = capture_attention(model, probe)["blocks.1.attn"]  # tau < 1 (inverse form): flatter rows
    entropy = [-(a * a.clamp_min(1e-12).log()).sum(-1).mean((0, 2)) for a in (at_one, steered)]
    assert (entropy[1] > entropy[0]).all()
    policy.guard.freeze(torch.tensor([[True, False, False], [False, False, False]]))
    assert model.blocks[0].attn.num_frozen == 1


def test_a_timm_model_takes_the_weights_of_its_own_export_through_pretrained(tmp_path):
    """model.pretrained as for vitlab's models: an export of the same timm model (its heads reordered by freezing)
    loads in original head order, the head reset for another number of classes."""
    from safetensors.torch import load_file

    from vitlab.export import export_model

    torch.manual_seed(0)
    options = dict(img_size=8, patch_size=2, depth=2, in_chans=1)
    model = create_model("timm:deit_tiny_patch16_224", num_classes=10, **options)
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    policy = DynamicsPolicy(DynamicsConfig(mode="fixed"), probe=torch.randn(4, 1, 8, 8))
    policy.attach(model)
    policy.guard.freeze(torch.tensor([[False, False, True], [False, False, False]]))  # head 2 moves to slot 0
    export_model(model, tmp_path / "export")
    saved = load_file(tmp_path / "export" / "model.safetensors")
    assert saved["blocks.0.attn.head_order"].tolist() == [2, 0, 1]
    again = create_model("timm:deit_tiny_patch16_224", num_classes=5, pretrained=str(tmp_path / "export"), **options)
    assert "head reset for 5 classes" in again.pretrained_summary
    for key, value in again.state_dict().items():
        if not key.startswith("head."):
            torch.testing.assert_close(value, plain[key], msg=key)

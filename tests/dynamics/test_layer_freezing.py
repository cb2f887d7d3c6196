"""Layer freezing (``dynamics.freeze: layers``): a frozen encoder prefix, the signals that grow it, and short fits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitlab
from vitlab.cli.main import main
from vitlab.config import build_config, from_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.diagnostics.frozen_layers import layer_summary
from vitlab.dynamics import DynamicsController
from vitlab.dynamics.layer_cache import PrefixCache, image_keys
from vitlab.dynamics.layer_freezing import (
    LayerFreezer,
    freezeout_times,
    gradnorm_change_rates,
    gradnorm_prefix,
    heads_prefix,
    layer_convergence,
    schedule_prefix,
)
from vitlab.errors import ConfigError
from vitlab.models import create_model
from vitlab.training.run import fit

MODELS = {
    "vit": ("vit_pico", dict(depth=3, temperature=True)),
    "vitcae": ("vitcae_pico", dict(depth=3)),
    "timm": ("timm:deit_tiny_patch16_224", dict(depth=3, num_heads=2, embed_dim=32)),
}


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    name, options = MODELS[kind]
    return create_model(name, img_size=8, patch_size=2, in_chans=1, num_classes=3, **options)


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out if torch.is_tensor(out) else out.logits


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(4, 1, 8, 8, generator=generator), torch.randint(0, 3, (4,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(logits(model, x), y).backward()
        optimizer.step()


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("kind", MODELS)
def test_a_prefix_frozen_mid_training_stays_bit_identical_through_adamw(kind):
    model = build(kind)
    freezer = LayerFreezer(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    freezer.attach(optimizer)
    train(model, optimizer, 2, seed=0)  # AdamW has moments for every parameter now
    freezer.freeze(2, epoch=1)
    frozen, first_trainable = freezer.frozen_parameters(), freezer.parameters[3]
    before, trainable_before = snapshot(frozen), snapshot(first_trainable)
    inputs = []
    block = freezer.layer_of_module  # the block 2 module receives a plain tensor
    names = [n for n, _ in model.named_modules() if block(n) == 2 and n.endswith(("blocks.2", "blocks.2."))]
    hook = model.get_submodule(names[0]).register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    train(model, optimizer, 3, seed=1)
    hook.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, frozen, strict=True))
    assert all(p.grad is None and not p.requires_grad for p in frozen)
    assert not any(x.requires_grad for x in inputs)
    assert not all(torch.equal(a, b) for a, b in zip(trainable_before, first_trainable, strict=True))


def test_freezing_changes_no_output_and_thawing_gives_back_only_what_trained():
    model = build("vit")
    model.pos_embed.requires_grad_(False)  # frozen before the freezer came: thawing leaves it so
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    expected = model(x)
    freezer = LayerFreezer(model)
    freezer.freeze(2)
    torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=0)
    freezer.freeze(0)
    assert (
        not model.pos_embed.requires_grad
        and model.cls_token.requires_grad
        and model.blocks[0].attn.qkv.weight.requires_grad
    )
    assert freezer.freeze_epochs == [None, None, None]


def test_thawing_under_mode_fixed_leaves_tau_out_of_training(tmp_path):
    model = build("vit")
    controller = DynamicsController(DynamicsConfig(mode="fixed", freeze="layers"), tmp_path)
    controller.attach(model)
    controller.layers.freeze(2)
    controller.layers.freeze(0)
    assert not any(block.attn.log_tau.requires_grad for block in model.blocks)
    assert all(block.attn.qkv.weight.requires_grad for block in model.blocks)


def test_the_freezer_caps_the_prefix_below_the_last_block():
    freezer = LayerFreezer(build("vit"))
    assert (freezer.blocks, freezer.cap) == (3, 2)
    with pytest.raises(ValueError, match="k must be in"):
        freezer.freeze(3)


# --- the signals, on hand-built sequences -----------------------------------------------------------------------
def test_heads_signal_freezes_the_leading_converged_blocks_and_shrinks_only_under_thaw():
    converged = torch.tensor([True, True, False, True])
    assert heads_prefix(converged, frozen=0, cap=3) == 2
    assert heads_prefix(torch.tensor([True, False, True, True]), frozen=2, cap=3) == 2  # never shrinks
    assert heads_prefix(torch.tensor([True, False, True, True]), frozen=2, cap=3, thaw=True) == 1
    assert heads_prefix(torch.ones(4, dtype=torch.bool), frozen=0, cap=3) == 3  # the cap


def test_layer_convergence_needs_every_head_of_every_module_of_the_block():
    converged = torch.tensor([[True, True], [True, False], [True, True]])
    # modules 0 and 1 in block 0, module 2 in block 1; block 2 has no controlled module
    assert layer_convergence(converged, [0, 0, 1], 3).tolist() == [False, True, False]
    assert layer_convergence(None, [0, 0, 1], 3).tolist() == [False, False, False]


def test_gradnorm_signal_freezes_one_block_when_its_change_rate_falls_below_the_threshold():
    rates = gradnorm_change_rates(torch.tensor([2.0, 1.0, 0.0]), torch.tensor([1.9, 0.5, 1.0]))
    torch.testing.assert_close(rates, torch.tensor([0.05, 0.5, torch.inf], dtype=torch.float64))
    assert gradnorm_prefix(rates, frozen=0, threshold=0.1, cap=2) == 1
    assert gradnorm_prefix(rates, frozen=1, threshold=0.1, cap=2) == 1  # block 1 still changes by 50%
    assert gradnorm_prefix(torch.zeros(3), frozen=2, threshold=0.1, cap=2) == 2  # the cap


def test_freezeout_schedule_is_linear_from_t0_to_the_end():
    assert freezeout_times(0.5, 3) == [0.5, 0.75, 1.0]
    assert [schedule_prefix(f, 0.5, 3, cap=2) for f in (0.4, 0.5, 0.8, 1.0)] == [0, 1, 2, 2]
    assert schedule_prefix(1.0, 0.2, 6, cap=3) == 3


# --- config -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"freeze": "blocks"}, "dynamics.freeze must be one of false, true, heads, layers"),
        ({"layer_signal": "gradnorm"}, "act under dynamics.freeze=layers"),
        ({"cache_frozen": True}, "act under dynamics.freeze=layers"),
        ({"freeze": "layers", "layer_signal": "static"}, "needs dynamics.freeze_layers >= 1"),
        ({"freeze": "layers", "freeze_layers": 2}, "set dynamics.layer_signal=static"),
        ({"freeze": "layers", "max_frozen_layers": 0}, "max_frozen_layers must be >= 1"),
        ({"freeze": "layers", "freezeout_t0": 1.0}, "freezeout_t0 must be in (0, 1)"),
        ({"freeze": "layers", "gradnorm_rate": 0}, "gradnorm_rate must be > 0"),
        ({"freeze": "layers", "layer_signal": "gradnorm", "thaw": True}, "only dynamics.layer_signal=heads"),
    ],
)
def test_layer_options_are_refused_in_one_line(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(DynamicsConfig, values, "dynamics")


def test_true_is_heads_and_only_layers_without_the_heads_signal_skips_the_probe():
    assert from_dict(DynamicsConfig, {"freeze": True}, "dynamics").freezes_heads
    cfg = from_dict(DynamicsConfig, {"freeze": "layers", "layer_signal": "gradnorm", "mode": "fixed"}, "dynamics")
    assert (cfg.freezes_heads, cfg.freezes_layers, cfg.measures) == (False, True, False)
    assert from_dict(DynamicsConfig, {"freeze": "layers", "mode": "fixed"}, "dynamics").measures


# --- short fits ---------------------------------------------------------------------------------------------------
FIT = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "trainer.limit_train_batches=2",
    "data.limit_train=128",
    "run.test=false",
    "run.export=false",
    "run.generate=false",
    "model.name=vit_pico",
    "model.patch_size=2",
    "model.depth=3",
    "dynamics.mode=fixed",
    "dynamics.freeze=layers",
]


def layer_records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "layers.jsonl").read_text().splitlines()]


def test_gradnorm_fit_reads_the_norms_once_an_epoch_without_a_probe(tmp_path, capsys):
    settings = [*FIT, f"run.dir={tmp_path}", "trainer.max_epochs=3", "dynamics.layer_signal=gradnorm"]
    fit(build_config("vit/digits", [*settings, "dynamics.gradnorm_rate=1e9"]))  # any change rate freezes
    records = layer_records(tmp_path)
    assert not (tmp_path / "dynamics.jsonl").exists()  # no probe pass
    assert [r["frozen_layers"] for r in records] == [0, 0, 1, 2]  # rates from epoch 2 on, one block each
    assert [len(r["gradient_norms"]) for r in records[1:]] == [3, 3, 3]
    assert records[-1]["freeze_epochs"] == [2, 3, None]
    summary = layer_summary(tmp_path)  # the command's table and the report's section
    assert [r["frozen_at"] for r in summary["rows"]] == [2, 3, None]
    assert set(summary["step_seconds"]) == {0, 1}  # epoch 1 (k = 0, the warm-up) left out; epoch 3 trained with 1
    capsys.readouterr()
    assert main(["dynamics", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "frozen encoder blocks (gradnorm signal): 2/3 (67% of the blocks' FLOPs)" in out
    assert "    1         3" in out and "    2         -" in out


def test_a_resumed_run_keeps_its_frozen_prefix_and_weights(tmp_path):
    settings = [*FIT, "dynamics.layer_signal=schedule", "dynamics.freezeout_t0=0.25", f"run.dir={tmp_path}"]
    first = fit(build_config("vit/digits", [*settings, "trainer.max_epochs=2"]))  # blocks 0 and 1 frozen by epoch 2
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    fit(build_config("vit/digits", [*settings, "trainer.max_epochs=3"]), resume=first)
    assert [r["frozen_layers"] for r in layer_records(tmp_path)] == [0, 1, 2, 2]
    assert layer_records(tmp_path)[-1]["freeze_epochs"] == [1, 2, None]
    final = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    prefix = ("model.patch_embed.", "model.cls_token", "model.pos_embed", "model.blocks.0.", "model.blocks.1.")
    assert all(torch.equal(saved[k], final[k]) for k in saved if k.startswith(prefix))
    assert not torch.equal(saved["model.blocks.2.attn.qkv.weight"], final["model.blocks.2.attn.qkv.weight"])


NO_CROP = "data.augment.random_crop=false"  # vit/digits crops at random


# --- the cache ----------------------------------------------------------------------------------------------------
def test_the_cache_spills_beyond_its_memory_bound_and_gives_back_what_it_stored(tmp_path):
    outputs = torch.randn(4, 5, 6)
    keys = image_keys(torch.arange(4 * 3.0).view(4, 1, 1, 3))
    cache = PrefixCache(memory_bytes=2 * 5 * 6 * 4, spill=tmp_path / "cache.npy", capacity=4)
    cache.put(keys, outputs)
    assert len(cache.memory) == 2 and len(cache.rows) == 2 and (tmp_path / "cache.npy").exists()
    assert torch.equal(cache.get(keys[::-1], torch.device("cpu")), outputs.flip(0))
    assert cache.get([*keys, b"unseen"], torch.device("cpu")) is None


def test_the_cache_gives_the_losses_of_the_uncached_run(tmp_path):
    settings = [*FIT, "trainer.max_epochs=3", "dynamics.layer_signal=static", "dynamics.freeze_layers=2", NO_CROP]
    losses = {}
    for cached in ("false", "true"):
        run_dir = tmp_path / cached
        fit(build_config("vit/digits", [*settings, f"run.dir={run_dir}", f"dynamics.cache_frozen={cached}"]))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[cached] = [r[key] for r in rows for key in ("train/loss", "val/loss") if key in r]
    records = layer_records(tmp_path / "true")[1:]
    # training images are stored in the first epoch and read from the second; validation images likewise
    assert [(r["cached_steps"], r["cached_val_batches"]) for r in records] == [(0, 0), (2, 3), (2, 3)]
    assert not (tmp_path / "true" / "layer_cache.npy").exists()
    assert len(losses["true"]) == 6 and losses["true"] == pytest.approx(losses["false"], rel=1e-5)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.augment.hflip=true", "data.augment.hflip draw at random"),
        ("model.drop_path_rate=0.1", "blocks.1.drop_path"),
    ],
)
def test_the_cache_is_refused_where_something_random_reaches_the_prefix(tmp_path, override, message):
    settings = [*FIT, "dynamics.layer_signal=static", "dynamics.freeze_layers=1", "dynamics.cache_frozen=true", NO_CROP]
    with pytest.raises(ConfigError, match=message):
        fit(build_config("vit/digits", [*settings, f"run.dir={tmp_path / 'run'}", override]))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ddp_ranks_freeze_the_same_blocks_and_keep_the_same_weights(tmp_path):
    """Two CPU processes (gloo): DDP must find the frozen blocks' missing gradients, else its buckets wait for them
    and the replicas part."""
    run_dir = tmp_path / "ddp"
    source = str(Path(vitlab.__file__).parents[1])  # the processes run this code, not another install
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": source}
    env.pop("VITLAB_RUN_DIR", None)
    overrides = [o for o in FIT if not o.startswith("trainer.limit_train_batches")]
    cmd = [sys.executable, "-m", "vitlab.cli.main", "fit", "--config", "vit/digits", f"run.dir={run_dir}"]
    cmd += [*overrides, "trainer.max_epochs=3", "trainer.strategy=ddp", "trainer.devices=2", "data.limit_train=256"]
    cmd += ["dynamics.layer_signal=gradnorm", "dynamics.gradnorm_rate=1e9"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["frozen_layers"] for r in layer_records(run_dir)] == [0, 0, 1, 2]
    check = json.loads((run_dir / "ddp_check.json").read_text())
    assert check["world_size"] == 2 and check["in_sync"] is True


def test_heads_signal_freezes_blocks_whose_heads_converged_and_no_single_head(tmp_path):
    settings = [*FIT, f"run.dir={tmp_path}", "trainer.max_epochs=2", "dynamics.mode=schedule"]
    settings += ["model.temperature=true", "dynamics.probe_size=16", "dynamics.kappa_images=4"]
    settings += ["dynamics.convergence=absolute", "dynamics.eps_d=1e9", "dynamics.burn_in=0", "dynamics.patience=1"]
    fit(build_config("vit/digits", settings))
    records = layer_records(tmp_path)
    assert [r["frozen_layers"] for r in records] == [0, 2, 2]  # every head converged at epoch 1; the last block trains
    assert records[1]["layer_converged"] == [True, True, True]
    dynamics = [json.loads(line) for line in (tmp_path / "dynamics.jsonl").read_text().splitlines()]
    assert [r["frozen_layers"] for r in dynamics] == [0, 2, 2]
    assert not any(any(row) for r in dynamics for row in r["frozen"])  # heads are not frozen one by one
    assert dynamics[2]["tau"][:2] == dynamics[1]["tau"][:2]  # eq. 20 leaves the frozen blocks' tau alone
    assert dynamics[2]["tau"][2] != dynamics[1]["tau"][2]


@pytest.mark.parametrize(
    "model", [["model.name=vitcae_pico"], ["model.name=timm:deit_tiny_patch16_224", "model.img_size=8"]]
)
def test_vitcae_and_a_timm_vit_by_name_train_with_a_static_prefix(tmp_path, model):
    settings = [*FIT, f"run.dir={tmp_path}", "trainer.max_epochs=1", "dynamics.layer_signal=static"]
    fit(build_config("vit/digits", [*settings, "dynamics.freeze_layers=2", *model]))
    assert [r["frozen_layers"] for r in layer_records(tmp_path)] == [2, 2]

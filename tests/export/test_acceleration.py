"""trainer.compile (the network whole and block by block) and the fused AdamW: same numbers as eager, same
state-dict keys, the feature paths (capture, frozen heads, ToMe) and a fit -> resume -> export with compile on.

The compiled paths here use the ``aot_eager`` backend: dynamo traces the blocks and AOTAutograd their backward
exactly as with inductor, but eager kernels run them, so a test compiles in about a second instead of a minute on
a CPU. The inductor paths are measured by ``vitlab bench trainer.compile=true`` (docs/benchmarks.md) and tested on CUDA
(tests/device/test_cuda.py).
"""

import copy
import logging

import pytest
import torch
from torch import nn

from vitlab.acceleration.compiling import compile_network, compiled_blocks, is_compiled
from vitlab.acceleration.optim import adamw, adamw_implementation
from vitlab.config import OptimConfig, build_config
from vitlab.diagnostics.capture import capture_attention
from vitlab.dynamics import FrozenHeadAttention
from vitlab.errors import ConfigError
from vitlab.models import create_model
from vitlab.models.protocols import AttentionBlocks
from vitlab.rundir import RunDir
from vitlab.training.run import fit
from vitlab.training.tasks import _fused_for_precision

TINY = dict(img_size=8, patch_size=2, in_chans=1, num_classes=3)
BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    # A compiled block runs SDPA (nothing is timed while compiling); the eager twin is held to the same kernel, so
    # the two can be compared exactly rather than within the rounding of another attention path.
    monkeypatch.setenv("VITLAB_ATTENTION_PATH", "sdpa")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _pair(name: str, **kwargs):
    torch.manual_seed(0)
    eager = create_model(name, **{**TINY, **kwargs})
    compiled = copy.deepcopy(eager)
    compile_network(compiled, backend=BACKEND)
    return eager, compiled


def _logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def _assert_same_step(eager, compiled, x):
    """Forward and backward agree: the outputs exactly, every gradient to float rounding."""
    a, b = _logits(eager(x)), _logits(compiled(x))
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        if p.grad is None:  # unused by this loss: a compiled graph's backward gives such an input zeros, not None
            assert q.grad is None or not q.grad.any(), name
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_blocks_of_each_family_are_found():
    names = {m: [n for n, _ in compiled_blocks(create_model(m))] for m in ("vit_pico", "vitcae_pico", "cet_vit_pico")}
    assert names["vit_pico"] == [f"blocks.{i}" for i in range(4)]
    assert names["vitcae_pico"][:4] == [f"encoder.blocks.{i}" for i in range(4)]
    assert all(n.startswith("decoder_blocks.") for n in names["vitcae_pico"][4:]) and len(names["vitcae_pico"]) > 4
    # CET-ViT: the Swin blocks of the micro encoder (not their stages), the macro and the deep encoders' blocks
    assert any(".blocks." in n and n.startswith("micro_encoder.stages.") for n in names["cet_vit_pico"])
    assert not any(n.endswith(tuple(f"stages.{i}" for i in range(9))) for n in names["cet_vit_pico"])
    assert any(n.startswith("macro_encoder.blocks.") for n in names["cet_vit_pico"])


class TalkingHeadAttn(nn.Module):
    """An attention whose class name does not end in ``Attention`` (timm's CaiT names it so)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.softmax(-1)


class TalkingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.attn = nn.Linear(4, 4), TalkingHeadAttn()


class Named(nn.Module):
    """A network whose blocks the attention vocabulary finds, and, with ``own``, one that names its own."""

    def __init__(self, own: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TalkingBlock() for _ in range(2))
        self.mixer = nn.Linear(4, 4)
        if own:
            self.attention_blocks = lambda: [("mixer", self.mixer)]


def test_the_blocks_are_those_a_model_names_else_those_the_attention_vocabulary_finds():
    assert [n for n, _ in compiled_blocks(Named(own=False))] == ["blocks.0", "blocks.1"]
    named = Named(own=True)
    assert isinstance(named, AttentionBlocks) and compiled_blocks(named) == [("mixer", named.mixer)]


@pytest.mark.parametrize("name", ["vit_pico", "vitcae_pico"])
def test_compiled_blocks_train_like_eager_with_the_same_state_dict_keys(name):
    eager, compiled = _pair(name)
    assert all(is_compiled(block) for _, block in compiled_blocks(compiled))
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no _orig_mod. prefixes
    _assert_same_step(eager, compiled, torch.randn(4, 1, 8, 8))


def test_cet_vit_forward_with_aux_runs_its_compiled_blocks():
    eager, compiled = _pair("cet_vit_pico")
    x = torch.randn(4, 1, 8, 8)
    (a, aux_a), (b, aux_b) = eager.forward_with_aux(x), compiled.forward_with_aux(x)
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    torch.testing.assert_close(aux_b.ei_loss, aux_a.ei_loss, rtol=0, atol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def test_a_deep_copy_runs_its_own_weights():
    _, compiled = _pair("vit_pico")
    copied = copy.deepcopy(compiled)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(1.5)
    reference = create_model("vit_pico", **TINY)
    reference.load_state_dict(copied.state_dict())
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(copied(x), reference(x), rtol=0, atol=0)
    assert not torch.allclose(copied(x), compiled(x))


def test_capture_runs_eager_with_one_logged_line_and_the_same_maps(caplog):
    eager, compiled = _pair("vit_pico")
    x = torch.randn(2, 1, 8, 8)
    compiled(x)  # compiled first, then a capture, then compiled again
    with caplog.at_level(logging.WARNING, logger="vitlab.acceleration"):
        for _ in range(2):
            maps = capture_attention(compiled, x)
    expected = capture_attention(eager, x)
    assert maps.keys() == expected.keys()
    for key in maps:
        torch.testing.assert_close(maps[key], expected[key], rtol=0, atol=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "vitlab.acceleration"]
    assert len(lines) == 1 and "capture" in lines[0] and "blocks.0" in lines[0], lines
    _assert_same_step(eager, compiled, x)  # compiled again once the capture is over


def test_frozen_heads_run_eager_in_their_block_only(caplog):
    eager, compiled = _pair("vit_pico")
    mask = torch.tensor([True, False, True, False])
    for model in (eager, compiled):
        FrozenHeadAttention.install(model.blocks[1].attn).set_frozen_heads(mask)
    with caplog.at_level(logging.WARNING, logger="vitlab.acceleration"):
        _assert_same_step(eager, compiled, torch.randn(4, 1, 8, 8))
        compiled(torch.randn(4, 1, 8, 8))
    lines = [r.getMessage() for r in caplog.records if r.name == "vitlab.acceleration"]
    assert len(lines) == 1 and "frozen" in lines[0] and "blocks.1" in lines[0], lines
    # eq. 26 still holds under compile: a frozen head's Q/K rows get no gradient
    attn = compiled.blocks[1].attn  # frozen heads sit in the first slots: read the gradient by original head
    w = attn.in_original_order("qkv.weight", attn.qkv.weight.grad).view(3, 4, 16, 64)
    assert w[0, 0].abs().sum() == 0 and w[1, 2].abs().sum() == 0 and w[0, 1].abs().sum() > 0


def test_token_merging_compiles_whole_and_trains_like_eager(caplog):
    # the tokens shrink block by block, but every shape follows from the input's: one graph of the whole network
    with caplog.at_level(logging.WARNING, logger="vitlab.acceleration"):
        eager, compiled = _pair("vit_pico", tome_r=2, global_pool="token")
        _assert_same_step(eager, compiled, torch.randn(4, 1, 8, 8))
    assert not [r for r in caplog.records if r.name == "vitlab.acceleration"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_bad_compile_mode_is_a_clear_error():
    with pytest.raises(ConfigError, match="trainer.compile_mode must be one of auto, default, reduce-overhead"):
        compile_network(create_model("vit_pico", **TINY), mode="fastest")


# -------------------------------------------------------------------------------------------------------------------
def test_fused_adamw_auto_true_false_on_cpu():
    params = [torch.nn.Parameter(torch.randn(3))]
    assert adamw_implementation("auto", params) == {"fused": True}  # torch has a fused CPU kernel
    assert adamw_implementation(True, params) == {"fused": True}
    assert adamw_implementation(False, params) == {}
    meta = [torch.nn.Parameter(torch.randn(3, device="meta"))]
    assert adamw_implementation("auto", meta) == {}
    with pytest.raises(ConfigError, match="optim.fused=true, but torch has no fused AdamW for parameters on meta"):
        adamw_implementation(True, meta)
    with pytest.raises(ConfigError, match="optim.fused must be auto, true or false, got 'yes'"):
        adamw_implementation("yes", params)
    with pytest.raises(ConfigError, match="got 1"):
        adamw_implementation(1, params)


def test_fused_adamw_takes_the_same_steps_as_the_loop():
    torch.manual_seed(0)
    start = torch.randn(64, 32)
    runs = {}
    for fused in (True, False):
        w = torch.nn.Parameter(start.clone())
        b = torch.nn.Parameter(torch.zeros(32))
        opt = adamw([{"params": [w], "weight_decay": 0.05}, {"params": [b], "weight_decay": 0.0}], lr=1e-2, fused=fused)
        assert opt.defaults["fused"] is (True if fused else None)
        for step in range(5):
            opt.zero_grad()
            ((w + b).sin() * (step + 1)).sum().backward()
            opt.step()
        runs[fused] = (w.detach(), b.detach())
    for a, b in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_under_fp16_with_clipping():
    assert _fused_for_precision(OptimConfig(fused="auto", grad_clip=1.0), "16-mixed") is False
    assert _fused_for_precision(OptimConfig(fused="auto", grad_clip=None), "16-mixed") == "auto"
    assert _fused_for_precision(OptimConfig(fused=True, grad_clip=1.0), "bf16-mixed") is True
    with pytest.raises(ConfigError, match="optim.fused=true with trainer.precision=16-mixed"):
        _fused_for_precision(OptimConfig(fused=True, grad_clip=1.0), "16-mixed")


# -------------------------------------------------------------------------------------------------------------------
FIT = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "model.depth=1",
    "data.limit_train=128",
    "run.generate=false",
    "run.report=false",
    "run.test=false",
    "trainer.deterministic=true",
]


def _fit(tmp_path, name, *extra, callbacks=None, resume=None):
    cfg = build_config("vit/digits", [*FIT, f"run.dir={tmp_path / name}", *extra])
    return fit(cfg, resume=resume, callbacks=callbacks)


def test_fit_with_compile_keeps_checkpoint_keys_resumes_and_exports(tmp_path):
    import lightning.pytorch as pl

    import vitlab

    class StopAfterFirstEpoch(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    compiled = ["trainer.compile=true", f"trainer.compile_backend={BACKEND}", "trainer.max_epochs=2"]
    eager_dir = _fit(tmp_path, "eager", "trainer.max_epochs=2")
    part = _fit(tmp_path, "part", *compiled, callbacks=[StopAfterFirstEpoch()])
    resumed = _fit(tmp_path, "part", *compiled, resume=part)

    def ckpt(run_dir):
        return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)

    eager_ckpt, compiled_ckpt = ckpt(eager_dir), ckpt(resumed)
    assert list(compiled_ckpt["state_dict"]) == list(eager_ckpt["state_dict"])
    assert compiled_ckpt["epoch"] == 1 and compiled_ckpt["optimizer_states"][0]["param_groups"][0]["fused"] is True
    # compile changes no number beyond float rounding: both runs end with the same weights
    for key, value in eager_ckpt["state_dict"].items():
        torch.testing.assert_close(compiled_ckpt["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert [r["epoch"] for r in RunDir(resumed).metrics()] == [0, 1]
    exported = vitlab.load_model(resumed / "export")
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(exported(x), vitlab.load_model(resumed / "checkpoints" / "last.ckpt")(x))
    assert "compile: true" in (resumed / "config.yaml").read_text()  # the resolved config records it


def test_bf16_mixed_clips_the_gradients_before_the_fused_step(tmp_path):
    """Lightning's mixed-precision plugin refuses to clip for a fused optimizer (for fp16's scaler); under bf16-mixed
    the task clips with Lightning's plain code, so the fused AdamW sees gradients of norm at most optim.grad_clip."""
    import lightning.pytorch as pl

    norms: list[float] = []

    class GradNorm(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            def record(optimizer, *_):
                grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
                norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

            trainer.optimizers[0].register_step_post_hook(record)  # the closure (backward, clip) runs in step()

    run = [
        "trainer.max_epochs=1",
        "trainer.precision=bf16-mixed",
        "optim.grad_clip=0.001",
        "trainer.limit_train_batches=2",
    ]
    run_dir = _fit(tmp_path, "bf16", *run, "run.export=false", callbacks=[GradNorm()])
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["fused"] is True
    assert len(norms) == 2 and all(n <= 0.001 * (1 + 1e-3) for n in norms), norms


def test_fit_with_compile_and_the_dynamics_controller_probes_and_freezes(tmp_path, caplog):
    """The attention-dynamics controller under compile: its probes capture (the blocks run eager meanwhile) and it
    freezes heads (their blocks run eager from then on), each said once in the log."""
    dynamics = ["dynamics.mode=schedule", "dynamics.freeze=true", "dynamics.alpha=2.0", "dynamics.eps_d=100"]
    dynamics += ["dynamics.eps_tau=100", "dynamics.patience=1", "dynamics.burn_in=0", "dynamics.probe_size=4"]
    dynamics += ["dynamics.kappa_images=4", "dynamics.convergence=absolute"]
    settings = ["trainer.max_epochs=3", "trainer.limit_train_batches=2", "model.temperature=true", "run.export=false"]
    settings += ["trainer.compile=true", f"trainer.compile_backend={BACKEND}"]
    with caplog.at_level(logging.WARNING, logger="vitlab.acceleration"):
        run_dir = _fit(tmp_path, "dyn", *settings, *dynamics)
    lines = [r.getMessage() for r in caplog.records if r.name == "vitlab.acceleration"]
    assert sum("capture" in line for line in lines) == 1 and sum("frozen" in line for line in lines) == 1, lines
    from vitlab.diagnostics.plots import read_dynamics

    records = read_dynamics(run_dir)
    first = next(r for r in records if any(any(row) for row in r["frozen"]))
    assert first["epoch"] < records[-1]["epoch"], "heads should freeze before the last epoch"

"""trainer.compile's graphs: a training step of every family traces as one graph (``torch._dynamo.explain`` only
traces, so this runs in seconds on a CPU), and the compile mode ``auto`` resolves without timing on a CPU and from
the machine cache once timed."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from vitlab.acceleration.compile_mode import choose_compile_mode, time_compile_modes, timed_compile_mode
from vitlab.acceleration.compiling import classifier_objective, compile_network, compiled_objective
from vitlab.families.cet_vit.task import bench_objective as cet_vit_objective
from vitlab.families.vitcae.losses import ViTCAELossConfig, vitcae_loss
from vitlab.models import create_model

#: every family at a tiny size, with every dropout on (a dropout's draw once broke the graph at each use)
TINY = dict(img_size=16, in_chans=3, num_classes=5, drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.2)
PRESETS = {
    "vit_pico": dict(patch_size=4),
    "swin_pico": {},
    "tome_pico": dict(patch_size=4),
    "vitcae_pico": dict(patch_size=4),
    "cet_vit_pico": {},
}


def _vitcae_step(model, x, y):
    return vitcae_loss(model(x), x, y, epoch=3, cfg=ViTCAELossConfig(), mmd_scale=(2.0, 0.5))["loss"]


#: the training loss of each family, as its task computes it: the classifiers' cross-entropy with label smoothing
#: against soft (Mixup) targets, ViTCAE's eq. 25 after the warm-up, CET-ViT's objective with its EI term
STEPS = {
    "vitcae_pico": _vitcae_step,
    "cet_vit_pico": cet_vit_objective,
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    ("name", "precision"),
    [(name, "32-true") for name in PRESETS] + [("vit_pico", "bf16-mixed"), ("cet_vit_pico", "bf16-mixed")],
)
def test_a_training_step_of_every_family_is_one_graph(name, precision):
    torch.manual_seed(0)
    model = create_model(name, **{**TINY, **PRESETS[name]}).train()
    x = torch.randn(4, 3, 16, 16)
    soft = F.softmax(torch.randn(4, 5), -1)
    step = STEPS.get(name, lambda m, x, y: classifier_objective(m, x, soft, label_smoothing=0.1)[1])
    y = torch.randint(0, 5, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        explained = torch._dynamo.explain(step)(model, x, y)
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


def test_the_compiled_objective_is_one_graph_with_the_same_loss_and_gradients():
    torch.manual_seed(0)
    eager = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3)
    compiled = copy.deepcopy(eager)
    objective = compiled_objective(compiled, classifier_objective, backend="aot_eager")
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 1])
    (logits, loss), (ref_logits, ref_loss) = objective(x, y, 0.1), classifier_objective(eager, x, y, 0.1)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    loss.backward()
    ref_loss.backward()
    for (key, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=key)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # the blocks ran inside the one graph


def test_cet_vit_forward_with_aux_is_compiled_whole():
    torch.manual_seed(0)
    eager = create_model("cet_vit_pico", img_size=16, in_chans=3, num_classes=5)
    compiled = copy.deepcopy(eager)
    compile_network(compiled, backend="aot_eager")
    x = torch.randn(2, 3, 16, 16)
    (a, aux_a), (b, aux_b) = eager.forward_with_aux(x), compiled.forward_with_aux(x)
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    torch.testing.assert_close(aux_b.ei_loss, aux_a.ei_loss)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_compile_mode_auto_is_default_on_a_cpu_and_explicit_modes_stay():
    model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3)
    how = dict(batch_size=4, precision="32-true", device="cpu")
    auto = choose_compile_mode("auto", model, **how)
    assert (auto.requested, auto.mode) == ("auto", "default") and "cpu" in auto.reason
    assert choose_compile_mode("max-autotune", model, **how).mode == "max-autotune"
    assert choose_compile_mode(None, model, **how).line() == "compile mode default (set explicitly)"
    assert choose_compile_mode("auto", model, **how, backend="aot_eager").reason == "backend aot_eager has no modes"


def test_compile_modes_are_timed_once_per_machine_and_kept(tmp_path, monkeypatch):
    """What ``auto`` does on a CUDA device, run on the CPU: each candidate compiled and timed, the result kept and
    read back by the next call; a mode that fails is never chosen."""
    import vitlab.acceleration.compile_mode as compile_mode

    monkeypatch.setenv("VITLAB_CACHE_DIR", str(tmp_path))
    model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3)
    timings = []
    monkeypatch.setattr(compile_mode, "time_compile_modes", lambda *a: timings.append(a) or time_compile_modes(*a))
    how = dict(batch_size=2, precision="32-true", device=torch.device("cpu"), backend="aot_eager")
    choices = [timed_compile_mode(model, **how, candidates=("default", "no-such-mode")) for _ in range(2)]
    assert len(timings) == 1 and choices[0] == choices[1]
    assert choices[0].mode == "default" and "no-such-mode failed" in choices[0].reason
    entries = json.loads((tmp_path / "measured_choices.json").read_text())
    (kept,) = [value for key, value in entries.items() if json.loads(key)[1] == "compile_mode"]
    assert kept["default"] > 0 and kept["no-such-mode"] is None

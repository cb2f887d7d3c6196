"""vitlab bench: FLOP counting against a hand count, timm counterparts, the measurement record and the CLI."""

import json

import numpy as np
import pytest
import torch

from vitlab.acceleration.compile_mode import fastest
from vitlab.acceleration.precision import choose_precision
from vitlab.bench.flops import training_flops_per_image
from vitlab.bench.run import bench, format_bench
from vitlab.bench.specs import NetworkSpec, timm_counterpart
from vitlab.bench.timing import bootstrap_median, quartile_summary, round_ratio
from vitlab.cli.main import main
from vitlab.errors import ConfigError
from vitlab.models import create_model, list_models
from vitlab.models.sizing import input_shape_of

TINY = dict(img_size=8, patch_size=4, in_chans=1, num_classes=3)
FAST = dict(batch_size=2, repeats=2, warmup=1, sample_seconds=0.0, matmul_size=64)


def test_forward_flops_match_a_hand_count_attention_included():
    model = create_model("vit_pico", **TINY)  # width 64, depth 4, 4 heads, MLP 128
    n, d, hidden, patches = 5, 64, 128, 4
    patch_embed = 2 * patches * (1 * 4 * 4) * d
    block = 2 * n * d * 3 * d + 2 * 2 * n * n * d + 2 * n * d * d + 2 * 2 * n * d * hidden
    head = 2 * d * 3
    flops = training_flops_per_image(model)
    assert flops["forward"] == patch_embed + 4 * block + head
    assert flops["training"] == 3 * flops["forward"]
    # matrix products: 2x forward, less the patch embedding's input gradient; attention: 2.5x (the SDPA backward
    # recomputes the logits)
    assert 1.95 < flops["backward_over_forward"] < 2.05


@pytest.mark.parametrize("name", ["vit_pico", "tome_pico"])
def test_timm_counterpart_of_a_vit_takes_our_weights(name):
    if name not in list_models():
        pytest.skip(f"{name} is not registered")
    ours = NetworkSpec("vitlab", name, TINY).build()
    theirs = timm_counterpart(name, TINY).build()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    state = {k: v for k, v in ours.state_dict().items() if not k.endswith(("frozen_heads", "head_order"))}
    theirs.load_state_dict(state, strict=True)


def test_timm_counterpart_of_vitcae_is_its_encoder_without_temperature():
    ours = NetworkSpec("vitlab", "vitcae_pico", {})
    encoder = ours.build()
    theirs = timm_counterpart("vitcae_pico").build()
    assert ours.describe() == "vitlab vitcae_pico (encoder)"
    temperatures = sum(p.numel() for n, p in encoder.named_parameters() if n.endswith("log_tau"))
    assert temperatures == 4 * 4  # depth x heads
    assert sum(p.numel() for p in encoder.parameters()) - temperatures == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, *input_shape_of(encoder))
    assert encoder(x).shape == theirs(x).shape == (2, 64)


def test_timm_counterpart_of_swin_has_its_shape():
    if "swin_pico" not in list_models():
        pytest.skip("no swin presets registered")
    kwargs = dict(img_size=8, patch_size=2, num_classes=3)
    ours, theirs = NetworkSpec("vitlab", "swin_pico", kwargs).build(), timm_counterpart("swin_pico", kwargs).build()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_no_timm_counterpart_is_a_clear_error():
    with pytest.raises(ConfigError, match="no timm counterpart for 'cet_vit_pico'.*Run without --vs"):
        timm_counterpart("cet_vit_pico")


def test_summary_and_round_ratio_by_hand():
    s = quartile_summary([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    record = {
        "networks": {
            "ours": {"train": {"cpu": {"seconds_per_batch": [1.0, 2.0, 4.0]}}},
            "timm": {"train": {"cpu": {"seconds_per_batch": [2.0, 2.0, 2.0]}}},
        }
    }
    ratio = round_ratio(record, "ours", "timm", "train", clock="cpu")
    assert (ratio["min"], ratio["median"], ratio["max"]) == (0.5, 1.0, 2.0)


def test_bootstrap_interval_brackets_the_median_and_narrows_with_more_rounds():
    few = bootstrap_median([1.0, 2.0, 3.0, 4.0, 5.0])
    many = bootstrap_median([1.0, 2.0, 3.0, 4.0, 5.0] * 20)
    assert few[0] == many[0] == 3.0
    assert few[1] <= 3.0 <= few[2] and many[1] <= 3.0 <= many[2]
    assert many[2] - many[1] < few[2] - few[1]
    assert bootstrap_median([1.0, 9.0, 4.0], seed=3) == bootstrap_median([1.0, 9.0, 4.0], seed=3)


def test_fastest_is_the_least_disturbed_call_after_the_warmup():
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # calls of 5, 2 and 3 seconds on a fake clock
    calls = []
    seconds, result = fastest(lambda: calls.append(1) or len(calls), 3, warmup=1, clock=lambda: next(ticks))
    assert seconds == 2.0 and result == 4 and len(calls) == 4
    with pytest.raises(ValueError, match="repeats"):
        fastest(lambda: None, 0)


def test_bench_against_timm_returns_the_documented_record():
    torch_threads = torch.get_num_threads()
    result = bench("vit_pico", overrides=TINY, vs="timm", memory=False, **FAST)
    assert torch.get_num_threads() == torch_threads  # the thread count is restored
    assert result["settings"]["precision"] == choose_precision("auto", "cpu").precision
    assert result["settings"]["precision_choice"]["requested"] == "auto" and result["settings"]["threads"] == 1
    assert len(result["load_average"]["before"]) == 3
    assert result["environment"]["versions"]["timm"]
    assert result["clocks"] == ["wall", "cpu"]
    ours, theirs = result["networks"]["ours"], result["networks"]["timm"]
    assert ours["parameters"] == theirs["parameters"]
    assert ours["flops_per_image"]["forward"] == theirs["flops_per_image"]["forward"] > 0
    for clock in ("wall", "cpu"):
        assert result["matmul_peak"]["flops_per_s"][clock]["median"] > 0
        for network in (ours, theirs):
            for phase in ("train", "inference"):
                measured = network[phase][clock]
                assert measured["images_per_s"]["n"] == 2 and len(measured["seconds_per_batch"]) == 2
                assert measured["images_per_s"]["min"] > 0 and measured["mfu"]["median"] > 0
        for phase in ("train", "inference"):  # the ratio is timm's seconds over ours, round by round
            per_round = [
                b / t
                for t, b in zip(
                    ours[phase][clock]["seconds_per_batch"], theirs[phase][clock]["seconds_per_batch"], strict=True
                )
            ]
            assert result["ours_over_timm"][clock][phase]["median"] == pytest.approx(float(np.median(per_round)))


def test_bench_bf16_with_peak_memory_of_a_fresh_process():
    result = bench("vitcae_pico", precision="bf16-mixed", **FAST)
    ours = result["networks"]["ours"]
    assert ours["description"] == "vitlab vitcae_pico (encoder), eager, AdamW fused=auto, grad-norm clip 1"
    assert ours["peak_memory"]["mib"] > 0 and "fresh process" in ours["peak_memory"]["method"]
    assert result["matmul_peak"]["precision"] == "bf16-mixed"
    assert result["matmul_peak_fp32"]["flops_per_s"]["wall"]["median"] > 0
    assert ours["train"]["cpu"]["mfu_vs_fp32_peak"]["median"] > 0


def test_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="precision must be one of auto, 32-true, bf16-mixed"):
        bench("vit_pico", overrides=TINY, precision="16-mixed")
    with pytest.raises(ConfigError, match="batch size must be at least 1"):
        bench("vit_pico", overrides=TINY, batch_size=0)


def test_cli_writes_the_json_record(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["bench", "vit_pico", "img_size=8", "patch_size=4", "in_chans=1", "--vs", "timm", "--no-memory"]
    argv += ["--batch-size", "2", "--repeats", "1", "--warmup", "1", "--sample-seconds", "0", "--matmul-size", "64"]
    assert main([*argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["settings"]["overrides"] == {"img_size": 8, "patch_size": 4, "in_chans": 1}
    assert set(record["networks"]) == {"ours", "timm"}
    printed = capsys.readouterr().out
    assert "ours / timm, train" in printed and f"wrote {out}" in printed


def test_cli_takes_fits_trainer_and_optim_options_as_fit_checks_them(monkeypatch, capsys):
    import vitlab.bench.run

    seen = {}
    monkeypatch.setattr(vitlab.bench.run, "bench", lambda model, **kw: seen.update(kw) or {})
    monkeypatch.setattr(vitlab.bench.run, "format_bench", lambda result: "")
    argv = ["bench", "vit_pico", "img_size=8", "trainer.precision=bf16-true", "trainer.compile=true"]
    assert main([*argv, "--trainer.compile_mode", "max-autotune", "optim.fused=false"]) == 0
    assert seen["overrides"] == {"img_size": 8} and seen["precision"] == "bf16-true" and seen["compile"] is True
    assert seen["compile_mode"] == "max-autotune" and seen["fused"] is False and seen["grad_checkpointing"] is False
    for override, message in [
        ("trainer.precison=32-true", "unknown config key 'trainer.precison'. Did you mean 'precision'"),
        ("trainer.precision=64-bits", "trainer.precision must be auto or one of Lightning's precisions"),
        ("trainer.max_epochs=3", "vitlab bench does not use trainer.max_epochs; it takes trainer.precision"),
    ]:
        capsys.readouterr()
        assert main(["bench", "vit_pico", override]) == 2
        assert message in capsys.readouterr().err.splitlines()[0], override
    with pytest.raises(SystemExit):  # one way to say it: fit's option, not a flag of bench's own
        main(["bench", "vit_pico", "--precision", "32-true"])


def test_bench_compile_times_ours_compiled_against_eager_and_timm_both_ways():
    compiled = dict(compile=True, compile_backend="aot_eager")
    result = bench("vit_pico", overrides=TINY, vs="timm", memory=False, **compiled, **FAST)
    assert list(result["networks"]) == ["ours", "ours_eager", "timm", "timm_compiled"]
    runners = {name: net["runner"] for name, net in result["networks"].items()}
    assert runners["ours"]["compile"] == "trainer" and runners["ours"]["fused"] == "auto"
    assert runners["ours_eager"]["compile"] == "none" and runners["ours_eager"]["fused"] == "auto"
    assert runners["timm"] == {**runners["timm"], "compile": "none", "fused": False}
    assert runners["timm_compiled"]["compile"] == "model" and runners["timm_compiled"]["backend"] == "aot_eager"
    assert "compiled whole with its loss" in result["networks"]["ours"]["description"]
    for other in ("timm", "ours_eager", "timm_compiled"):
        assert result[f"ours_over_{other}"]["cpu"]["train"]["median"] > 0
    printed = format_bench(result)
    assert "ours / timm_compiled, train" in printed and "ours / ours_eager, inference" in printed


def test_bench_grad_checkpointing_measures_both_settings_with_their_peak_memory():
    result = bench("vit_pico", overrides=TINY, grad_checkpointing=True, **FAST)
    assert list(result["networks"]) == ["ours", "ours_no_checkpointing"]
    ours, plain = result["networks"]["ours"], result["networks"]["ours_no_checkpointing"]
    assert ours["spec"]["grad_checkpointing"] and not plain["spec"]["grad_checkpointing"]
    assert "gradient checkpointing" in ours["description"] and "checkpointing" not in plain["description"]
    assert ours["peak_memory"]["mib"] > 0 and plain["peak_memory"]["mib"] > 0
    assert result["ours_over_ours_no_checkpointing"]["cpu"]["train"]["median"] > 0
    assert "ours / ours_no_checkpointing, train" in format_bench(result)


def test_a_cet_vit_is_timed_on_its_training_loss_with_the_ei_term():
    """The step ``vitlab bench`` times for CET-ViT is the task's objective at the end of the EI ramp (the SVD of the
    EI term included), not the bare cross-entropy: its gradients match that loss computed by hand."""
    import copy

    import torch.nn.functional as F

    from vitlab.bench.timing import Subject
    from vitlab.families.cet_vit.config import CETLossConfig

    torch.manual_seed(0)
    network = create_model("cet_vit_nano", img_size=8, patch_size=2, in_chans=1, num_classes=3)
    reference = copy.deepcopy(network)
    subject = Subject(network, batch_size=4, precision="32-true", device=torch.device("cpu"))
    torch.manual_seed(1)
    subject.train_step()
    lc = CETLossConfig()
    reference.train()
    torch.manual_seed(1)
    logits, aux = reference.forward_with_aux(subject.x, compute_ei=True)
    loss = F.cross_entropy(logits, subject.y) + aux.regularization(lc.lambda_ei, lc.lambda_k)
    loss.backward()
    assert aux.ei_loss.abs() > 0  # the EI term is in the loss, not skipped
    for (name, p), q in zip(network.named_parameters(), reference.parameters(), strict=True):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    result = bench("cet_vit_nano", overrides=dict(TINY, patch_size=2), memory=False, **FAST)
    assert result["networks"]["ours"]["objective"].endswith("cet_vit.task.bench_objective")
    assert "loss vitlab.families.cet_vit.task.bench_objective" in result["networks"]["ours"]["description"]

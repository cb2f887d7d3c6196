"""The freezing frontier's reader and replay (issue 44, item 4; ``benchmarks/experiments/freezing_frontier.py``):
which heads were frozen while each epoch trained, the paired accuracy difference per ratio, and the replayed step
time of a real ViTCAE (every head frozen skips the backward of their attention: fewer operations per step)."""

import json

import numpy as np
import pytest
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.experiments import freezing_frontier as ff
from tests.run_fixtures import make_run, write_checkpoint


def _result(arm: str, seed: int, acc: float, frozen: list[list[int]]) -> dict:
    return {
        "arm": arm,
        "seed": seed,
        "test": {"test/acc": acc},
        "val_curve": {"val/acc": [0.5] * 4, "time/step_s": [1.0] * 4},
        "dynamics": {"frozen_per_layer": frozen},
    }


def test_the_heads_frozen_after_an_epoch_count_from_the_next_one():
    # records for epochs 0 (before training) to 4, as dynamics.jsonl has them: epoch e trains with record e - 1's
    r = _result("controlled", 0, 0.9, [[0, 0], [0, 0], [1, 0], [2, 2], [2, 2]])
    assert ff.epoch_configs(r) == [(0, 0), (0, 0), (1, 0), (2, 2)]
    # without the epoch-0 record the first epoch trained with nothing frozen
    r = _result("controlled", 0, 0.9, [[0, 0], [1, 0], [2, 2], [2, 2]])
    assert ff.epoch_configs(r) == [(0, 0), (0, 0), (1, 0), (2, 2)]


@pytest.fixture
def frontier_results(tmp_path):
    root = tmp_path / "results"
    for seed, (ref, acc) in enumerate([(0.90, 0.91), (0.88, 0.87), (0.92, 0.92)]):
        for folder, arm, value, frozen in [
            ("r0.5", "nofreeze", ref, [[0, 0]] * 5),
            ("r0.5", "controlled", acc, [[0, 0], [0, 0], [2, 2], [2, 2], [2, 2]]),
        ]:
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / f"{arm}-seed{seed}.json").write_text(json.dumps(_result(arm, seed, value, frozen)))
    run = make_run(tmp_path, "vitcae", preset="vitcae_pico")
    write_checkpoint(run, "last.ckpt")
    return root, run


@pytest.mark.parametrize(
    "ratios, low, high, resolved",
    [
        # savings per round (1 - r) / 2 = 0.10, 0.09, 0.11: mean 0.10, SD 0.01, t(0.975, 2) = 4.3027, so the half
        # width is 4.3027 * 0.01 / sqrt(3) = 0.024842
        ([0.80, 0.82, 0.78], 0.075158, 0.124842, True),
        # 0.10, 0.05, 0.15: SD 0.05, half width 4.3027 * 0.05 / sqrt(3) = 0.124207: the interval holds 0
        ([0.80, 0.90, 0.70], -0.024207, 0.224207, False),
    ],
)
def test_the_frontier_pairs_each_ratio_with_the_run_without_freezing(
    frontier_results, monkeypatch, ratios, low, high, resolved
):
    root, run = frontier_results
    # the replay's timing is replaced by fixed ratios per round here; the real one is the last test
    timed = {c: (float(np.median(ratios)), ratios, 1.0) for c in [(2, 2)]}
    monkeypatch.setattr(
        ff,
        "time_configs",
        lambda built, configs, r, s: timed | {c: (1, [1.0] * 3, 1) for c in configs if c not in timed},
    )
    data = ff.frontier(root, run, rounds=3, steps=1)
    (row,) = data["arms"]
    assert row["decay_ratio"] == 0.5 and len(row["seeds"]) == 3
    assert row["acc_diff"] == pytest.approx((1 - 1 + 0) / 3)
    # frozen after epochs 2-4 (records 0-4), so while epochs 3 and 4 of 4 trained: each round saves (1 - r) * 2/4
    assert row["saving_replay"]["per_round"] == pytest.approx([(1 - r) / 2 for r in ratios])
    assert row["saving_replay_mean"] == pytest.approx(0.10)
    assert row["saving_replay"]["interval"] == pytest.approx([low, high], abs=1e-6)
    assert row["saving_replay"]["resolved"] is resolved
    (line,) = [line for line in ff.table(data).splitlines() if line.startswith("| 0.5 | 3 |")]
    assert ("not resolved from 0" in line) is not resolved


def test_one_round_gives_a_saving_without_an_interval():
    summary = ff.saving_summary([0.05])
    assert summary["mean"] == 0.05 and summary["interval"] is None and not summary["resolved"]
    assert ff._saving_text(summary) == "5.00%"


def test_the_replay_times_a_real_vitcae_step_and_freezing_every_head_skips_work(frontier_results):
    _, run = frontier_results
    built = ff.build_step(run)
    step, freeze, layers, heads, _ = built
    timed = ff.time_configs(built, [(heads,) * layers], rounds=3, steps=2)
    ratio, ratios, seconds = timed[(heads,) * layers]
    assert len(ratios) == 3 and seconds > 0 and ratio > 0  # the times themselves: the ceiling's results file

    def flops(config: tuple[int, ...]) -> int:
        freeze(config)
        with FlopCounterMode(display=False) as counter:
            step()
        return counter.get_total_flops()

    # a frozen head's attention runs without autograd: its backward is work the step no longer does
    assert flops((heads,) * layers) < flops((0,) * layers)


def test_layers_frozen_whole_from_the_first_get_no_gradient_and_the_rest_do(frontier_results):
    _, run = frontier_results
    step, freeze, layers, heads, model = ff.build_step(run)
    freeze((-1,) + (0,) * (layers - 1))
    step()
    assert all(p.grad is None for p in model.encoder.blocks[0].parameters())
    assert model.encoder.patch_embed.proj.weight.grad is None
    assert all(p.grad is not None for p in model.encoder.blocks[1].parameters())
    freeze((heads,) * layers)  # every head frozen: the layers train again, but not their frozen heads' q, k, v
    step()
    assert model.encoder.patch_embed.proj.weight.grad is not None
    assert (
        model.encoder.blocks[0].attn.qkv.weight.grad is None and model.encoder.blocks[0].mlp.fc1.weight.grad is not None
    )


def test_the_hand_count_of_the_recipe_step_is_the_counters_on_the_math_path_but_for_the_losses(frontier_results):
    _, run = frontier_results
    counted = ff.counted_step_flops(ff.build_step(run))
    by_hand = ff.flops_record(*ff.run_options(run))["math_path"]["step"]
    assert by_hand <= counted < 1.01 * by_hand  # the losses' few [B, B] products are not in the hand count

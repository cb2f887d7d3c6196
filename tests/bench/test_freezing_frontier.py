"""The freezing frontier's reader and replay (issue 44, item 4; ``benchmarks/experiments/freezing_frontier.py``):
which heads were frozen while each epoch trained, the paired accuracy difference per ratio, and the replayed step
time of a real ViTCAE (every head frozen skips the backward of their attention: fewer operations per step)."""

import json

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


def test_the_frontier_pairs_each_ratio_with_the_run_without_freezing(frontier_results, monkeypatch):
    root, run = frontier_results
    # the replay's timing is replaced by fixed ratios here; the real one is the next test
    monkeypatch.setattr(ff, "time_configs", lambda built, configs, r, s: {c: (0.8, [0.8], 1.0) for c in configs})
    data = ff.frontier(root, run, rounds=1, steps=1)
    (row,) = data["arms"]
    assert row["decay_ratio"] == 0.5 and len(row["seeds"]) == 3
    assert row["acc_diff"] == pytest.approx((1 - 1 + 0) / 3)
    # frozen after epochs 2-4 (records 0-4), so while epochs 3 and 4 of 4 trained, at 0.8 of the time: 2/4 * 0.2
    assert row["saving_replay_mean"] == pytest.approx(0.10)
    assert data["timing"]["ceiling_saving"] == pytest.approx(0.2)
    assert "| 0.5 | 3 |" in ff.table(data)


def test_the_replay_times_a_real_vitcae_step_and_freezing_every_head_skips_work(frontier_results):
    _, run = frontier_results
    built = ff.build_step(run)
    step, freeze, layers, heads = built
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

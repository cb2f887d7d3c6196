"""The pre-registered budget curve (docs/card_claim.md): its analysis, its driver's resume logic and the GPU
protocol's CPU dry run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.experiments import card_claim as card_claim_module
from benchmarks.experiments import card_claim_gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def card_claim():
    return card_claim_module


def _runs(slope, sd, rng, budgets=((8, 2), (24, 2), (48, 3)), cet="cet_card", base="vit"):
    """Synthetic per-run records: the baseline at 40 + 3 log2(e/8), CET-ViT below it by 8 - slope log2(e/8)."""
    runs = []
    for epochs, seeds in budgets:
        for seed in range(seeds):
            x = np.log2(epochs / 8)
            for model, mean in ((base, 40 + 3 * x), (cet, 32 + (3 + slope) * x)):
                acc = (mean + sd * rng.standard_normal()) / 100
                runs.append({"model": model, "epochs": epochs, "seed": seed, "tokens": 64, "test_acc": acc})
    return runs


def test_the_slope_of_the_gap_is_recovered_and_judged_by_the_preregistered_rule(card_claim):
    rng = np.random.default_rng(0)
    closing = card_claim.slope_test(_runs(2.0, 0.3, rng), "cet_card", "vit")
    assert closing["dof"] == 9 and closing["runs"] == 14 and closing["budgets"] == [8, 24, 48]
    low, high = closing["ci95"]
    assert low < 2.0 < high and low > 0 and closing["verdict"] == "holds"
    widening = card_claim.slope_test(_runs(-2.0, 0.3, rng), "cet_card", "vit")
    assert widening["ci95"][1] < 0 and widening["verdict"] == "does not hold"
    noisy = card_claim.slope_test(_runs(0.5, 3.0, rng), "cet_card", "vit")
    assert noisy["verdict"] == "not resolved at this power"
    # the power statement grows with the noise: about 3.1 standard errors at 9 degrees of freedom
    assert noisy["detectable_slope_80pct"] == pytest.approx(3.1 * noisy["se"], rel=0.05)


def test_one_budget_cannot_test_a_slope(card_claim):
    runs = _runs(2.0, 0.3, np.random.default_rng(1), budgets=((8, 3),))
    assert card_claim.slope_test(runs, "cet_card", "vit") is None


def test_the_summary_has_every_run_and_every_hypothesis(card_claim, tmp_path):
    rng = np.random.default_rng(2)
    runs = _runs(1.0, 0.5, rng) + _runs(0.0, 0.5, rng, cet="cet_global") + _runs(0.0, 0.5, rng, base="swin")
    cells = {(r["model"], r["epochs"], r["tokens"], r["seed"]): r for r in runs}  # the baseline once per cell
    runs = list(cells.values())
    for i, run in enumerate(runs):
        (tmp_path / f"{i}.json").write_text(json.dumps(run))
    summary = card_claim.summarise(tmp_path)
    assert len(summary["runs"]) == len(runs)
    assert set(summary["hypotheses"]) == {"H1a", "H1b", "H2"}
    assert all("verdict" in h for h in summary["hypotheses"].values())
    assert json.loads(json.dumps(summary))["hypotheses"]["H1a"]["dof"] > 0  # what `summarise --out` writes
    cell = next(r for r in summary["per_budget"] if r["epochs"] == 48)
    assert len(cell["models"]["cet_card"]) == 3 and "cet_card-vit" in cell["gaps"]  # seeds 0, 1, 2, once each
    table = card_claim.render(summary)
    assert "| H1a:" in table and "| 64 | 48 | cet_card-swin |" in table
    written = card_claim.figures(summary, tmp_path / "figs")
    assert [p.name for p in written] == ["card_claim_accuracy.png", "card_claim_gaps.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_slope_over_fewer_budgets_than_registered_is_an_interim_reading(card_claim, tmp_path):
    runs = [r for r in _runs(1.0, 0.5, np.random.default_rng(4)) if r["epochs"] != 48]
    for i, run in enumerate(runs):
        (tmp_path / f"{i}.json").write_text(json.dumps(run))
    h1a = card_claim.summarise(tmp_path)["hypotheses"]["H1a"]
    assert h1a["interim"] and h1a["budgets"] == [8, 24]
    assert h1a["verdict"].startswith("interim, ") and h1a["verdict"].endswith("(budgets 8, 24 of 8, 24, 48)")
    # the baseline alone at the third budget (a session ran only its cells) does not complete the test
    extra = [r for r in _runs(1.0, 0.5, np.random.default_rng(5)) if r["epochs"] == 48 and r["model"] == "vit"]
    for i, run in enumerate(extra):
        (tmp_path / f"extra{i}.json").write_text(json.dumps(run))
    h1a = card_claim.summarise(tmp_path)["hypotheses"]["H1a"]
    assert h1a["budgets"] == [8, 24, 48] and h1a["verdict"].endswith("(budgets 8, 24 of 8, 24, 48)")


def test_a_slope_with_fewer_seeds_than_registered_at_a_budget_is_an_interim_reading(card_claim, tmp_path):
    rng = np.random.default_rng(6)
    runs = _runs(1.0, 0.5, rng) + _runs(0.0, 0.5, rng, base="swin")
    cells = {(r["model"], r["epochs"], r["tokens"], r["seed"]): r for r in runs}  # the CET-ViT once per cell
    runs = [r for key, r in cells.items() if key[1:] != (48, 64, 2) or key[0] not in ("cet_card", "vit")]
    for i, run in enumerate(runs):
        (tmp_path / f"{i}.json").write_text(json.dumps(run))
    hypotheses = card_claim.summarise(tmp_path)["hypotheses"]
    h1a = hypotheses["H1a"]
    assert h1a["interim"] and h1a["budgets_of_both"] == [8, 24, 48]  # every budget, but seed 2 missing at 48
    assert h1a["verdict"].endswith("(cet_card 2 of 3 seeds at 48; vit 2 of 3 seeds at 48)")
    assert hypotheses["H1b"]["verdict"].endswith("(cet_card 2 of 3 seeds at 48)")  # Swin has its three
    # with every registered seed the reading is the test
    for i, key in enumerate([("cet_card", 48, 64, 2), ("vit", 48, 64, 2)]):
        (tmp_path / f"seed2-{i}.json").write_text(json.dumps(cells[key]))
    hypotheses = card_claim.summarise(tmp_path)["hypotheses"]
    assert "interim" not in hypotheses["H1a"] and not hypotheses["H1a"]["verdict"].startswith("interim")
    assert "interim" not in hypotheses["H1b"]


def _stub(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def _driver_stubs(tmp_path: Path, calls: Path) -> tuple[Path, Path]:
    """Stand-ins for vitlab (``fit --resume DIR`` or ``fit ... run.dir=DIR ...`` finishes DIR; every call is logged
    in ``calls``) and for python (``-c`` runs for real; ``record ... --out F`` writes F)."""
    vitlab = _stub(
        tmp_path / "vitlab",
        f'echo "$*" >> {calls}\n'
        'if [ "$2" = --resume ]; then d=$3; else\n'
        'for a in "$@"; do case $a in run.dir=*) d=${a#run.dir=};; esac; done; fi\n'
        'mkdir -p "$d" && echo "{}" > "$d/test_metrics.json"\n',
    )
    python = _stub(
        tmp_path / "python",
        'if [ "$1" = -c ]; then exec ' + sys.executable + ' "$@"; fi\n'
        'for a in "$@"; do [ "$prev" = --out ] && echo "{}" > "$a"; prev=$a; done\n',
    )
    return vitlab, python


def test_the_driver_runs_every_cell_once_and_resumes_an_interrupted_run(tmp_path):
    calls = tmp_path / "calls.txt"
    vitlab, python = _driver_stubs(tmp_path, calls)
    data = tmp_path / "cifar10.npz"
    data.write_bytes(b"stand-in")
    runs, results = tmp_path / "runs", tmp_path / "results"
    (runs / "vit-e24-t64-seed1" / "checkpoints").mkdir(parents=True)
    (runs / "vit-e24-t64-seed1" / "checkpoints" / "last.ckpt").write_bytes(b"")
    earlier = tmp_path / "earlier_session"  # a run recorded in an earlier session is not trained again
    earlier.mkdir()
    (earlier / "swin-e8-t64-seed0.json").write_text("{}")
    env = {**os.environ, "VITLAB": str(vitlab), "PYTHON": str(python), "RESULTS": str(results), "JOBS": "2"}
    replicate = tmp_path / "card_claim_replicate_gpu_2026-12-04"  # another design's runs: not counted as done
    replicate.mkdir()
    (replicate / "vit-e8-t64-seed0.json").write_text("{}")
    (runs / "tome-e8-t64-seed1").mkdir()  # stopped before its first checkpoint: started again over it
    env["RECORDED"] = f"{earlier} {replicate} {results}"
    command = ["bash", str(ROOT / "benchmarks" / "experiments" / "card_claim.sh"), str(data), str(runs)]
    first = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    names = sorted(p.stem for p in results.glob("*.json"))
    assert len(names) == 5 * (2 + 2 + 3) + 2 * 4 - 1 and "swin-e8-t64-seed0" not in names  # 256 tokens: 4 seeds
    assert "recorded: " + str(earlier / "swin-e8-t64-seed0.json") in first.stdout
    summary = next(line for line in first.stdout.splitlines() if line.startswith("results: "))
    assert f"summarise {results} {earlier}" in summary and str(replicate) not in summary  # the design's folders
    assert "cet_card-e8-t256-seed3" in names and "tome-e48-t64-seed2" in names and "swin-e24-t64-seed2" not in names
    log = calls.read_text().splitlines()
    assert len(log) == len(names)
    assert sum("--resume" in line for line in log) == 1
    fresh = next(line for line in log if "run.dir=" + str(runs / "cet_card-e48-t64-seed0") in line)
    assert "trainer.max_epochs=48" in fresh and "loss.ei_start=8.0" in fresh and "loss.ei_end=32.0" in fresh
    assert "trainer.precision=32-true" in fresh  # one precision for every cell, whatever CPU a session draws
    assert "vit-e8-t64-seed0" in names
    restarted = next(line for line in log if "run.dir=" + str(runs / "tome-e8-t64-seed1") in line)
    assert "run.overwrite=true" in restarted and "run.overwrite=true" not in fresh
    again = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and len(calls.read_text().splitlines()) == len(names)  # nothing re-trained
    shutil.rmtree(runs)  # a fresh machine: the runs recorded in RESULTS are not trained again
    fresh_machine = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    assert fresh_machine.returncode == 0 and len(calls.read_text().splitlines()) == len(names)
    missing = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "experiments" / "card_claim.sh"), str(tmp_path / "none.npz"), str(runs)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "is not a file" in missing.stderr


def test_the_driver_runs_only_the_models_asked_for_and_refuses_an_unknown_one(tmp_path):
    vitlab, python = _driver_stubs(tmp_path, tmp_path / "calls.txt")
    data = tmp_path / "cifar10.npz"
    data.write_bytes(b"stand-in")
    results = tmp_path / "results"
    env = {
        **os.environ,
        "VITLAB": str(vitlab),
        "PYTHON": str(python),
        "RESULTS": str(results),
        "RECORDED": str(results),
    }
    command = ["bash", str(ROOT / "benchmarks" / "experiments" / "card_claim.sh"), str(data), str(tmp_path / "runs")]
    some = {**env, "MODELS": "cet_card vit", "BUDGETS": "24"}
    done = subprocess.run(command, env=some, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    expected = [f"{m}-e24-t64-seed{s}" for m in ("cet_card", "vit") for s in (0, 1)]
    assert sorted(p.stem for p in results.glob("*.json")) == expected
    typo = subprocess.run(command, env={**env, "MODELS": "vit deit"}, cwd=ROOT, capture_output=True, text=True)
    assert typo.returncode == 2 and "MODELS names 'deit'" in typo.stderr
    bad = subprocess.run(command, env={**env, "SEEDS_256": "0,1"}, cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "SEEDS_256 names '0,1'" in bad.stderr
    two = {**env, "MODELS": "swin", "BUDGETS": "8", "SEEDS_MAX": "1", "SEEDS_256": "1"}
    quick = subprocess.run(command, env=two, cwd=ROOT, capture_output=True, text=True, check=False)
    assert quick.returncode == 0, quick.stderr
    assert {"swin-e8-t64-seed0", "swin-e8-t256-seed1"} <= {p.stem for p in results.glob("*.json")}
    assert not (results / "swin-e8-t256-seed0.json").exists() and not (results / "swin-e8-t64-seed1.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script trains the GPU protocol")
def test_the_gpu_protocol_dry_runs_on_the_cpu_both_ways_with_the_same_results(tmp_path):
    gpu = card_claim_gpu
    reports = {}
    threads = torch.get_num_threads()
    for way in ("at once", "one after another"):
        out = tmp_path / way.replace(" ", "_")
        torch.set_num_threads(1)  # as each process of the "at once" way: the same arithmetic
        try:
            assert gpu.main(["--dry-run", "--out", str(out), "--seeds", "0", "--way", way, "--ei-svd", "gram"]) == 0
        finally:
            torch.set_num_threads(threads)
        report = reports[way] = json.loads((out / "card_claim_gpu.json").read_text())
        plan = report["plan"]
        assert report["dry_run"] and plan["epochs_run"] == 1 and plan["way"] == way
        assert plan["epoch_s_at_once"] > 0 and plan["epoch_s_one_after_another"] > 0
        assert set(plan["step_s_at_once"]) == {"cet_card-seed0", "vit-seed0"}
        assert plan["ei_svd"]["ei_svd"] == "gram" and plan["ei_svd"]["forced"]
        assert set(plan["ei_svd"]["ms_forward_backward"]) == {"device", "gram"}  # measured all the same
        assert {r["model"] for r in report["runs"]} == {"cet_card", "vit"}
        assert all(0 <= r["test_acc"] <= 1 and len(r["val_curve"]) == 1 for r in report["runs"])
        assert all(t["step_s"] > 0 for t in plan["timing"].values())
        saved = {p.name: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
        assert saved == {f"{r['model']}-seed0.json": r for r in report["runs"]}  # each run saved as it finished
        with pytest.raises(SystemExit, match="never overwritten"):
            gpu.main(["--dry-run", "--out", str(out), "--seeds", "0"])
    curves = {way: [r["val_curve"] for r in report["runs"]] for way, report in reports.items()}
    assert curves["at once"] == curves["one after another"]  # the same seeds train the same runs either way


def test_the_gpu_protocol_records_when_no_gpu_was_there(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    gpu = card_claim_gpu
    assert gpu.main(["--out", str(tmp_path), "--note", "no machine lent this session"]) == 0
    report = json.loads((tmp_path / "card_claim_gpu.json").read_text())
    assert report["gpu"] is None and report["note"] == "no CUDA device: nothing ran (no machine lent this session)"
    with pytest.raises(SystemExit, match="exists; pass another --out"):
        gpu.main(["--out", str(tmp_path)])


def test_the_summary_reads_the_folders_of_several_sessions_and_refuses_a_run_recorded_twice(card_claim, tmp_path):
    runs = _runs(1.0, 0.5, np.random.default_rng(3))
    first, second = tmp_path / "card_claim_epyc_2026-12-02", tmp_path / "card_claim_xeon_2026-12-03"
    for folder, part in ((first, runs[::2]), (second, runs[1::2])):
        folder.mkdir()
        for run in part:
            (folder / f"{run['model']}-e{run['epochs']}-t{run['tokens']}-seed{run['seed']}.json").write_text(
                json.dumps(run)
            )
    assert len(card_claim.summarise([first, second])["runs"]) == len(runs)
    (second / "again.json").write_text(json.dumps(runs[0]))
    with pytest.raises(SystemExit, match="recorded twice"):
        card_claim.summarise([first, second])


def test_devices_pairs_the_same_runs_of_two_folders_and_gives_the_mean_difference_its_interval(card_claim, tmp_path):
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    gpu.mkdir(), cpu.mkdir()
    diffs = [0.5, -1.0, 1.5]
    for seed, d in enumerate(diffs):
        base = {"model": "vit", "epochs": 8, "tokens": 64, "seed": seed}
        (cpu / f"vit-e8-t64-seed{seed}.json").write_text(json.dumps(base | {"test_acc": 0.40, "cpu": "x"}))
        (gpu / f"vit-e8-t64-seed{seed}.json").write_text(json.dumps(base | {"test_acc": 0.40 + d / 100, "gpu": "g"}))
    (gpu / "swin-e8-t64-seed0.json").write_text(  # on one device only: not paired
        json.dumps({"model": "swin", "epochs": 8, "tokens": 64, "seed": 0, "test_acc": 0.5})
    )
    result = card_claim.devices([gpu], [cpu])
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2] and result["n"] == 3
    assert [round(r["difference"], 6) for r in result["runs"]] == diffs
    assert result["mean"] == pytest.approx(np.mean(diffs))
    half = 4.302652729911275 * np.std(diffs, ddof=1) / np.sqrt(3)  # t(0.975, 2)
    assert result["ci95"] == pytest.approx([np.mean(diffs) - half, np.mean(diffs) + half])
    assert result["runs"][0]["devices"] == ["g", "x"]


def test_the_baselines_are_compared_among_themselves_in_each_cell(card_claim):
    runs = [
        {"model": m, "epochs": 24, "tokens": 64, "seed": s, "test_acc": acc / 100}
        for m, accs in (("vit", (53.0, 54.0)), ("swin", (50.0, 50.5)))
        for s, acc in enumerate(accs)
    ]
    gaps = card_claim.per_budget(runs)[0]["gaps"]
    assert list(gaps) == ["vit-swin"] and gaps["vit-swin"]["diff"] == pytest.approx(3.25)


def test_the_gpu_protocol_reads_the_data_as_parts_carried_apart(tmp_path):
    from benchmarks.experiments import npz_transport

    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8),
        "y_train": np.arange(40) % 4,
        "x_test": rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8),
        "y_test": np.arange(10) % 4,
    }
    np.savez(tmp_path / "data.npz", **arrays)
    npz_transport.pack(tmp_path / "data.npz", tmp_path / "pack", "any", [0], all_train=True, workers=1, parts=2)
    joined = card_claim_gpu.npz_of([tmp_path / "pack" / "part1", tmp_path / "pack" / "part2"])
    with np.load(joined) as f:
        for key, value in arrays.items():
            np.testing.assert_array_equal(f[key], value)
    assert (
        card_claim_gpu.npz_of([tmp_path / "data.npz"]) == tmp_path / "data.npz" and card_claim_gpu.npz_of(None) is None
    )


def test_the_ei_svd_way_is_the_faster_of_the_two_measured():
    choice = card_claim_gpu.choose_ei_svd(torch.device("cpu"), dry_run=True)
    ms = choice["ms_forward_backward"]
    assert set(ms) == {"device", "gram"} and all(v > 0 for v in ms.values())
    assert choice["ei_svd"] == min(ms, key=ms.get) and choice["shape"] == [4, 64, 8]


def test_a_run_that_fails_in_its_process_is_named_and_the_others_released(tmp_path):
    common = {
        "npz": None,
        "dry_run": True,
        "ei_svd": "device",
        "batch": 16,
        "folder": tmp_path,
        "calibration_steps": 1,
    }
    pool = card_claim_gpu._Concurrent([("vit", 0), ("no_such_model", 0)], common)  # vit waits at the barrier
    with pytest.raises(SystemExit, match="the run no_such_model seed 0 failed in its process"):
        pool.calibrate()
    assert not any(proc.is_alive() for proc in pool.procs.values())
    assert pool.start.broken  # the run waiting at the barrier was released, not left to wait for its timeout

"""The GPU check: CUDA tests, ``vitlab bench`` eager and compiled against timm, 200 steps of the CIFAR-100 recipe.

    python -m benchmarks.experiments.gpu_check [--out DIR] [--budget-s 420] [--dry-run]
    bash benchmarks/experiments/gpu_check.sh DIR                 # the same

On a CUDA machine, in this order, within ``--budget-s`` seconds (an item that would not finish in time is listed
as skipped; the script itself stays under 8 minutes):

1. ``tests/device/test_cuda.py`` (pytest, JUnit XML): passed, failed, skipped, expected failures;
2. ``configs/cet_vit/cifar100.yaml`` as written (bf16-mixed, batch 128) for 200 steps, 2 epochs of 100, on
   synthetic data of CIFAR's shape (uint8 32x32x3, 100 classes): images per second from the StepTimer's CUDA events
   in the second epoch (the first holds the warm-up), the projected time of the card's 300 epochs of 50,000
   images, and the peak CUDA memory;
3. ``vitlab bench trainer.compile=true`` (ours compiled, ours eager, timm eager, timm compiled, alternating) in
   bf16-mixed for ``vit_small`` (224, patch 16), ``cet_vit_base`` and ``swin_matched_cet_vit_base`` (the card's 32x32,
   patch 2; CET-ViT has no timm counterpart, so it runs alone) and ``vitcae_small`` (32x32, patch 4);
4. ``benchmarks/micro/freezing.py`` on CUDA (ViTCAE eq. 26, issue 15): a ViT of width 512, 8 heads, depth 6, batch 64,
   at 64 and 196 patch tokens, 0-100% of the heads frozen, one model copy per variant, 20 paired rounds with an A/A
   control: the forward overhead and the step saving against the FLOP prediction, with 95% intervals;
5. the recipe again with ``trainer.compile=true``, then the benches in fp32.

It writes ``DIR/gpu_check.json`` (everything, with each bench record) and ``DIR/gpu_check.md`` (the tables).

Without CUDA it says so and runs a **dry run** of the same code paths on the CPU (tiny presets, two rounds, a few
steps; ``torch.compile`` only in the ``vit_pico`` bench, with the ``aot_eager`` backend, so that nothing waits on
code generation; the compiled recipe is ``tests/export/test_acceleration.py``'s) and exits 0 (1 if an item failed);
``benchmarks/tests/test_gpu_check.py`` runs that dry run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab.bench.run import bench
from vitlab.config import build_config
from vitlab.rundir import RunDir, environment
from vitlab.training.run import fit

ROOT = Path(__file__).resolve().parents[2]
CIFAR_TRAIN_IMAGES = 50_000
CARD_EPOCHS = 300


@dataclass(frozen=True)
class BenchItem:
    model: str
    overrides: dict[str, Any]
    precision: str
    vs: str | None = "timm"
    batch_size: int = 64
    compile: bool = True


@dataclass
class Plan:
    """What one check runs: the GPU plan, or the same code paths at CPU sizes (the dry run)."""

    dry_run: bool
    device: str
    bench_items: list[BenchItem]
    bench_settings: dict[str, Any]
    fit_overrides: list[str]
    fit_model: str | None
    steps_per_epoch: int
    batch_size: int
    compile_backend: str = "inductor"
    recipe_compile: tuple[bool, ...] = (False, True)
    freezing: tuple[dict[str, int], tuple[int, ...]] = (
        dict(dim=512, heads=8, depth=6, batch=64, warmup=3, repeats=20),
        (64, 196),
    )


def gpu_plan() -> Plan:
    models = [
        ("vit_small", dict(img_size=224, patch_size=16, num_classes=1000), "timm"),
        ("cet_vit_base", dict(img_size=32, in_chans=3, num_classes=100), None),
        ("swin_matched_cet_vit_base", dict(img_size=32, patch_size=2, num_classes=100), "timm"),
        ("vitcae_small", dict(img_size=32, patch_size=4, in_chans=3, num_classes=10), "timm"),
    ]
    items = [BenchItem(m, o, p, vs) for p in ("bf16-mixed", "32-true") for m, o, vs in models]
    settings = dict(repeats=5, warmup=3, sample_seconds=0.3, matmul_size=8192, threads=None, memory=True)
    return Plan(False, "cuda", items, settings, ["data.num_workers=8"], None, steps_per_epoch=100, batch_size=128)


def dry_plan() -> Plan:
    tiny = dict(img_size=16, in_chans=3, num_classes=10)
    items = [
        BenchItem("vit_pico", dict(tiny, patch_size=8), "bf16-mixed", batch_size=2),
        BenchItem("cet_vit_pico", dict(tiny), "32-true", vs=None, batch_size=2, compile=False),
    ]
    settings = dict(repeats=2, warmup=2, sample_seconds=0.0, matmul_size=64, threads=1, memory=False)
    fit = ["data.num_workers=0", "trainer.accelerator=cpu", "data.eval_batch_size=8"]
    freezing = (dict(dim=32, heads=4, depth=2, batch=2, warmup=1, repeats=2), (4,))
    return Plan(
        True, "cpu", items, settings, fit, "cet_vit_pico", 2, 8, "aot_eager", recipe_compile=(False,), freezing=freezing
    )


# -------------------------------------------------------------------------------------------------------------------
def run_cuda_tests(out: Path) -> dict[str, Any]:
    """``pytest tests/device/test_cuda.py`` in a fresh process; counts from its JUnit XML."""
    xml = out / "cuda_tests.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests" / "device" / "test_cuda.py"),
    ]
    started = time.perf_counter()
    child = subprocess.run([*cmd, f"--junitxml={xml}"], capture_output=True, text=True, cwd=ROOT, check=False)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "errors": 0}
    failures: list[str] = []
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = {child.tag for child in case}
            skipped = case.find("skipped")
            if "failure" in outcome or "error" in outcome:
                counts["failed" if "failure" in outcome else "errors"] += 1
                failures.append(case.get("name", "?"))
            elif skipped is not None:
                kind = "xfailed" if (skipped.get("type") or "").endswith("xfail") else "skipped"
                counts[kind] += 1
            else:
                counts["passed"] += 1
    reason = None
    if counts["skipped"] and not counts["passed"]:
        first = next(ET.parse(xml).getroot().iter("skipped"), None) if xml.exists() else None
        reason = None if first is None else first.get("message")
    return {
        "command": " ".join(cmd),
        "returncode": child.returncode,
        "seconds": time.perf_counter() - started,
        **counts,
        "failures": failures,
        "skip_reason": reason,
        "tail": child.stdout[-1500:],
    }


def synthetic_cifar(path: Path, train: int, test: int, seed: int = 0) -> Path:
    """An ``.npz`` of CIFAR-100's shape: uint8 ``[N, 32, 32, 3]`` images, labels in ``[0, 100)``, the 100 classes
    named (a small random draw misses some of them, which vitlab accepts only when the file names every class)."""
    rng = np.random.default_rng(seed)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (train, 32, 32, 3), dtype=np.uint8),
        y_train=rng.integers(0, 100, train),
        x_test=rng.integers(0, 256, (test, 32, 32, 3), dtype=np.uint8),
        y_test=rng.integers(0, 100, test),
        class_names=np.array([f"class {label}" for label in range(100)]),
    )
    return path


def run_recipe(plan: Plan, out: Path, data: Path, compile: bool) -> dict[str, Any]:
    """``configs/cet_vit/cifar100.yaml`` for two epochs of ``plan.steps_per_epoch`` steps on ``data``."""
    tag = "compiled" if compile else "eager"
    overrides = [
        "data.name=npz",
        f"data.path={data}",
        f"data.batch_size={plan.batch_size}",
        f"data.limit_train={plan.steps_per_epoch * plan.batch_size}",
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        f"trainer.compile={str(compile).lower()}",
        "trainer.compile_mode=default",
        f"trainer.compile_backend={plan.compile_backend}",
        "run.test=false",
        "run.export=false",
        "run.report=false",
        f"run.dir={out / f'recipe_{tag}'}",
        *plan.fit_overrides,
    ]
    if plan.fit_model:
        overrides.insert(0, f"model.name={plan.fit_model}")
    cfg = build_config("cet_vit/cifar100", overrides)
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    run_dir = fit(cfg)
    seconds = time.perf_counter() - started
    rows = RunDir(run_dir).metrics()
    steady = rows[-1]
    images_per_s = plan.steps_per_epoch * plan.batch_size / steady["time/step_s"]
    steps_per_card_epoch = -(-CIFAR_TRAIN_IMAGES // 128)
    return {
        "config": "cet_vit/cifar100",
        "overrides": overrides,
        "model": cfg.model["name"],
        "precision": cfg.trainer.precision,
        "compile": compile,
        "steps": 2 * plan.steps_per_epoch,
        "batch_size": plan.batch_size,
        "wall_s": seconds,
        "first_epoch": {"step_s": rows[0]["time/step_s"], "epoch_s": rows[0]["time/epoch_s"]},
        "second_epoch": {"step_s": steady["time/step_s"], "epoch_s": steady["time/epoch_s"]},
        "images_per_s_steps": images_per_s,
        "images_per_s_epoch": plan.steps_per_epoch * plan.batch_size / steady["time/epoch_s"],
        "projected_card_hours_steps": CARD_EPOCHS * steps_per_card_epoch * 128 / images_per_s / 3600,
        "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if plan.device == "cuda" else None,
        "final_train_loss": steady.get("train/loss"),
    }


def run_bench(plan: Plan, item: BenchItem, out: Path) -> dict[str, Any]:
    record = bench(
        item.model,
        overrides=item.overrides,
        batch_size=item.batch_size,
        precision=item.precision,
        compile=item.compile,
        compile_mode="default",  # the timing of the modes is gpu_speed.py's
        compile_backend=plan.compile_backend,
        vs=item.vs,
        device=plan.device,
        **plan.bench_settings,
    )
    tag = f"{item.model}_{'bf16' if item.precision == 'bf16-mixed' else 'fp32'}"
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / f"{tag}.json").write_text(json.dumps(record, indent=2))
    return record


def run_freezing(plan: Plan) -> dict[str, Any]:
    """``benchmarks/micro/freezing.py``'s measurement on the plan's device (wall clock, synchronised on CUDA)."""
    if str(ROOT) not in sys.path:  # run as a file (python -m benchmarks.experiments.gpu_check)
        sys.path.insert(0, str(ROOT))
    from benchmarks.micro import freezing as module

    shape, tokens = plan.freezing
    args = argparse.Namespace(**shape, clock="wall", compare_split=False, device=plan.device)
    return {"settings": {**shape, "tokens": list(tokens)}, "cases": [module.benchmark(t, args) for t in tokens]}


def freezing_lines(record: dict[str, Any]) -> list[str]:
    """The freezing table: paired medians and 95% intervals, and the verdicts on issue 15's bars."""
    s = record["settings"]
    lines = [
        "",
        f"Freezing (eq. 26; width {s['dim']}, {s['heads']} heads, depth {s['depth']}, batch {s['batch']}, "
        f"{s['repeats']} paired rounds):",
        "",
        "| tokens | frozen | path | forward vs 0% | step saving / prediction | bars |",
        "|---|---|---|---|---|---|",
    ]
    for case in record["cases"]:
        for row in case["rows"][1:]:
            forward, step = row["paired"]["forward_overhead"], row["paired"]["step_saving"]
            predicted = row["saving"]["step_predicted"] or 1.0  # the A/A control: its raw saving
            bars = ", ".join(f"{k}: {v}" for k, v in row.get("bars", {}).items()) or "-"
            lines.append(
                f"| {case['tokens'] + 1} | {row['frozen_fraction']:.0%} | {row['path']} | {forward['median']:+.1%} "
                f"[{forward['low']:+.1%}, {forward['high']:+.1%}] | {step['median'] / predicted:.2f} "
                f"[{step['low'] / predicted:.2f}, {step['high'] / predicted:.2f}] | {bars} |"
            )
    return lines


# -------------------------------------------------------------------------------------------------------------------
def bench_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per network of a bench record (wall clock: the only clock on CUDA)."""
    s = record["settings"]
    rows = []
    for name, net in record["networks"].items():
        row = {
            "model": s["model"],
            "precision": s["precision"],
            "network": name,
            "train_img_s": net["train"]["wall"]["images_per_s"]["median"],
            "inference_img_s": net["inference"]["wall"]["images_per_s"]["median"],
            "train_mfu": net["train"]["wall"]["mfu"]["median"],
            "peak_mib": net.get("peak_memory", {}).get("mib"),
        }
        if name == "ours":
            for other in ("timm", "timm_compiled", "ours_eager"):
                if f"ours_over_{other}" in record:
                    row[f"train_over_{other}"] = record[f"ours_over_{other}"]["wall"]["train"]["median"]
        rows.append(row)
    return rows


def markdown(report: dict[str, Any]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    t = report["tests"]
    lines = [
        f"# GPU check: {report['device_name']}{' (CPU dry run)' if report['dry_run'] else ''}",
        "",
        f"{report['environment']['time']}, torch {report['environment']['versions']['torch']}, git "
        f"{(report['environment']['git']['revision'] or '?')[:10]}, {report['seconds']:.0f} s in all.",
        "",
        f"CUDA tests (`{t['command']}`): {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
        f"{t['xfailed']} expected failures, {t['skipped']} skipped"
        + (f" ({t['skip_reason']})" if t.get("skip_reason") else "")
        + (f"; failed: {', '.join(t['failures'])}" if t["failures"] else ""),
        "",
        "| recipe run | precision | compile | images/s (steps, 2nd epoch) | images/s (epoch) | first epoch s | "
        "projected 300 epochs, h | peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in report["recipe"]:
        lines.append(
            f"| {run['config']} ({run['model']}, batch {run['batch_size']}, {run['steps']} steps) | "
            f"{run['precision']} | {run['compile']} | {run['images_per_s_steps']:.0f} | "
            f"{run['images_per_s_epoch']:.0f} | {run['first_epoch']['epoch_s']:.1f} | "
            f"{run['projected_card_hours_steps']:.2f} | {num(run['peak_memory_mib'], '.0f')} |"
        )
    lines += [
        "",
        "| model | precision | network | train img/s | inference img/s | train MFU | ours / timm | "
        "ours / timm compiled | ours / ours eager | peak MiB (eager) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["bench_rows"]:
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['network']} | {row['train_img_s']:.1f} | "
            f"{row['inference_img_s']:.1f} | {row['train_mfu']:.1%} | {num(row.get('train_over_timm'), '.3f')} | "
            f"{num(row.get('train_over_timm_compiled'), '.3f')} | {num(row.get('train_over_ours_eager'), '.3f')} | "
            f"{num(row['peak_mib'], '.0f')} |"
        )
    if report.get("freezing"):
        lines += freezing_lines(report["freezing"])
    if report["skipped"]:
        lines += ["", "Skipped (time budget): " + "; ".join(report["skipped"])]
    if report["errors"]:
        lines += ["", "Errors: " + "; ".join(report["errors"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "experiments" / "gpu_check"))
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds for everything (items are skipped)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU dry run even with CUDA present")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    if not cuda:
        print(
            "gpu_check: no CUDA device (torch.cuda.is_available() is False); running the CPU dry run of the same "
            "code paths instead"
        )
    plan = dry_plan() if args.dry_run or not cuda else gpu_plan()
    if cuda and not plan.dry_run:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32; bf16-mixed is the fast path
    report: dict[str, Any] = {
        "dry_run": plan.dry_run,
        "device_name": torch.cuda.get_device_name(0) if cuda and not plan.dry_run else "CPU",
        "environment": environment(),
        "budget_s": args.budget_s,
        "skipped": [],
        "errors": [],
        "recipe": [],
        "bench": [],
        "bench_rows": [],
    }
    durations: list[float] = []

    def in_budget(what: str) -> bool:
        """Whether ``what``, taking as long as the longest item so far, still ends within the budget."""
        elapsed = time.perf_counter() - started
        if elapsed + (max(durations) if durations else 0.0) > args.budget_s:
            report["skipped"].append(what)
            return False
        return True

    def timed(what: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as e:  # one broken item must not lose the others' numbers
            report["errors"].append(f"{what}: {type(e).__name__}: {e}")
            print(f"gpu_check: {what} failed: {e}", file=sys.stderr)
            return None
        finally:
            durations.append(time.perf_counter() - t0)

    report["tests"] = run_cuda_tests(out)
    print(f"gpu_check: CUDA tests {json.dumps({k: report['tests'][k] for k in ('passed', 'failed', 'skipped')})}")
    # The order puts what the issue needs most first, so that a tight budget drops the least: the recipe as
    # written, the bf16 benches (the GPU default), then the compiled recipe, then fp32.
    first = [item for item in plan.bench_items if item.precision == "bf16-mixed"]
    rest = [item for item in plan.bench_items if item.precision != "bf16-mixed"]
    jobs = [*(("recipe", c) for c in plan.recipe_compile[:1]), *(("bench", i) for i in first), ("freezing", None)]
    jobs += [*(("recipe", c) for c in plan.recipe_compile[1:]), *(("bench", i) for i in rest)]
    with tempfile.TemporaryDirectory() as tmp:
        images = plan.steps_per_epoch * plan.batch_size
        data = synthetic_cifar(Path(tmp) / "cifar_shape.npz", train=int(images / 0.9) + plan.batch_size, test=64)
        for kind, job in jobs:
            if kind == "freezing":
                what = "freezing benchmark"
                if in_budget(what) and (record := timed(what, lambda: run_freezing(plan))):
                    report["freezing"] = record
                    print(f"gpu_check: {what} done")
                continue
            if kind == "recipe":
                what = f"cet_vit/cifar100 recipe, compile={job}"
                if in_budget(what) and (run := timed(what, lambda c=job: run_recipe(plan, out, data, c))):
                    report["recipe"].append(run)
                    print(f"gpu_check: {what}: {run['images_per_s_steps']:.0f} images/s")
                continue
            what = f"bench {job.model} {job.precision}"
            if in_budget(what) and (record := timed(what, lambda i=job: run_bench(plan, i, out))):
                report["bench"].append(record)
                report["bench_rows"] += bench_rows(record)
                print(f"gpu_check: {what} done")
    report["seconds"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_check.md").write_text(markdown(report))
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} ({report['seconds']:.0f} s)")
    return 1 if report["errors"] or report["tests"]["failed"] or report["tests"]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

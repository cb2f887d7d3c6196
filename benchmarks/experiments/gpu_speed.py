"""Training at the GPU's speed: ``vitlab bench`` of ``vit_small`` and ``vit_base`` (ours compiled, ours eager, timm
eager, timm compiled, alternating) and ``vitlab fit`` end to end from an ``.npz`` and from a JPEG folder.

    python -m benchmarks.experiments.gpu_speed [--out DIR] [--budget-s 420] [--dry-run]
    bash benchmarks/experiments/gpu_speed.sh [DIR]                # the same

On a CUDA machine, in this order, within ``--budget-s`` seconds (an item that would not finish in time is listed as
skipped; the script stays under 8 minutes):

1. ``vitlab bench vit_small`` and ``vit_base`` (224x224, patch 16, 1000 classes), bf16-mixed, batch 128,
   ``trainer.compile=true trainer.compile_mode=default --vs timm``: train and inference images per second and MFU
   against the bf16 matmul peak measured in the same rounds, and the per-round ratios ours compiled / timm compiled /
   ours eager;
2. ``vitlab fit`` of ``vit_small`` (bf16-mixed, batch 128, ``trainer.compile=true`` in mode ``default``, 8 loader
   workers) for three epochs of 20 steps on images it makes (224x224 RGB, 10 classes): once from an ``.npz`` and
   once from a folder of JPEG files (``data.name=imagefolder``). Per run: images per second in the last epoch by the
   StepTimer's CUDA events (the step) and by the epoch's wall clock (end to end), the data pipeline's share of the
   epoch (the time the loop waited for a batch), the set-up before training (data loading, the JPEG decoding), and
   the bench's synthetic training step beside them;
3. ``trainer.compile_mode: auto``'s timing of the compile modes for ``vit_small`` at that batch
   (:func:`vitlab.acceleration.compile_mode.timed_compile_mode`), with ``reduce-overhead`` (CUDA graphs) beside its
   candidates, and the fastest. Last: max-autotune's compilation may take minutes (items 1 and 2 use ``default``, so
   that each compiles once).

It writes ``DIR/gpu_speed_<device>_<date>/`` (:mod:`benchmarks.naming`): ``gpu_speed.json`` (everything, each bench
record in ``bench/``) and ``gpu_speed.md`` (the tables). DIR defaults to ``benchmarks/results/experiments``.

Without CUDA (or with ``--dry-run``) it says so and runs a **dry run** of the same code paths on the CPU (``vit_pico``
on 16x16 images, two rounds, a few steps, ``torch.compile`` with the ``aot_eager`` backend), into
``gpu_speed_dryrun_<cpu>_<date>/``, and exits 0 (1 if an item failed); ``benchmarks/tests/test_gpu_check.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitlab.acceleration.compile_mode import CUDA_MODE_CANDIDATES, timed_compile_mode
from vitlab.bench.run import bench
from vitlab.config import build_config
from vitlab.models import create_model
from vitlab.rundir import RunDir, environment
from vitlab.training.run import fit

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file
    sys.path.insert(0, str(ROOT))

from benchmarks.experiments.gpu_check import bench_rows  # noqa: E402
from benchmarks.naming import RESULTS, cpu_model, device_name  # noqa: E402


@dataclass
class Plan:
    """What one run measures: the GPU plan, or the same code paths at CPU sizes (the dry run)."""

    dry_run: bool
    device: str
    models: dict[str, dict[str, Any]]
    batch_size: int
    bench_settings: dict[str, Any]
    image_size: int
    steps_per_epoch: int
    fit_overrides: list[str] = field(default_factory=list)
    compile_backend: str = "inductor"
    classes: int = 10


def gpu_plan() -> Plan:
    imagenet = dict(img_size=224, patch_size=16, num_classes=1000)
    settings = dict(repeats=5, warmup=3, sample_seconds=0.3, matmul_size=8192, threads=None, memory=True)
    return Plan(
        False,
        "cuda",
        {"vit_small": imagenet, "vit_base": imagenet},
        128,
        settings,
        image_size=224,
        steps_per_epoch=20,
        fit_overrides=["data.num_workers=8", "trainer.accelerator=gpu"],
    )


def dry_plan() -> Plan:
    settings = dict(repeats=2, warmup=1, sample_seconds=0.0, matmul_size=64, threads=1, memory=False)
    return Plan(
        True,
        "cpu",
        {"vit_pico": dict(img_size=16, patch_size=4, num_classes=10)},
        4,
        settings,
        image_size=16,
        steps_per_epoch=2,
        fit_overrides=["data.num_workers=0", "trainer.accelerator=cpu", "model.depth=2"],
        compile_backend="aot_eager",
        classes=4,
    )


# -------------------------------------------------------------------------------------------------------------------
def make_images(folder: Path, count: int, size: int, classes: int, seed: int = 0) -> tuple[Path, Path]:
    """``count`` RGB images ``size`` x ``size`` in ``classes`` classes (smooth random fields, so JPEG compresses
    them as it does photographs, plus noise), written twice: ``images.npz`` (uint8 ``[N, H, W, 3]``, labels, class
    names; its first 8 images again as the test split) and ``jpeg/train/<class>/<i>.jpg`` (quality 90)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (count, size // 8 + 1, size // 8 + 1, 3), dtype=np.uint8)
    images = np.stack([np.asarray(Image.fromarray(c).resize((size, size), Image.BILINEAR)) for c in coarse])
    images = np.clip(images.astype(np.int16) + rng.integers(-12, 13, images.shape), 0, 255).astype(np.uint8)
    labels = rng.integers(0, classes, count)
    npz = folder / "images.npz"
    names = np.array([f"class{k}" for k in range(classes)])
    # the npz format wants a test split; the runs never test (run.test=false)
    np.savez(npz, x_train=images, y_train=labels, x_test=images[:8], y_test=labels[:8], class_names=names)
    jpeg = folder / "jpeg"
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (jpeg / "train" / f"class{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(jpeg / "train" / f"class{label}" / f"{i:05d}.jpg", quality=90)
    return npz, jpeg


def run_fit(plan: Plan, model: str, source: str, data: Path, out: Path) -> dict[str, Any]:
    """``vitlab fit`` of ``model`` for three epochs of ``plan.steps_per_epoch`` steps from ``data`` (``npz`` or
    ``imagefolder``): throughput of the last epoch, its data wait, and the set-up before the first step."""
    overrides = [
        f"model.name={model}",
        *(f"model.{key}={value}" for key, value in plan.models[model].items() if key != "num_classes"),
        f"data.name={source}",
        f"data.path={data}",
        f"data.batch_size={plan.batch_size}",
        f"data.limit_train={plan.steps_per_epoch * plan.batch_size}",
        "data.val_fraction=0.05",
        "data.augment.random_crop=false",
        "trainer.max_epochs=3",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "trainer.precision=bf16-mixed",
        "trainer.compile=true",
        "trainer.compile_mode=default",  # item 3 times the modes: within the budget, each compiles once here
        f"trainer.compile_backend={plan.compile_backend}",
        "run.test=false",
        "run.export=false",
        "run.report=false",
        f"run.dir={out / f'fit_{model}_{source}'}",
        *plan.fit_overrides,
    ]
    started = time.perf_counter()
    run_dir = fit(build_config(None, overrides))
    wall = time.perf_counter() - started
    rows = RunDir(run_dir).metrics()
    last, images = rows[-1], plan.steps_per_epoch * plan.batch_size
    return {
        "model": model,
        "source": source,
        "overrides": overrides,
        "wall_s": wall,
        "training_s": sum(r["time/epoch_s"] for r in rows),
        "first_epoch_s": rows[0]["time/epoch_s"],
        "last_epoch": {key: last[key] for key in ("time/step_s", "time/epoch_s", "time/data_wait_s")},
        "images_per_s_steps": images / last["time/step_s"],
        "images_per_s_end_to_end": images / last["time/epoch_s"],
        "data_wait_share": last["time/data_wait_s"] / last["time/epoch_s"],
    }


def run_bench(plan: Plan, model: str, out: Path) -> dict[str, Any]:
    record = bench(
        model,
        overrides=plan.models[model],
        batch_size=plan.batch_size,
        precision="bf16-mixed",
        compile=True,
        compile_mode="default",
        compile_backend=plan.compile_backend,
        vs="timm",
        device=plan.device,
        **plan.bench_settings,
    )
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / f"{model}_bf16_b{plan.batch_size}.json").write_text(json.dumps(record, indent=2))
    return record


def run_auto_mode(plan: Plan, model: str) -> dict[str, Any]:
    """``trainer.compile_mode: auto``'s timing for ``model`` at the plan's batch (the dry run: one mode)."""
    torch.manual_seed(0)
    network = create_model(model, **plan.models[model])
    # the CPU's aot_eager backend has no modes; on a GPU, CUDA graphs too (auto does not choose them yet)
    candidates = ("default",) if plan.dry_run else (*CUDA_MODE_CANDIDATES, "reduce-overhead")
    choice = timed_compile_mode(
        network,
        batch_size=plan.batch_size,
        precision="bf16-mixed",
        device=torch.device(plan.device),
        backend=plan.compile_backend,
        candidates=candidates,
    )
    return {"model": model, **asdict(choice)}


# -------------------------------------------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# Training at the GPU's speed: {report['device_name']}{' (CPU dry run)' if report['dry_run'] else ''}",
        "",
        f"{env['time']}, torch {env['versions']['torch']}, git {(env['git']['revision'] or '?')[:10]}, "
        f"{report['seconds']:.0f} s in all.",
        "",
        "| model | network | train img/s | inference img/s | train MFU | ours / timm | ours / timm compiled | "
        "ours / ours eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["bench_rows"]:
        ratios = [row.get(f"train_over_{other}") for other in ("timm", "timm_compiled", "ours_eager")]
        lines.append(
            f"| {row['model']} | {row['network']} | {row['train_img_s']:.1f} | {row['inference_img_s']:.1f} | "
            f"{row['train_mfu']:.1%} | " + " | ".join("-" if r is None else f"{r:.3f}" for r in ratios) + " |"
        )
    lines += [
        "",
        "| fit from | images/s (steps) | images/s (end to end) | data wait share | first epoch s | set-up s | "
        "bench train img/s (ours compiled) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in report["fit"]:
        synthetic = run.get("bench_train_img_s")
        lines.append(
            f"| {run['source']} ({run['model']}) | {run['images_per_s_steps']:.0f} | "
            f"{run['images_per_s_end_to_end']:.0f} | {run['data_wait_share']:.1%} | {run['first_epoch_s']:.1f} | "
            f"{run['wall_s'] - run['training_s']:.1f} | {'-' if synthetic is None else f'{synthetic:.0f}'} |"
        )
    if report.get("auto_mode"):
        auto = report["auto_mode"]
        lines += ["", f"trainer.compile_mode=auto for {auto['model']}: {auto['mode']} ({auto['reason']})"]
    for key, title in (("skipped", "Skipped (time budget)"), ("errors", "Errors")):
        if report[key]:
            lines += ["", f"{title}: " + "; ".join(report[key])]
    return "\n".join(lines) + "\n"


def results_folder(parent: Path, dry_run: bool) -> Path:
    """``parent/gpu_speed_<device>_<date>`` (:mod:`benchmarks.naming`), ``gpu_speed_dryrun_<cpu>_<date>`` for a dry
    run."""
    machine = device_name(torch.cuda.get_device_name(0) if not dry_run else cpu_model())
    what = "gpu_speed_dryrun" if dry_run else "gpu_speed"
    return parent / f"{what}_{machine}_{time.strftime('%Y-%m-%d', time.gmtime())}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "experiments"), help="the folder the results folder goes in")
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds for everything (items are skipped)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU dry run even with CUDA present")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:
        print("gpu_speed: no CUDA device (torch.cuda.is_available() is False); running the CPU dry run instead")
    plan = dry_plan() if args.dry_run or not cuda else gpu_plan()
    out = results_folder(Path(args.out), plan.dry_run)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "dry_run": plan.dry_run,
        "device_name": torch.cuda.get_device_name(0) if not plan.dry_run else f"CPU ({cpu_model()})",
        "environment": environment(),
        "budget_s": args.budget_s,
        **{key: [] for key in ("skipped", "errors", "bench", "bench_rows", "fit")},
    }
    durations: list[float] = []

    def item(what: str, work: Any) -> Any:
        """``work()`` if, taking as long as the longest item so far, it ends within the budget; None if skipped or
        failed (one broken item must not lose the others' numbers)."""
        if time.perf_counter() - started + max(durations, default=0.0) > args.budget_s:
            report["skipped"].append(what)
            return None
        t0 = time.perf_counter()
        try:
            result = work()
            print(f"gpu_speed: {what} done ({time.perf_counter() - t0:.0f} s)", flush=True)
            return result
        except Exception as e:
            report["errors"].append(f"{what}: {type(e).__name__}: {e}")
            print(f"gpu_speed: {what} failed: {e}", file=sys.stderr, flush=True)
            return None
        finally:
            durations.append(time.perf_counter() - t0)

    for model in plan.models:
        if record := item(f"bench {model}", lambda m=model: run_bench(plan, model=m, out=out)):
            report["bench"].append(record)
            report["bench_rows"] += bench_rows(record)
    first = next(iter(plan.models))
    synthetic = {row["model"]: row["train_img_s"] for row in report["bench_rows"] if row["network"] == "ours"}
    with tempfile.TemporaryDirectory() as tmp:
        # the training images after the 20% test split and the 5% validation split, and a batch to spare
        count = int(plan.steps_per_epoch * plan.batch_size / (0.8 * 0.95)) + plan.batch_size
        npz, jpeg = make_images(Path(tmp), count, plan.image_size, plan.classes)
        for source, data in (("npz", npz), ("imagefolder", jpeg)):
            if run := item(f"fit {first} from {source}", lambda s=source, d=data: run_fit(plan, first, s, d, out)):
                report["fit"].append({**run, "bench_train_img_s": synthetic.get(first)})
    report["auto_mode"] = item(f"compile mode auto for {first}", lambda: run_auto_mode(plan, first))
    report["seconds"] = time.perf_counter() - started
    (out / "gpu_speed.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_speed.md").write_text(markdown(report))
    print(f"gpu_speed: wrote {out / 'gpu_speed.json'} and {out / 'gpu_speed.md'} ({report['seconds']:.0f} s)")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

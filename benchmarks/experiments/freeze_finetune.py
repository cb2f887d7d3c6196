"""The fine-tuning protocol of issue 61 ("Freezing that pays"): pretrain once per seed, then fine-tune every freezing
arm from those weights, same seeds, same epochs, same machine, interleaved; one small JSON per finished run.

    python -m benchmarks.experiments.freeze_finetune --setting cross_p4_d4 --seeds 0 1 2 3 4 \
        --runs /path/outside/the/tree --results benchmarks/results/experiments/freeze_finetune_cross_p4_d4_<cpu>_<date>

Settings (``SETTINGS``): the transfer (``cross``: the 30k CIFAR-10 subset to 576 CelebA-32 faces, the fine-tuning
recipe of docs/recipes.md; ``within``: CIFAR-10's classes 0-4 to 1,000 images of classes 5-9, the case in which the
field reports that front layers are done early), the patch (4: 64 tokens; 2: 256 tokens at 32x32) and the depth
(4 blocks, vit_pico's; 12, as the models users fine-tune). Arms (``ARMS``): no freezing; ViTCAE's eq. 26 head
freezing under the response rule; layer freezing on the heads' signal, with and without the cache; an AutoFreeze-
style arm (Liu et al. 2021: a layer's gradient-norm change rate); a FreezeOut-style arm (Brock et al. 2017: a fixed
schedule by fraction of training); the first k layers frozen from the start; the last two with the cache of the
frozen blocks' outputs (``*_cache``). Each arm is one ``vitlab fit`` with
overrides; the run order rotates with the seed so that a slow spell of a shared machine does not fall on one arm.
``--pretrain vitcae`` pretrains ViTCAE (``vitcae_pico``, the same encoder shape as ``vit_pico``) instead of the ViT and
fine-tunes ``vit_pico`` from its encoder, with the per-head temperatures it learnt (``model.temperature=true``).

Resumable: a finished run (``test_metrics.json``) is skipped, an interrupted one continues from ``last.ckpt``
(``vitlab fit --resume``), and its results file is written as soon as it ends (the pretraining's export hash in it).
The within-domain halves of CIFAR-10 are written next to the runs (``cifar10_a.npz``, ``cifar10_b.npz``) from
``--data``'s ``cifar10.npz``. Summary: ``python -m benchmarks.reports.freeze_finetune_summary RESULTS``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.experiments.run_result import run_result
from vitlab.rundir import LAYERS_FILE, RunDir

#: transfer -> (pretraining data file, fine-tuning data file, fine-tuning overrides)
TRANSFERS = {
    "cross": ("cifar10.npz", "celeba32_subset.npz", ["data.target=Male", "data.limit_train=576"]),
    "within": ("cifar10_a.npz", "cifar10_b.npz", ["data.target=null", "data.limit_train=1000"]),
}
SETTINGS = {
    f"{transfer}_p{patch}_d{depth}": (transfer, patch, depth)
    for transfer in TRANSFERS
    for patch in (4, 2)
    for depth in (4, 12)
}
#: arm -> the overrides of ``vitlab fit`` on top of the fine-tuning config (docs/dynamics.md, "Layer freezing")
ARMS = {
    "none": ["dynamics=null"],  # no controller, no probe: what a user runs without freezing
    "heads": ["model.temperature=true", "dynamics.mode=schedule", "dynamics.freeze=true"],
    "layers": ["dynamics.mode=fixed", "dynamics.freeze=layers", "dynamics.layer_signal=heads"],
    "layers_cache": [
        "dynamics.mode=fixed",
        "dynamics.freeze=layers",
        "dynamics.layer_signal=heads",
        "dynamics.cache_frozen=true",
    ],
    "autofreeze": ["dynamics.mode=fixed", "dynamics.freeze=layers", "dynamics.layer_signal=gradnorm"],
    "freezeout": ["dynamics.mode=fixed", "dynamics.freeze=layers", "dynamics.layer_signal=schedule"],
    "static": ["dynamics.mode=fixed", "dynamics.freeze=layers", "dynamics.layer_signal=static"],  # + freeze_layers
}
#: the cache of the frozen blocks' outputs (training and validation images) under the two signals that freeze: the
#: same accuracy as the uncached arm (the cache is exact), so they measure the time the cache saves
ARMS |= {f"{arm}_cache": [*ARMS[arm], "dynamics.cache_frozen=true"] for arm in ("freezeout", "static")}
#: the fine-tuning of every arm: no random augmentation, so that the cache of the frozen blocks' outputs is exact
#: (docs/dynamics.md, "Freezing layers") and every arm trains on the same inputs
FINETUNE = ["data.augment.hflip=false"]


def arm_overrides(arm: str, depth: int) -> list[str]:
    """``ARMS[arm]``; the static arm freezes the first half of the blocks from the start."""
    return ARMS[arm] + ([f"dynamics.freeze_layers={depth // 2}"] if arm.startswith("static") else [])


#: the pretrained model -> (the pretraining's overrides, the fine-tuning's overrides)
PRETRAIN = {
    "vit": ([], []),
    "vitcae": (["model.name=vitcae_pico", "run.generate=false"], ["model.temperature=true"]),
}


def pretrain_name(transfer: str, patch: int, depth: int, seed: int, model: str = "vit") -> str:
    source = "cifar10" if transfer == "cross" else "cifar10a"
    return f"pre-{source}{'' if model == 'vit' else '-' + model}-p{patch}-d{depth}-s{seed}"


def split_cifar10(data: Path, out: Path) -> None:
    """CIFAR-10's classes 0-4 (``cifar10_a.npz``) and 5-9 (``cifar10_b.npz``, relabelled 0-4), train and test."""
    source = np.load(data / "cifar10.npz")
    for name, first in (("cifar10_a", 0), ("cifar10_b", 5)):
        path = out / f"{name}.npz"
        if path.exists():
            continue
        arrays = {}
        for split in ("train", "test"):
            keep = (source[f"y_{split}"] >= first) & (source[f"y_{split}"] < first + 5)
            arrays[f"x_{split}"] = source[f"x_{split}"][keep]
            arrays[f"y_{split}"] = (source[f"y_{split}"][keep] - first).astype(np.int64)
        np.savez(out / f"{name}.tmp.npz", **arrays)
        os.replace(out / f"{name}.tmp.npz", path)


def fit(vitlab: str, run: Path, args: list[str]) -> float:
    """Train ``run`` (or continue it); the wall seconds of this call (a resumed run adds its calls)."""
    if (run / "test_metrics.json").exists():
        return 0.0
    resume = (run / "checkpoints" / "last.ckpt").exists()
    command = [vitlab, "fit", "--resume", str(run)] if resume else [vitlab, "fit", *args, f"run.dir={run}"]
    print(("resuming " if resume else "training ") + run.name, flush=True)
    start, cpu = time.monotonic(), _children_cpu()
    with open(f"{run}.log", "a") as log:
        subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    wall = time.monotonic() - start
    for suffix, seconds in ((".wall", wall), (".cpu", _children_cpu() - cpu)):
        path = Path(f"{run}{suffix}")
        path.write_text((path.read_text() if path.exists() else "") + f"{seconds:.2f}\n")
    return wall


def _seconds(path: Path) -> list[float]:
    return [float(s) for s in path.read_text().split()] if path.exists() else []


def _children_cpu() -> float:
    """The CPU seconds (user + system) of the finished child processes: with one thread per run, the fit's time on a
    quiet machine, far less sensitive than the wall clock to other work on the other core."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def clause_pass_epochs(records: list[dict[str, Any]]) -> dict[str, list[int | None]]:
    """Per encoder layer, the first epoch at which every head of the layer passes each clause of the response rule
    (``drift``: drift per unit rate below its threshold; ``score``: score drift per unit rate below its own;
    ``directed``: directedness below rho; ``converged``: the rule's verdict), None where never: what the heads'
    signal saw, whether or not the arm froze on it."""
    clauses: dict[str, Any] = {
        "drift": lambda r: _below(r.get("response_level"), r.get("threshold")),
        "score": lambda r: _below(r.get("score_level"), r.get("score_threshold")),
        "directed": lambda r: _below(r.get("directedness"), _like(r.get("directedness"), r.get("rho"))),
        "converged": lambda r: r.get("converged"),
    }  # fmt: skip
    out: dict[str, list[int | None]] = {}
    for name, passes in clauses.items():
        first: dict[int, int] = {}
        for record in records:
            for layer, row in enumerate(passes(record) or []):
                if row and all(row):
                    first.setdefault(layer, record["epoch"])
        layers = len(records[-1].get("tau", [])) if records else 0
        out[name] = [first.get(layer) for layer in range(layers)]
    return out


def _like(grid: list | None, value: float | None) -> list | None:
    return None if grid is None or value is None else [[value] * len(row) for row in grid]


def _below(levels: list | None, limits: list | None) -> list[list[bool]] | None:
    if levels is None or limits is None:
        return None
    return [
        [v is not None and t is not None and v < t for v, t in zip(lv, lt, strict=True)]
        for lv, lt in zip(levels, limits, strict=True)
    ]


def freezing_record(run: Path) -> dict[str, Any]:
    """What the run's freezing saw: the per-layer clause pass epochs and the layer-freezing records."""
    layers = run / LAYERS_FILE
    return {
        "clause_pass_epochs": clause_pass_epochs(RunDir(run).dynamics()),
        "layer_freezing": [json.loads(line) for line in layers.read_text().splitlines()] if layers.is_file() else [],
    }


def run_record(run: Path, arm: str, seed: int, setting: str, depth: int, pretrain: Path) -> dict[str, Any]:
    """The results file of one finished fine-tuning run."""
    walls = _seconds(Path(f"{run}.wall"))
    return {
        "experiment": f"freeze_finetune-{setting}",
        "arm": arm,
        "seed": seed,
        "overrides": arm_overrides(arm, depth),
        "pretrained": {"run": pretrain.name, "sha256": sha256(pretrain / "export" / "model.safetensors")},
        "fit_wall_s": sum(walls),
        "fit_calls": len(walls),
        "fit_cpu_s": sum(cpu) if len(cpu := _seconds(Path(f"{run}.cpu"))) == len(walls) else None,
        **run_result(run),
        **freezing_record(run),
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--runs", type=Path, required=True, help="the run folders (outside the work tree)")
    parser.add_argument("--results", type=Path, required=True, help="one <arm>-seed<k>.json per finished run")
    parser.add_argument("--data", type=Path, default=Path("../shared/datasets"), help="the folder of cifar10.npz ...")
    parser.add_argument("--epochs", type=int, default=30, help="fine-tuning epochs")
    parser.add_argument("--pretrain", choices=list(PRETRAIN), default="vit", help="the pretrained model")
    parser.add_argument("--vitlab", default=str(Path(sys.executable).with_name("vitlab")))
    parser.add_argument("--refresh", action="store_true", help="add the freezing records to the files of finished runs")
    args = parser.parse_args()
    transfer, patch, depth = SETTINGS[args.setting]
    args.runs.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    split_cifar10(args.data, args.runs)
    source, target, target_args = TRANSFERS[transfer]
    locate = {name: (args.runs if name.startswith("cifar10_") else args.data) / name for name in (source, target)}
    model = [f"model.patch_size={patch}", f"model.depth={depth}"]
    common = ["trainer.enable_progress_bar=false", "run.report=false"]
    for seed in args.seeds:
        pretrain = args.runs / pretrain_name(transfer, patch, depth, seed, args.pretrain)
        pretraining = ["--config", "finetune/cifar10_pretrain", f"data.path={locate[source]}", f"run.seed={seed}"]
        pretraining += PRETRAIN[args.pretrain][0]
        if not args.refresh:
            fit(args.vitlab, pretrain, [*pretraining, *model, *common])
        arms = args.arms[seed % len(args.arms) :] + args.arms[: seed % len(args.arms)]  # rotate the order per seed
        for arm in arms:
            out = args.results / f"{arm}-seed{seed}.json"
            run = args.runs / f"ft-{args.setting}{'' if args.pretrain == 'vit' else '-' + args.pretrain}-{arm}-s{seed}"
            if out.exists() or args.refresh:  # --refresh trains nothing
                if out.exists() and args.refresh:  # files written before these records existed
                    out.write_text(json.dumps(json.loads(out.read_text()) | freezing_record(run), indent=1) + "\n")
                continue
            fit(args.vitlab, run, [
                "--config", "finetune/celeba32_male", f"data.path={locate[target]}", *target_args, *model,
                f"model.pretrained={pretrain}", f"run.seed={seed}", f"trainer.max_epochs={args.epochs}",
                *FINETUNE, *PRETRAIN[args.pretrain][1], *arm_overrides(arm, depth), *common,
            ])  # fmt: skip
            result = run_record(run, arm, seed, args.setting, depth, pretrain)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            tmp.replace(out)
            print(
                f"{arm} seed {seed}: test/acc {result['test']['test/acc']:.4f}, {result['fit_wall_s']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()

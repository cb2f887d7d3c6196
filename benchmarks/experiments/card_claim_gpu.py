"""The card's claim against budget on one GPU (docs/card_claim.md, "The GPU protocol"): the pre-registered design at
a scale that can judge the card, within a time budget.

    python -m benchmarks.experiments.card_claim_gpu --data ../shared/datasets/cifar10.npz --out DIR [--budget-s 420]
    python -m benchmarks.experiments.card_claim_gpu --dry-run --out DIR   # the same code paths on the CPU, in seconds
    python -m benchmarks.experiments.card_claim_gpu --data PART1 PART2 --out DIR   # npz_transport's parts, joined

On CUDA: the card-shaped CET-ViT (``cet_vit_tiny`` with 8:1 slots, empty slots masked, a learned position
embedding) and its size-matched ViT, Swin and ToMe (``*_matched_cet_vit_tiny``, ~2.3M parameters) at patch 2 (256
tokens), 3 seeds each, on the 30,000-image CIFAR-10 subset (10% validation split, data seed 0; the whole test set),
bf16 autocast, AdamW lr 1e-3, weight decay 0.05, cosine after 1 warm-up epoch, batch 128, label smoothing 0.1,
stochastic depth 0.1, dropout and attention dropout 0.05, CET-ViT's EI ramp at the card's proportions.

The whole data set lives on the GPU and is augmented there (pad-4 random crop, horizontal flip): a CPU data path
could not feed these models. That leaves out the CPU protocol's AutoAugment, RandomErasing and Mixup, for every
model alike (a named deviation from docs/baselines.md's protocol, stated in the output).

Before training, the script measures two ways to share the device and keeps the faster: one after another (a few
steps of each model alone) or all runs at once (one process per model and seed, spawned, each timing a few steps
while the others do: small models leave a GPU mostly idle between one process's kernels, and CET-ViT's per-step
host synchronisation, its SVD, then stalls only its own process). From the chosen way's measured step times it
estimates the run's time (also from the models' training FLOPs); if the planned epochs (default 100) do not fit
``--budget-s``, it shrinks them to fit and says so. Each finished run is written at once to
``DIR/runs/<model>-seed<seed>.json`` (a call cut off by its time limit keeps what finished); at the end
``DIR/card_claim_gpu.json`` (every run: test accuracy of the best-validation epoch, the validation curve, time, the
plan, both ways' measurements and its estimate, the environment) and ``DIR/card_claim_gpu.md``. Without CUDA and
without ``--dry-run`` it records that no GPU was available and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.naming import repo_relative
from vitlab.atomic import atomic_write_text
from vitlab.families.cet_vit.ei import assignment_singular_values, ei_weight
from vitlab.models import create_model
from vitlab.models.sizing import count_params, flops_per_image
from vitlab.rundir import environment

CARD = dict(pos_embed="learned", slot_ratio=8, mask_empty_slots=True)
REG = dict(drop_path_rate=0.1, drop_rate=0.05, attn_drop_rate=0.05)
GPU_MODELS = {
    "cet_card": ("cet_vit_tiny", dict(patch_size=2, **CARD, **REG)),
    "vit": ("vit_matched_cet_vit_tiny", dict(patch_size=2, **REG)),
    "swin": ("swin_matched_cet_vit_tiny", dict(patch_size=2, **REG)),
    "tome": ("tome_matched_cet_vit_tiny", dict(patch_size=2, **REG)),
}
DRY_MODELS = {
    "cet_card": ("cet_vit_pico", dict(patch_size=4, **CARD)),
    "vit": ("vit_pico", dict(patch_size=4)),
}
DEVIATIONS = "GPU-side augmentation only (pad-4 crop, flip): no AutoAugment, RandomErasing or Mixup, for every model"


def load_data(path: Path | None, dry_run: bool, device: torch.device) -> dict[str, torch.Tensor]:
    """uint8 NHWC images and int64 labels on ``device``: the npz's train split into train / 10% validation (data
    seed 0), and its whole test split; the dry run makes 64 + 16 + 16 random 32x32 images."""
    if dry_run:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (96, 32, 32, 3), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (96,), generator=g)
        parts = {"train": (x[:64], y[:64]), "val": (x[64:80], y[64:80]), "test": (x[80:], y[80:])}
    else:
        if path is None or not path.is_file():
            raise SystemExit(f"error: --data {path} is not a file; pass the CIFAR-10 npz (x_train, y_train, ...)")
        with np.load(path) as f:
            x, y = torch.from_numpy(f["x_train"]), torch.from_numpy(f["y_train"]).long()
            x_test, y_test = torch.from_numpy(f["x_test"]), torch.from_numpy(f["y_test"]).long()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        n_val = len(x) // 10
        parts = {
            "train": (x[order[n_val:]], y[order[n_val:]]),
            "val": (x[order[:n_val]], y[order[:n_val]]),
            "test": (x_test, y_test),
        }
    return {f"{k}_{i}": t.to(device) for k, (xs, ys) in parts.items() for i, t in (("x", xs), ("y", ys))}


def npz_of(paths: list[Path] | None) -> Path | None:
    """The npz to read: the one given, or the packed parts given (a lent machine's copy,
    ``benchmarks/experiments/npz_transport.py``) joined into a temporary npz after their SHA-256 check."""
    if not paths or not paths[0].is_dir():
        return paths[0] if paths else None
    import tempfile

    from benchmarks.experiments.npz_transport import unpack

    joined = Path(tempfile.mkdtemp(prefix="card_claim_gpu_")) / "data.npz"
    unpack(paths, joined)
    return joined


MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


def to_input(x: torch.Tensor, train: bool, generator: torch.Generator) -> torch.Tensor:
    """uint8 NHWC -> normalised float NCHW; in training a pad-4 random crop and a random horizontal flip."""
    x = x.permute(0, 3, 1, 2).float().div_(255)
    if train:
        b, _, h, w = x.shape
        padded = F.pad(x, (4, 4, 4, 4))
        dx = torch.randint(0, 9, (b,), device=x.device, generator=generator)
        dy = torch.randint(0, 9, (b,), device=x.device, generator=generator)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        x = padded[
            torch.arange(b, device=x.device)[:, None, None, None],
            torch.arange(3, device=x.device)[None, :, None, None],
            rows,
            cols,
        ]
        flip = torch.rand(b, device=x.device, generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return (x - MEAN.to(x.device)) / STD.to(x.device)


def build(key: str, models: dict[str, tuple[str, dict[str, Any]]], seed: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(seed)
    preset, overrides = models[key]
    return create_model(preset, img_size=32, in_chans=3, num_classes=10, **overrides).to(device)


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epoch: int, epochs: int) -> torch.Tensor:
    """Cross-entropy with label smoothing 0.1; for CET-ViT plus its EI term on the card's ramp (epochs/6 -> 2/3)."""
    if hasattr(model, "forward_with_aux"):
        weight = ei_weight(epoch, 0.05, epochs / 6, 2 * epochs / 3, "ramp")
        logits, aux = model.forward_with_aux(x, compute_ei=weight > 0)
        return F.cross_entropy(logits, y, label_smoothing=0.1) + aux.regularization(weight, 0.01)
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, autocast: Any) -> float:
    model.eval()
    correct = torch.zeros((), device=x.device)
    with torch.no_grad(), autocast():
        for i in range(0, len(x), batch):
            xb = to_input(x[i : i + batch], False, None)  # type: ignore[arg-type]
            correct += (model(xb).argmax(-1) == y[i : i + batch]).sum()
    model.train()
    return float(correct) / len(x)


def step_time(model: torch.nn.Module, data: dict[str, torch.Tensor], batch: int, autocast: Any, steps: int) -> float:
    """Seconds per training step (after 2 warm-up steps), on the device's clock."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device=data["train_x"].device).manual_seed(0)
    x, y = data["train_x"][:batch], data["train_y"][:batch]
    for i in range(steps + 2):
        if i == 2:
            sync(x.device)
            start = time.perf_counter()
        with autocast():
            loss = loss_of(model, to_input(x, True, g), y, epoch=10**6, epochs=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(x.device)
    return (time.perf_counter() - start) / steps


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_run(key, models, seed, data, epochs, batch, autocast, device) -> dict[str, Any]:
    """One model and seed: AdamW, cosine after 1 warm-up epoch; test accuracy at the best validation epoch."""
    model = build(key, models, seed, device)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n and "token" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n and "token" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}], lr=1e-3)
    n = len(data["train_x"])
    steps_per_epoch = math.ceil(n / batch)
    total = epochs * steps_per_epoch
    warm = min(steps_per_epoch, total)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))
    )
    g = torch.Generator(device=device).manual_seed(seed)
    best_val, test_at_best, curve = -1.0, None, []
    start = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(n, device=device, generator=g)
        for i in range(steps_per_epoch):
            idx = order[i * batch : (i + 1) * batch]
            with autocast():
                loss = loss_of(model, to_input(data["train_x"][idx], True, g), data["train_y"][idx], epoch, epochs)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        if not torch.isfinite(loss):
            raise SystemExit(f"error: {key} seed {seed} went non-finite at epoch {epoch}; stopping")
        val = accuracy(model, data["val_x"], data["val_y"], 500, autocast)
        curve.append(val)
        if val > best_val:
            best_val, test_at_best = val, accuracy(model, data["test_x"], data["test_y"], 500, autocast)
    sync(device)
    return {
        "model": key,
        "preset": models[key][0],
        "seed": seed,
        "epochs": epochs,
        "tokens": 256,
        "params": count_params(model)["total"],
        "gflops": flops_per_image(model) / 1e9,
        "test_acc": test_at_best,
        "best_val_acc": best_val,
        "val_curve": curve,
        "seconds": time.perf_counter() - start,
    }


def provenance(env: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """What every per-run file records beside its numbers (the results files' rule): the command (the script's path
    relative to the repository), git revision, CPU, torch, GPU and the precision."""
    return {
        "command": ["python", *repo_relative(env["command"])],
        "git": env["git"],
        "cpu": env["hardware"]["cpu_model"],
        "torch": env["versions"]["torch"],
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
    }


def _save_run(folder: Path, run: dict[str, Any]) -> None:
    atomic_write_text(folder / f"{run['model']}-seed{run['seed']}.json", json.dumps(run, indent=1) + "\n")


def _device(dry_run: bool) -> torch.device:
    """CUDA when there is one, except in the dry run (the CPU)."""
    return torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")


def _setting(dry_run: bool, ei_svd: str) -> tuple[dict[str, tuple[str, dict[str, Any]]], torch.device, Any]:
    """The models (CET-ViT's EI singular values computed the ``ei_svd`` way), the device and the autocast context
    factory of a run (the dry run: tiny models, the CPU)."""
    device = _device(dry_run)
    dtype = torch.bfloat16 if device.type == "cuda" else None

    def autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    models = dict(DRY_MODELS if dry_run else GPU_MODELS)
    preset, overrides = models["cet_card"]
    models["cet_card"] = (preset, {**overrides, "ei_svd": ei_svd})
    return models, device, autocast


def choose_ei_svd(device: torch.device, dry_run: bool) -> dict[str, Any]:
    """CET-ViT's EI singular values timed two ways on ``device`` at the GPU models' shape (``[128, 256, 32]``,
    forward and backward; ``benchmarks/micro/ei_svd_cuda.py``): ``svdvals`` (``device``) and the float64 Gram
    eigenvalues (``gram``, the same values to about 1e-8 of the largest). The faster is used; the choice changes the
    arithmetic's rounding, not the model or the loss."""
    from benchmarks.micro.ei_svd_cuda import assignment, time_way

    batch, tokens, slots = (4, 64, 8) if dry_run else (128, 256, 32)
    S = assignment(batch, tokens, slots, torch.Generator().manual_seed(0)).float().to(device)
    weight = torch.ones(batch, slots, device=device)
    ms = {
        way: float(np.median(time_way(lambda x, way=way: assignment_singular_values(x, way), S, weight, 5)))
        for way in ("device", "gram")
    }
    return {"ei_svd": min(ms, key=ms.get), "ms_forward_backward": ms, "shape": [batch, tokens, slots]}


def _worker(key: str, seed: int, common: dict[str, Any], start: Any, inbox: Any, outbox: Any) -> None:
    """One run of the "at once" way, in its own process: once every run has its data and model (``start``, a
    barrier), time ``common["calibration_steps"]`` steps while the others do, report them, wait for the parent's
    number of epochs (0: stop), train, save the run and report it. ``common``: ``npz``, ``dry_run``, ``ei_svd``,
    ``batch``, ``folder``, ``calibration_steps``."""
    import traceback

    torch.set_num_threads(1)
    try:
        models, device, autocast = _setting(common["dry_run"], common["ei_svd"])
        data = load_data(common["npz"], common["dry_run"], device)
        batch = common["batch"]
        model = build(key, models, seed, device)
        start.wait()
        step_s = step_time(model, data, batch, autocast, common["calibration_steps"])
        del model
        outbox.put(("calibrated", key, seed, step_s))
        epochs = inbox.get()
        if epochs:
            run = train_run(key, models, seed, data, epochs, batch, autocast, device) | common["provenance"]
            _save_run(common["folder"], run)
            outbox.put(("done", key, seed, run))
    except BaseException:  # every failure goes to the parent, which names the run
        outbox.put(("failed", key, seed, traceback.format_exc()))


class _Concurrent:
    """The "at once" way: one spawned process per (model, seed), each with its own copy of the data on the device."""

    def __init__(self, specs: list[tuple[str, int]], common: dict[str, Any]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.specs = specs
        self.outbox = ctx.Queue()
        self.inboxes = {spec: ctx.Queue() for spec in specs}
        self.start = start = ctx.Barrier(len(specs))  # kept: the children open it after the parent's __init__
        self.procs = {
            spec: ctx.Process(
                target=_worker,
                args=(*spec, common, start, self.inboxes[spec], self.outbox),
                daemon=True,
            )
            for spec in specs
        }
        for proc in self.procs.values():
            proc.start()

    def _collect(self, kind: str) -> dict[tuple[str, int], Any]:
        """Every run's ``kind`` message; a run that reports a failure, or whose process dies without a word (killed,
        out of memory), stops them all with an error that names it."""
        import queue

        got: dict[tuple[str, int], Any] = {}
        while len(got) < len(self.specs):
            try:
                what, key, seed, value = self.outbox.get(timeout=5)
            except queue.Empty:
                dead = [spec for spec, proc in self.procs.items() if spec not in got and proc.exitcode not in (None, 0)]
                if dead:
                    self.stop()
                    key, seed = dead[0]
                    raise SystemExit(
                        f"error: the run {key} seed {seed} died (exit code {self.procs[dead[0]].exitcode})"
                    ) from None
                continue
            if what == "failed":
                self.stop()
                raise SystemExit(f"error: the run {key} seed {seed} failed in its process:\n{value}")
            if what == kind:
                got[(key, seed)] = value
        return got

    def calibrate(self) -> dict[tuple[str, int], float]:
        return self._collect("calibrated")

    def train(self, epochs: int) -> list[dict[str, Any]]:
        for inbox in self.inboxes.values():
            inbox.put(epochs)
        done = self._collect("done")
        for proc in self.procs.values():
            proc.join()
        return [done[spec] for spec in self.specs]

    def stop(self) -> None:
        """End every process: those waiting at the barrier are released (a run that failed before it never
        arrives), those waiting for their epochs get 0; one still alive after that is killed."""
        self.start.abort()
        for inbox in self.inboxes.values():
            inbox.put(0)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data",
        type=Path,
        nargs="+",
        help="the CIFAR-10 npz, or every part of it packed by benchmarks/experiments/npz_transport.py",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=100, help="planned epochs, shrunk to fit --budget-s")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(  # a lent machine's call ends at 600 s: data, start-up and the last evaluations fit in the rest
        "--budget-s", type=float, default=420.0, help="wall-clock budget of the training (default 420)"
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny models, random data, the CPU, one epoch")
    parser.add_argument("--note", default="", help="why no GPU ran it, recorded beside 'no CUDA device'")
    parser.add_argument(
        "--way", choices=["at once", "one after another"], help="with --dry-run: force a way (tests of both paths)"
    )
    parser.add_argument(
        "--ei-svd", choices=["device", "gram"], help="CET-ViT's EI singular values this way (default: the faster)"
    )
    args = parser.parse_args(argv)
    out_json = args.out / "card_claim_gpu.json"
    if out_json.exists():
        raise SystemExit(f"error: {out_json} exists; pass another --out (results are never overwritten)")
    env = environment()
    if not torch.cuda.is_available() and not args.dry_run:
        note = "no CUDA device: nothing ran" + (f" ({args.note})" if args.note else "")
        atomic_write_text(out_json, json.dumps({"gpu": None, "note": note, "environment": env}, indent=1))
        print(f"no CUDA device; recorded in {out_json}")
        return 0
    svd_choice = choose_ei_svd(_device(args.dry_run), args.dry_run)
    if args.ei_svd:
        svd_choice |= {"ei_svd": args.ei_svd, "forced": True}
    models, device, autocast = _setting(args.dry_run, svd_choice["ei_svd"])
    batch = 16 if args.dry_run else 128
    npz = npz_of(args.data)
    data = load_data(npz, args.dry_run, device)
    steps_per_epoch = math.ceil(len(data["train_x"]) / batch)
    eval_share = (len(data["val_x"]) + len(data["test_x"])) / (3 * len(data["train_x"]))  # forward only, ~1/3
    timing = {}
    for key in models:
        model = build(key, models, 0, device)
        timing[key] = {
            "step_s": step_time(model, data, batch, autocast, 2 if args.dry_run else 10),
            "train_gflops_per_image": 3 * flops_per_image(model) / 1e9,
        }
    del model
    sequential_epoch_s = sum(t["step_s"] for t in timing.values()) * steps_per_epoch * len(args.seeds)
    sequential_epoch_s *= 1 + eval_share
    specs = [(key, seed) for seed in args.seeds for key in models]
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    common = {
        "npz": npz,
        "dry_run": args.dry_run,
        "ei_svd": svd_choice["ei_svd"],
        "batch": batch,
        "folder": args.out / "runs",
        "calibration_steps": 2 if args.dry_run else 10,
        "provenance": provenance(env, device),
    }
    pool = _Concurrent(specs, common)
    concurrent = pool.calibrate()  # seconds per step of each run while every run steps at once
    concurrent_epoch_s = max(concurrent.values()) * steps_per_epoch * (1 + eval_share)
    way = "at once" if concurrent_epoch_s < sequential_epoch_s else "one after another"
    if args.dry_run and args.way:
        way = args.way
    per_epoch = concurrent_epoch_s if way == "at once" else sequential_epoch_s
    epochs = 1 if args.dry_run else max(1, min(args.epochs, int(0.85 * args.budget_s / per_epoch)))
    images = len(data["train_x"]) * epochs * len(args.seeds)
    plan = {
        "epochs_planned": args.epochs,
        "epochs_run": epochs,
        "way": way,
        "estimate_s": per_epoch * epochs,
        "epoch_s_one_after_another": sequential_epoch_s,
        "epoch_s_at_once": concurrent_epoch_s,
        "step_s_at_once": {f"{k}-seed{s}": t for (k, s), t in concurrent.items()},
        "train_tflop": sum(t["train_gflops_per_image"] for t in timing.values()) * images / 1e3,
        "measured_tflops_per_s": {
            k: t["train_gflops_per_image"] * batch / t["step_s"] / 1e3 for k, t in timing.items()
        },
        "steps_per_epoch": steps_per_epoch,
        "ei_svd": svd_choice,
        "timing": timing,
        "deviations": DEVIATIONS,
    }
    print(
        f"plan: {len(models)} models x {len(args.seeds)} seeds x {epochs} epochs (planned {args.epochs}), {way} "
        f"(an epoch of every run: {sequential_epoch_s:.1f} s one after another, {concurrent_epoch_s:.1f} s at "
        f"once), estimated {plan['estimate_s']:.0f} s on {device}",
        flush=True,
    )
    if way == "at once":
        runs = pool.train(epochs)
    else:
        pool.stop()
        runs = []
        for key, seed in specs:
            runs.append(train_run(key, models, seed, data, epochs, batch, autocast, device) | common["provenance"])
            _save_run(args.out / "runs", runs[-1])
    result = {
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "dry_run": args.dry_run,
        "plan": plan,
        "runs": runs,
        "environment": env,
        "command": ["python", *repo_relative(sys.argv)],
    }
    lines = ["| model | seed | epochs | params | test top-1 | best val | s |", "|---|---|---|---|---|---|---|"]
    lines += [
        f"| {r['model']} | {r['seed']} | {r['epochs']} | {r['params']:,} | {100 * r['test_acc']:.2f}% | "
        f"{100 * r['best_val_acc']:.2f}% | {r['seconds']:.0f} |"
        for r in runs
    ]
    atomic_write_text(out_json, json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out / "card_claim_gpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

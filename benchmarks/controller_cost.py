"""What the attention-dynamics controller costs per epoch, against the epoch's training time.

Two measurements:

1. ``digits``: a real ``vitlab fit`` of ``vit/digits`` (ViT-pico with temperature, 4x4 patch grid) for a few
   epochs with the controller on; per epoch, ``dynamics.jsonl`` records the controller's seconds and the epoch's
   seconds without it.
2. ``synthetic``: a ViT-micro (width 192, depth 6, 3 heads) on 32x32 RGB images with 4x4 patches (64 tokens), or
   64x64 images (256 tokens). One controller epoch (probe 256, kappa on 32 images) is timed with its parts (probe
   forward with attention captured, drift by exact optimal transport, cluster counts by eigenvalues) and set
   against the time of a CIFAR-10-sized training epoch (45,000 images, batch 128), estimated from timed steps.

Each controller part is timed as the minimum over ``--repeats`` runs, the training step as the median of
``--steps``. Run (single-threaded, a few minutes)::

    python benchmarks/controller_cost.py --threads 1

Writes ``benchmarks/results/controller_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.config import build_config
from vitlab.diagnostics import DynamicsConfig, DynamicsController, attention_drift, consensus_clusters
from vitlab.diagnostics.plots import read_dynamics
from vitlab.layers import capture_attention
from vitlab.models.vit import VisionTransformer
from vitlab.training.run import fit


def digits_fit(epochs: int) -> dict:
    """A real fit with the controller: its seconds against the epoch's seconds, per epoch."""
    with tempfile.TemporaryDirectory() as root:
        overrides = [
            f"run.dir={root}/run",
            f"trainer.max_epochs={epochs}",
            "trainer.enable_progress_bar=false",
            "model.temperature=true",
            "run.test=false",
            "run.export=false",
            "run.generate=false",
            "dynamics.mode=schedule",
        ]
        run_dir = fit(build_config("vit/digits", overrides))
        records = read_dynamics(run_dir)
    rows = [
        {"epoch": r["epoch"], "controller_s": r["seconds"], "epoch_s": r["epoch_seconds"]}
        for r in records
        if r["epoch_seconds"] is not None
    ]
    controller = statistics.median(r["controller_s"] for r in rows)
    epoch = statistics.median(r["epoch_s"] for r in rows)
    return {
        "case": "digits: the vit/digits config with temperature (16 patches), probe 256 capped at the validation set",
        "epochs": rows,
        "controller_s": controller,
        "epoch_s": epoch,
        "controller_over_epoch": controller / epoch,
    }


def synthetic(tokens: int, args: argparse.Namespace) -> dict:
    """One controller epoch and its parts against an estimated CIFAR-10-sized training epoch."""
    grid, patch = math.isqrt(tokens), 4
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=grid * patch,
        patch_size=patch,
        in_chans=3,
        num_classes=10,
        embed_dim=192,
        depth=6,
        num_heads=3,
        temperature=True,
    )
    config = DynamicsConfig(probe_size=args.probe, kappa_images=args.kappa_images)
    controller = DynamicsController(config)
    controller.attach(model)
    probe = torch.randn(args.probe, 3, grid * patch, grid * patch)

    def fastest(work, repeats: int = args.repeats) -> float:
        """Seconds of ``work()``: the minimum over repeats, the least disturbed by other processes."""
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return min(times)

    def probe_forward() -> list[dict[str, torch.Tensor]]:
        with torch.no_grad():
            model.eval()
            maps = [capture_attention(model, chunk) for chunk in probe.split(config.probe_batch_size)]
            model.train()
        return maps

    maps = probe_forward()
    forward_s = fastest(probe_forward)
    kappa_s = fastest(lambda: [consensus_clusters(m[: args.kappa_images], config.eps) for m in maps[0].values()])
    distributions = controller.measure(probe).distributions
    shifted = torch.roll(distributions, shifts=1, dims=-1)  # a different distribution on every row
    drift_s = fastest(lambda: attention_drift(distributions, shifted, controller.cost))
    controller.advance(controller.measure(probe))
    epochs = []
    for _ in range(args.repeats):  # a full epoch of control (measure, drift, schedule, tracker) after weights moved
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01 * torch.randn_like(parameter))
        epochs.append(fastest(lambda: controller.advance(controller.measure(probe)), repeats=1))
    controller_s = min(epochs)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(args.batch, 3, grid * patch, grid * patch), torch.randint(0, 10, (args.batch,))
    steps = []
    for repeat in range(1 + args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if repeat:
            steps.append(time.perf_counter() - start)
    step_s = statistics.median(steps)
    steps_per_epoch = math.ceil(args.epoch_images / args.batch)
    epoch_s = step_s * steps_per_epoch
    return {
        "case": f"synthetic: vit_micro-size ViT, {tokens} patches, probe {args.probe}, kappa on {args.kappa_images}",
        "tokens": tokens,
        "controller_s": controller_s,
        "parts_s": {"probe_forward_with_capture": forward_s, "drift_pot": drift_s, "kappa_eig": kappa_s},
        "train_step_s": step_s,
        "steps_per_epoch": steps_per_epoch,
        "epoch_s_estimated": epoch_s,
        "controller_over_epoch": controller_s / epoch_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digits-epochs", type=int, default=3)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--probe", type=int, default=256)
    parser.add_argument("--kappa-images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (median)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each controller part (minimum)")
    parser.add_argument("--epoch-images", type=int, default=45_000, help="training images per epoch (CIFAR-10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "controller_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "controller_cost",
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "settings": vars(args),
        "digits": digits_fit(args.digits_epochs),
        "synthetic": [synthetic(tokens, args) for tokens in args.tokens],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    digits = results["digits"]
    print(
        f"{digits['case']}: controller {digits['controller_s']:.2f} s per epoch, epoch {digits['epoch_s']:.2f} s "
        f"({digits['controller_over_epoch']:.0%})"
    )
    for case in results["synthetic"]:
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in case["parts_s"].items())
        print(
            f"{case['case']}: controller {case['controller_s']:.2f} s ({parts}); training epoch of "
            f"{args.epoch_images} images ~ {case['epoch_s_estimated']:.0f} s ({case['train_step_s']:.3f} s/step): "
            f"{case['controller_over_epoch']:.1%}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

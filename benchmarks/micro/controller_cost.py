"""What the attention-dynamics controller costs per epoch, against the epoch's training time.

Three measurements:

1. ``fits``: real ``vitlab fit`` runs with the controller on, for a few epochs; per epoch, ``dynamics.jsonl``
   records the controller's seconds and the epoch's seconds without it. ``vit/digits`` (ViT-nano with temperature,
   4x4 patch grid) and, with ``--celeba PATH`` (the 32x32 CelebA subset npz), ``vitcae/celeba32`` (8x8 grid), each
   with the exact defaults and with the approximations of ``--fast`` (float32 kappa every other epoch, no drift
   at the model's own tau; the adaptive probe with ``--fast`` overrides of its own, see ``--help``). Each record's
   ``seconds_parts`` gives the parts: the probe passes (kappa inside them) and each drift.
2. ``drift_check``: the drift of the synthetic model's probe between two weight states, by ``attention_drift`` and
   by the implementation it replaced (``ot.emd2`` per reduced problem): the largest difference.
3. ``synthetic``: a ViT-micro (width 192, depth 6, 3 heads) on 32x32 RGB images with 4x4 patches (64 tokens), or
   64x64 images (256 tokens). One controller epoch (probe 256, kappa on 32 images) is timed with its parts (probe
   forward with attention captured, drift by exact optimal transport, cluster counts by eigenvalues) and set
   against the time of a CIFAR-10-sized training epoch (45,000 images, batch 128), estimated from timed steps.

Each controller part is timed as the minimum over ``--repeats`` runs, the training step as the median of
``--steps``. Run (single-threaded, a few minutes)::

    python -m benchmarks.micro.controller_cost --threads 1 --celeba ../shared/datasets/celeba32_subset.npz

Writes ``benchmarks/results/micro/controller_cost_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ot
import torch
import torch.nn.functional as F

from vitlab.acceleration.compile_mode import fastest
from vitlab.config import build_config
from vitlab.diagnostics.capture import capture_attention
from vitlab.diagnostics.dynamics import attention_drift, consensus_clusters
from vitlab.diagnostics.plots import read_dynamics
from vitlab.dynamics import DynamicsConfig, DynamicsController
from vitlab.environment import environment
from vitlab.models.vit import VisionTransformer
from vitlab.training.run import fit

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path


def real_fit(case: str, config: str, overrides: list[str], epochs: int) -> dict:
    """A real fit with the controller: its seconds against the epoch's seconds, per epoch."""
    with tempfile.TemporaryDirectory() as root:
        settings = [
            f"run.dir={root}/run",
            f"trainer.max_epochs={epochs}",
            "trainer.enable_progress_bar=false",
            "run.test=false",
            "run.export=false",
            "run.generate=false",
            "dynamics.mode=schedule",
            *overrides,
        ]
        run_dir = fit(build_config(config, settings))
        records = read_dynamics(run_dir)
    rows = [
        {
            "epoch": r["epoch"],
            "controller_s": r["seconds"],
            "epoch_s": r["epoch_seconds"],
            "parts_s": r.get("seconds_parts", {}),
        }
        for r in records
        if r["epoch_seconds"] is not None
    ]
    # From epoch 2 on every part runs (the noise rule's two-epoch drift needs two earlier epochs); means, not
    # medians: with kappa_every > 1 the controller's cost varies from epoch to epoch.
    steady = [r for r in rows if r["epoch"] >= 2] or rows
    controller = statistics.mean(r["controller_s"] for r in steady)
    epoch = statistics.mean(r["epoch_s"] for r in steady)
    names = sorted({name for r in steady for name in r["parts_s"]})
    parts = {name: statistics.mean(r["parts_s"].get(name, 0.0) for r in steady) for name in names}
    return {
        "case": case,
        "config": config,
        "overrides": overrides,
        "epochs": rows,
        "controller_s": controller,
        "epoch_s": epoch,
        "controller_over_epoch": controller / epoch,
        "parts_s": parts,
    }


def reduced_emd2_drift(p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor) -> np.ndarray:
    """The drift as ``attention_drift`` computed it before it called POT's C solver: ``ot.emd2`` per problem on
    ``(p - q)+ -> (p - q)-``. ``p, q: [..., N]`` -> flat ``[R]`` float64."""
    p, q = p.double().reshape(-1, p.shape[-1]), q.double().reshape(-1, q.shape[-1])
    difference = (p / p.sum(-1, keepdim=True) - q / q.sum(-1, keepdim=True)).numpy()
    drift = np.zeros(len(difference))
    for i, delta in enumerate(difference):
        surplus, deficit = delta > 0, delta < 0
        moved = delta[surplus].sum()
        if moved > 0:
            source, target = delta[surplus] / moved, -delta[deficit] / -delta[deficit].sum()
            drift[i] = moved * ot.emd2(source, target, cost.numpy()[np.ix_(surplus, deficit)], check_marginals=False)
    return drift


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

    def probe_forward() -> list[dict[str, torch.Tensor]]:
        with torch.no_grad():
            model.eval()
            maps = [capture_attention(model, chunk) for chunk in probe.split(config.probe_batch_size)]
            model.train()
        return maps

    maps = probe_forward()
    forward_s, _ = fastest(probe_forward, args.repeats)
    kappa_s, _ = fastest(
        lambda: [consensus_clusters(m[: args.kappa_images], config.eps) for m in maps[0].values()], args.repeats
    )
    distributions = controller.measure(probe).distributions
    shifted = torch.roll(distributions, shifts=1, dims=-1)  # a different distribution on every row
    drift_s, _ = fastest(lambda: attention_drift(distributions, shifted, controller.cost), args.repeats)
    controller.advance(controller.measure(probe))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    moved = controller.measure(probe).distributions
    fast_s, fast = fastest(lambda: attention_drift(moved, distributions, controller.cost).flatten().numpy(), 1)
    reference_s, reference = fastest(lambda: reduced_emd2_drift(moved, distributions, controller.cost), 1)
    drift_check = {
        "problems": len(reference),
        "max_abs_difference": float(np.abs(fast - reference).max()),
        "fast_s": fast_s,
        "emd2_s": reference_s,
    }
    epochs = []
    for _ in range(args.repeats):  # a full epoch of control (measure, drift, schedule, tracker) after weights moved
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01 * torch.randn_like(parameter))
        epochs.append(fastest(lambda: controller.advance(controller.measure(probe)), 1)[0])
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
        "drift_check": drift_check,
        "train_step_s": step_s,
        "steps_per_epoch": steps_per_epoch,
        "epoch_s_estimated": epoch_s,
        "controller_over_epoch": controller_s / epoch_s,
    }


def fits(args: argparse.Namespace) -> list[dict]:
    """The real fits: digits and (with ``--celeba``) CelebA-32, exact defaults and the ``--fast`` options."""
    digits = ["model.temperature=true"]
    cases = [
        ("digits, vit/digits (ViT-nano, 24 heads, 4x4 grid)", "vit/digits", digits, args.digits_epochs),
        # Table I's controlled arm on digits (docs/dynamics.md): schedule + freezing, the defaults of the dynamics
        # section (noise rule, probe at tau = 1 with the model's tau logged beside it)
        ("digits, Table I: vitcae/digits (ViTCAE-pico, 16 heads, 4x4 grid)", "vitcae/digits", [], args.digits_epochs),
    ]
    if args.celeba:
        celeba = ["data.name=npz", f"data.path={args.celeba}"]
        cases.append(
            (
                "CelebA-32, vitcae/celeba32 (ViTCAE-pico, 16 heads, 8x8 grid)",
                "vitcae/celeba32",
                celeba,
                args.celeba_epochs,
            )
        )
    results = []
    for case, config, overrides, epochs in cases:
        results.append(real_fit(f"{case}, exact", config, overrides, epochs))
        results.append(real_fit(f"{case}, {' '.join(args.fast)}", config, [*overrides, *args.fast], epochs))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digits-epochs", type=int, default=4)
    parser.add_argument("--celeba", default=None, help="path of the 32x32 CelebA subset npz (skipped without it)")
    parser.add_argument("--celeba-epochs", type=int, default=2)
    parser.add_argument(
        "--fast",
        nargs="*",
        # the adaptive probe (dynamics.probe_min) needs a threshold rule (convergence: relative or absolute), not the
        # default noise rule; pass it here together with dynamics.convergence=absolute to time it
        default=["dynamics.kappa_dtype=float32", "dynamics.kappa_every=2", "dynamics.log_model_tau=false"],
        help="the dynamics overrides of the approximate arm",
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[64])
    parser.add_argument("--probe", type=int, default=256)
    parser.add_argument("--kappa-images", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (median)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each controller part (minimum)")
    parser.add_argument("--epoch-images", type=int, default=45_000, help="training images per epoch (CIFAR-10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(results_path("micro", "controller_cost")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "controller_cost",
        "torch": torch.__version__,
        "environment": environment(),
        "processor": platform.processor() or platform.machine(),
        "threads": args.threads,
        "settings": vars(args),
        "fits": fits(args),
        "synthetic": [synthetic(tokens, args) for tokens in args.tokens],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for case in results["fits"]:
        print(
            f"{case['case']}: controller {case['controller_s']:.3f} s per epoch, epoch {case['epoch_s']:.2f} s "
            f"({case['controller_over_epoch']:.1%}); parts: "
            + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in case["parts_s"].items())
        )
    for case in results["synthetic"]:
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in case["parts_s"].items())
        print(
            f"{case['case']}: controller {case['controller_s']:.2f} s ({parts}); training epoch of "
            f"{args.epoch_images} images ~ {case['epoch_s_estimated']:.0f} s ({case['train_step_s']:.3f} s/step): "
            f"{case['controller_over_epoch']:.1%}; drift vs the emd2 implementation: max difference "
            f"{case['drift_check']['max_abs_difference']:.1e} over {case['drift_check']['problems']} problems"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

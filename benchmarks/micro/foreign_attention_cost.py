"""What reading the attention of a timm model costs: ``capture_attention`` against a plain forward, and the
dynamics controller's probe per epoch of a ``vitlab fit`` of a timm model by name (docs/foreign_models.md).

1. ``capture``: a forward pass of a batch with and without :func:`vitlab.diagnostics.capture.capture_attention`
   (eval, no gradient), alternated round by round, each the fastest of ``--calls`` calls; per round the ratio.
   Models (random weights): timm's ``deit_tiny_patch16_224`` as timm builds it (its SDPA calls intercepted), the
   same through ``vitlab.create_model("timm:...")`` (timm's Attention taken over by vitlab's, read through its
   switch), timm's ``eva02_tiny_patch14_224`` (rotary; SDPA intercepted) and ``swin_tiny_patch4_window7_224``
   (windows; the eager softmax of a query-key product), on 32x32 RGB images in 4x4 patches.
2. ``fits``: ``vitlab fit --config vit/digits model.name=NAME model.img_size=8`` (two blocks of 3 heads, patch 2:
   timm's DeiT and EVA-02, HF's ViT, torchvision's ViT) ``dynamics.mode=fixed dynamics.freeze=false`` for a few
   epochs and seeds; per epoch,
   ``dynamics.jsonl`` records the controller's seconds (the probe of the 144 validation images, the drift and
   kappa) and the epoch's training seconds.

Run (single-threaded, a few minutes)::

    python -m benchmarks.micro.foreign_attention_cost --threads 1

Writes ``benchmarks/results/micro/foreign_attention_cost_<device>_<date>.json`` (:mod:`benchmarks.naming`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import timm
import torch

from benchmarks.naming import repo_relative, results_path
from vitlab.acceleration.compile_mode import fastest
from vitlab.cli.main import main as vitlab_main
from vitlab.diagnostics.capture import capture_attention
from vitlab.environment import environment
from vitlab.models import create_model

SMALL = dict(img_size=32, patch_size=4, num_classes=10)
SWIN = dict(img_size=32, patch_size=4, window_size=4, num_classes=10)
#: label -> a model built with random weights
MODELS = {
    "timm deit_tiny (SDPA intercepted)": lambda: timm.create_model("deit_tiny_patch16_224", **SMALL),
    "timm deit_tiny through vitlab (Attention taken over)": lambda: create_model("timm:deit_tiny_patch16_224", **SMALL),
    "timm eva02_tiny (rotary, SDPA intercepted)": lambda: timm.create_model("eva02_tiny_patch14_224", **SMALL),
    "timm swin_tiny (windows, eager softmax)": lambda: timm.create_model("swin_tiny_patch4_window7_224", **SWIN),
}
#: ``model.name`` -> its size keys, for the fits (two blocks, 16 patches of 2x2 on digits)
FIT_MODELS = {
    "timm:deit_tiny_patch16_224": ["model.patch_size=2", "model.depth=2"],
    "timm:eva02_tiny_patch14_224": ["model.patch_size=2", "model.depth=2"],
    "hf:vit": [
        "model.patch_size=2", "model.depth=2", "model.embed_dim=192", "model.num_heads=3",
        "model.intermediate_size=768",
    ],
    "tv:vision_transformer": [
        "model.patch_size=2", "model.num_layers=2", "model.num_heads=3", "model.hidden_dim=192", "model.mlp_dim=768",
    ],
}  # fmt: skip


def capture_costs(batch: int, rounds: int, calls: int) -> dict[str, dict]:
    """Per model: the seconds of a plain forward and of ``capture_attention``, per round, and their ratios."""
    out = {}
    x = torch.randn(batch, 3, 32, 32)
    for label, build in MODELS.items():
        torch.manual_seed(0)
        model = build().eval()
        plain, captured = [], []
        with torch.no_grad():
            for index in range(rounds):
                pair = [(plain, lambda m=model: m(x)), (captured, lambda m=model: capture_attention(m, x))]
                for times, work in pair if index % 2 == 0 else reversed(pair):
                    times.append(fastest(work, calls, warmup=1)[0])
        ratios = [c / p for c, p in zip(captured, plain, strict=True)]
        out[label] = {
            "plain_seconds": plain,
            "capture_seconds": captured,
            "ratio": ratios,
            "median_ratio": statistics.median(ratios),
            "maps": len(capture_attention(model, x[:1])),
        }
        print(f"{label}: capture / plain forward = {statistics.median(ratios):.2f} (median of {rounds})", flush=True)
    return out


def fit_costs(epochs: int, seeds: list[int]) -> dict[str, dict]:
    """Per model (timm's, HF's, torchvision's) and seed: the controller's seconds and the training seconds of every
    epoch."""
    out: dict[str, dict] = {}
    for name, sizes in FIT_MODELS.items():
        out[name] = {}
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                argv = ["fit", "--config", "vit/digits", f"model.name={name}", "model.img_size=8", *sizes]
                argv += ["dynamics.mode=fixed", "dynamics.freeze=false"]
                argv += [f"trainer.max_epochs={epochs}", f"run.seed={seed}", f"run.dir={run_dir}"]
                argv += ["run.test=false", "run.export=false", "run.report=false"]
                if vitlab_main(argv) != 0:
                    raise SystemExit(f"vitlab {' '.join(argv)} failed")
                records = [json.loads(line) for line in (run_dir / "dynamics.jsonl").read_text().splitlines()]
            controller = [r["seconds"] for r in records[1:]]
            training = [r["epoch_seconds"] for r in records[1:]]
            out[name][f"seed{seed}"] = {
                "command": "vitlab " + " ".join(argv),
                "controller_seconds": controller,
                "epoch_seconds": training,
                "share": [c / (c + t) for c, t in zip(controller, training, strict=True)],
                "heads": [len(records[-1]["drift"]), len(records[-1]["drift"][0])],
            }
            print(f"{name} seed {seed}: controller {controller} s, epochs {training} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--fits-only", action="store_true", help="skip the capture rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = {
        "environment": {
            **environment(),
            "command": repo_relative([sys.executable, "-m", __spec__.name, *sys.argv[1:]]),
        },
        "settings": vars(args),
        "load_average_before": os.getloadavg(),
        "capture": {} if args.fits_only else capture_costs(args.batch, args.rounds, args.calls),
        "fits": fit_costs(args.epochs, args.seeds),
    }
    record["load_average_after"] = os.getloadavg()
    path = results_path("micro", "foreign_attention_cost")
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Token Merging's speed: a ToMe ViT at r = 4 and 8 against the same ViT without merging (r = 0), images/s.

The networks share their weights (ToMe adds no parameters) and are measured alternately in one process by
``vitlab.bench.timing.measure_networks``: the training step (forward, cross-entropy, backward, AdamW) and inference,
after a warm-up, round after round, on the wall clock and on the process's CPU time (which time-sharing with other
processes does not inflate); medians and quartiles over the rounds. The speed-up over r = 0 is formed per round.

Run (single-threaded, batch 64; a few minutes on one core)::

    python -m benchmarks.micro.tome_throughput
    python -m benchmarks.micro.tome_throughput --model tome_nano --r 0 8 16 img_size=32 patch_size=4 num_classes=10

Writes ``benchmarks/results/micro/tome_throughput_<device>_<date>.json`` (:mod:`benchmarks.naming`);
``docs/baselines.md`` has the table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

from vitlab.bench.specs import PHASES
from vitlab.bench.timing import measure_networks, round_ratio, torch_threads
from vitlab.config import parse_overrides
from vitlab.models import VisionTransformer, create_model
from vitlab.rundir import environment as run_environment

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import results_path


def build_networks(model: str, rs: list[int], overrides: dict) -> dict[str, VisionTransformer]:
    """``{"r=0": ViT, "r=4": the same weights merging 4 tokens per block, ...}``."""
    torch.manual_seed(0)
    plain = create_model(model, **{**overrides, "tome_r": 0})
    if not isinstance(plain, VisionTransformer):
        raise SystemExit(f"{model} is a {type(plain).__name__}; Token Merging is an option of the ViT presets")
    networks = {}
    for r in rs:
        network = copy.deepcopy(plain)
        network.tome_r = r
        networks[f"r={r}"] = network
    return networks


def tokens_per_block(network: VisionTransformer) -> list[int]:
    """Tokens each block outputs for one image (the CLS token included)."""
    shape = (1, network.patch_embed.proj.in_channels, *network.patch_embed.img_size)
    with torch.no_grad():
        _, intermediates = network.eval().forward_intermediates(torch.zeros(shape), output_fmt="NLC")
    return [network.num_prefix_tokens + t.shape[1] for t in intermediates]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tome_matched_cet_vit_nano", help="a ViT or ToMe preset")
    parser.add_argument("--r", type=int, nargs="+", default=[0, 4, 8], help="tokens merged per block")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sample-seconds", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(results_path("micro", "tome_throughput")))
    parser.add_argument("overrides", nargs="*", help="constructor overrides, e.g. img_size=32 patch_size=4")
    args = parser.parse_args()
    if 0 not in args.r:
        parser.error("--r must include 0, the plain ViT every speed-up is measured against")
    overrides = parse_overrides(args.overrides)
    networks = build_networks(args.model, args.r, overrides)
    tokens = {name: tokens_per_block(network) for name, network in networks.items()}
    load_before = os.getloadavg()
    with torch_threads(args.threads):
        result = measure_networks(
            networks,
            batch_size=args.batch_size,
            repeats=args.repeats,
            warmup=args.warmup,
            sample_seconds=args.sample_seconds,
        )
        environment = run_environment()
    result["speedup_over_r0"] = {
        name: {
            clock: {phase: round_ratio(result, name, "r=0", phase, clock) for phase in PHASES}
            for clock in result["clocks"]
        }
        for name in networks
    }
    record = {
        "benchmark": "tome_throughput",
        "model": args.model,
        "kwargs": networks["r=0"].init_kwargs,
        "settings": vars(args),
        "tokens_per_block": tokens,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "environment": environment,
        **result,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))

    print(f"{args.model}, batch {args.batch_size}, threads {args.threads}, {args.repeats} rounds (median, CPU clock)")
    print("| r | tokens after the last block | GFLOPs/image | inference img/s | speed-up | training img/s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for name in networks:
        entry, speedup = result["networks"][name], result["speedup_over_r0"][name]["cpu"]
        cells = [name[2:], str(tokens[name][-1]), f"{entry['flops_per_image']['forward'] / 1e9:.3f}"]
        for phase in ("inference", "train"):
            cells += [f"{entry[phase]['cpu']['images_per_s']['median']:.1f}", f"{speedup[phase]['median']:.2f}x"]
        print("| " + " | ".join(cells) + " |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Where a training step's time goes: ``torch.profiler`` over a few training steps of a preset, eager or compiled.

    python -m benchmarks.micro.profile_step vit_small img_size=32 patch_size=4 num_classes=10 [--compile] [--timm]
        [--batch-size 32] [--steps 3] [--precision auto|32-true|bf16-mixed] [--out FILE.json]

The step is ``vitlab bench``'s (``vitlab.bench.timing.Subject``: forward, cross-entropy, backward, AdamW), one thread;
``--compile`` compiles the network with its loss as ``trainer.compile`` does, ``--timm`` profiles timm's network of
the same shape (eager, torch's AdamW). Self CPU time is grouped into: matrix products, attention (SDPA), kernels
inductor generated (fused element-wise work, LayerNorm, GELU), eager element-wise work, copies, the optimiser, the
rest.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitlab.acceleration.precision import choose_precision
from vitlab.bench.specs import NetworkSpec, timm_counterpart
from vitlab.bench.timing import Runner, Subject
from vitlab.config import parse_overrides
from vitlab.environment import environment

GROUPS = (  # (group, substrings of the op name), first match wins
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "mkldnn", "aten::matmul")),
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention")),
    ("optimiser", ("adam", "_foreach", "fused_adamw")),
    # a compiled graph's own time: its kernels, and its autograd node (torch 2.14 names them "## Call CompiledFxGraph
    # <hash> ##" and "CompiledFunctionBackward")
    ("inductor kernels", ("cpp_fused", "kernel_cpp", "graph_", "triton", "compiledfxgraph", "compiledfunction")),
    ("copies", ("copy_", "aten::cat", "aten::clone", "contiguous", "aten::stack")),
    ("dropout", ("dropout", "bernoulli", "geometric_", "index_fill", "droppositions", "aten::random_")),
    ("top-k routing, scatter", ("topk", "scatter", "aten::sort", "gather")),
    ("softmax", ("softmax",)),
    ("GELU", ("gelu",)),
    ("LayerNorm", ("layer_norm",)),
    ("element-wise", ("aten::add", "aten::mul", "aten::div", "aten::sub", "aten::fill_", "aten::zero_", "aten::sum")),
)


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, keys in GROUPS if any(k in lowered for k in keys)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--timm", action="store_true")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", choices=("auto", "32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--out")
    args, rest = parser.parse_known_args()
    torch.set_num_threads(1)
    overrides = parse_overrides(rest)
    spec = timm_counterpart(args.model, overrides) if args.timm else NetworkSpec("vitlab", args.model, overrides)
    runner = Runner(compile="trainer" if args.compile else "none", fused=False if args.timm else "auto")
    torch.manual_seed(0)
    precision = choose_precision(args.precision, "cpu").precision
    subject = Subject(
        spec.build(), batch_size=args.batch_size, precision=precision, device=torch.device("cpu"), runner=runner
    )
    for _ in range(2):  # warm-up (and compilation)
        subject.train_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            subject.train_step()
    shares: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        shares[group_of(event.key)] += event.self_cpu_time_total
    total = sum(shares.values())
    table = {group: shares[group] / total for group in sorted(shares, key=shares.get, reverse=True)}
    top = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    record = {
        "model": args.model,
        "overrides": overrides,
        "network": spec.describe(),
        "runner": runner.describe(),
        "batch_size": args.batch_size,
        "precision": precision,
        "steps": args.steps,
        "shares": table,
        "top_ops": {e.key: e.self_cpu_time_total / total for e in top},
        "step_s": total / 1e6 / args.steps,
        "environment": environment(),
    }
    for group, share in table.items():
        print(f"{group:<22} {share:6.1%}")
    print(f"self CPU time per step: {record['step_s']:.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()

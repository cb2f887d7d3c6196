"""How much of the logit the relevance accounts for, with the conservative rules and without them (plain
Gradient x Input: the naive extension of LRP that HiLRP says gives lost or inflated relevance on windowed and
token-reducing models), on trained runs, in float64.

Per run: on the first ``--images`` test images (those ``vitlab explain --evaluate`` uses), the ratio
``(sum of input relevance + absorbed by the additive parameters) / logit`` of the predicted class, per image, with the
rules (1 to machine precision when they conserve) and without. Writes JSON with the per-image values, the command,
git revision, lscpu and the load average.

    python -m benchmarks.experiments.explain_naive_conservation /tmp/wt30-runs/cifar10_p4_vit ... \\
        --out benchmarks/results/explain/naive_conservation.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import torch

from vitlab.atomic import atomic_write_text
from vitlab.explain.adapters import explainer_for
from vitlab.explain.api import lrp_relevance
from vitlab.explain.run import _test_images
from vitlab.jsonio import strict_dumps
from vitlab.rundir import environment


def ratios(run: str, images: int) -> dict:
    loaded, x, _ = _test_images(run, images)
    model = loaded.model.eval().double()
    x = x.double()
    ex = explainer_for(model)
    with torch.no_grad():
        target = ex.logits(model, x).argmax(-1)
    out = {"model": getattr(model, "preset", type(model).__name__), "kind": ex.kind, "run": run}
    for name, linearise in (("rules", True), ("no_rules", False)):
        relevance, absorbed, score = lrp_relevance(model, ex, x, target, linearise=linearise)
        out[name] = ((relevance.flatten(1).sum(1) + absorbed) / score).tolist()
        out[f"{name}_input_share"] = (relevance.flatten(1).sum(1) / score).tolist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = [ratios(run, args.images) for run in args.runs]
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    record = {
        "runs": results,
        "images": args.images,
        "dtype": "float64",
        "environment": environment(),
        "lscpu": lscpu,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    atomic_write_text(args.out, strict_dumps(record, indent=1) + "\n")
    for r in results:
        rules = torch.tensor(r["rules"], dtype=torch.float64)
        naive = torch.tensor(r["no_rules"], dtype=torch.float64)
        print(
            f"{r['kind']:8s} {r['model']:28s} rules: max |ratio - 1| = {(rules - 1).abs().max():.1e}   "
            f"no rules: ratio median {naive.median():.3f}, range [{naive.min():.3f}, {naive.max():.3f}]"
        )


if __name__ == "__main__":
    main()

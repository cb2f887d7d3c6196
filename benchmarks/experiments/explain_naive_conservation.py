"""How much of the logit the relevance accounts for, with the conservative rules and without them (plain
Gradient x Input: the naive extension of LRP that HiLRP says gives lost or inflated relevance on windowed and
token-reducing models), on trained runs, in float64.

Per run: on the first ``--images`` test images (those ``vitlab explain --evaluate`` uses), per image, the ratio
conservation error ``|sum of input relevance + absorbed by the rules - logit| / |logit|`` of the predicted class with
HiLRP's rules, the input's own share ``sum(input relevance) / logit``, and the share of plain
Gradient x Input (no rules). Writes JSON with the per-image values, the command,
git revision, lscpu and the load average.

    python -m benchmarks.experiments.explain_naive_conservation /tmp/wt30-runs/cifar10_p4_vit ... \\
        --out benchmarks/results/explain/naive_conservation.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from benchmarks.experiments.explain_architectures import write_record
from vitlab.explain.api import explain
from vitlab.explain.run import _test_images


def ratios(run: str, images: int) -> dict:
    loaded, x, _ = _test_images(run, images)
    model = loaded.model.eval().double()
    x = x.double()
    rules = explain(model, x, method="lrp")
    naive = explain(model, x, method="input_x_gradient", target=rules.target)
    out = {"model": getattr(model, "preset", type(model).__name__), "kind": rules.kind, "run": run}
    out["conservation"] = rules.conservation.tolist()
    out["rules_input_share"] = rules.input_share.tolist()
    out["no_rules"] = out["no_rules_input_share"] = (naive.maps.flatten(1).sum(1) / naive.score).tolist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = [ratios(run, args.images) for run in args.runs]
    write_record(args.out, {"runs": results, "images": args.images, "dtype": "float64"}, load_before)
    for r in results:
        error = torch.tensor(r["conservation"], dtype=torch.float64)
        naive = torch.tensor(r["no_rules"], dtype=torch.float64)
        print(
            f"{r['kind']:8s} {r['model']:28s} rules: max conservation error {error.max():.1e}   "
            f"no rules: ratio median {naive.median():.3f}, range [{naive.min():.3f}, {naive.max():.3f}]"
        )


if __name__ == "__main__":
    main()

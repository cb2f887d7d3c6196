"""Why integrated gradients is not complete on a routing model: along the straight path from the zero image to the
image, CET-ViT's top-k assignment changes the slots it selects, and each change is a jump of the logit that no
gradient sees. Per image of the tiny trained CET-ViT (float64): the completeness error
``|sum(IG) - (f(x) - f(0))| / |f(x)|`` at 32, 128 and 512 Gauss-Legendre steps (captum), the number of path points
(of 512, equally spaced) at which the top-k selection differs from the previous point, and HiLRP's conservation error
on the same images. Writes JSON (per-image values, environment).

    python -m benchmarks.experiments.explain_ig_routing \\
        --out benchmarks/results/experiments/explain_ig_routing_<cpu>_<date>.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from benchmarks.experiments.explain_architectures import write_record
from vitlab.explain import explain
from vitlab.testing_models import tiny_model

STEPS = (32, 128, 512)


class _TopkSelections(TorchFunctionMode):
    """Records the (sorted) indices of every ``topk`` the model takes."""

    def __init__(self) -> None:
        super().__init__()
        self.indices: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "topk":
            self.indices.append(out.indices.sort(-1).values.flatten())
        return out


def selection_changes(model: torch.nn.Module, x: torch.Tensor, points: int = 512) -> int:
    """How many of ``points`` equally spaced path points ``t x`` select other slots than the point before."""
    previous, changes = None, 0
    for t in torch.linspace(0, 1, points, dtype=x.dtype):
        with torch.no_grad(), _TopkSelections() as rec:
            model(t * x)
        current = torch.cat(rec.indices)
        changes += int(previous is not None and not torch.equal(previous, current))
        previous = current
    return changes


def main() -> None:
    from captum.attr import IntegratedGradients

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_before = os.getloadavg()
    model, x = tiny_model("cet_vit", trained=True)
    with torch.no_grad():
        logits = model(x)
        target = logits.argmax(-1)
        gap = logits.gather(1, target[:, None])[:, 0] - model(torch.zeros_like(x)).gather(1, target[:, None])[:, 0]
    score = logits.gather(1, target[:, None])[:, 0]
    record: dict = {"model": "cet_vit (tiny, three Adam steps)", "images": x.shape[0], "dtype": "float64"}
    for steps in STEPS:
        attribution = IntegratedGradients(model).attribute(x, target=target, n_steps=steps)
        record[f"ig_completeness_{steps}"] = ((attribution.flatten(1).sum(1) - gap).abs() / score.abs()).tolist()
    record["selection_changes_512"] = [selection_changes(model, x[i : i + 1]) for i in range(x.shape[0])]
    record["lrp_conservation"] = explain(model, x, method="lrp").conservation.tolist()
    write_record(args.out, record, load_before)
    print(record)


if __name__ == "__main__":
    main()

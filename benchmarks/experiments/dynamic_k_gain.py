"""What a trained Dynamic-K estimator chooses per image, against what each budget really costs (issue 13).

    python -m benchmarks.experiments.dynamic_k_gain runs/globalexactk-seed0 --data /path/to/cifar10.npz \
        --out dynamic_k.json

For every test image (the first ``--images``) the run's final model is evaluated under every candidate budget K_c
(:meth:`vitlab.families.cet_vit.model.CETViT.candidate_logits`: the part after the V-CEO once per budget, in eval mode),
which gives the image's cross-entropy ``L_c`` per budget. Beside the budget the estimator chose (its argmax) this
reports, per chosen budget: how many images chose it, the mean loss gain of the choice against always taking the largest
budget (``L_chosen - L_Kmax``; negative = the choice helps), the mean gain of the per-image best budget (the oracle
``min_c L_c - L_Kmax``), and how often the choice is that best budget; and the test accuracy with the chosen budgets and
with the largest budget forced for every image.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from vitlab.atomic import atomic_write_json
from vitlab.evaluation.target import load_evaluation_target


@torch.no_grad()
def per_image(model: torch.nn.Module, batches) -> dict[str, torch.Tensor]:
    """``chosen [n]`` candidate indices, ``losses [C, n]`` cross-entropies per budget, ``labels [n]``, logits."""
    model.eval()
    chosen, losses, labels, logits_all = [], [], [], []
    for x, y in batches:
        encoded = model._encode(x)
        per_budget = model.candidate_logits(encoded)  # [C, B, classes]
        losses.append(torch.stack([F.cross_entropy(c, y, reduction="none") for c in per_budget]))
        chosen.append(encoded.choice.argmax(-1))
        labels.append(y)
        logits_all.append(per_budget)
    return {
        "chosen": torch.cat(chosen),
        "losses": torch.cat(losses, dim=1),
        "labels": torch.cat(labels),
        "logits": torch.cat(logits_all, dim=1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--data", required=True, help="the npz the run was trained on")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--images", type=int, default=5000, help="test images (multiple of 500)")
    args = p.parse_args()
    torch.set_num_threads(1)
    target = load_evaluation_target(args.run, data_overrides={"path": args.data, "eval_batch_size": 500})
    model = target.model
    if getattr(model, "k_estimator", None) is None:
        raise SystemExit(f"{args.run} has no Dynamic-K estimator (train it with model.dynamic_k=exact or gumbel)")
    dm = target.datamodule
    dm.setup("test")
    r = per_image(model, itertools.islice(dm.test_dataloader(), max(1, args.images // 500)))
    candidates = list(model.k_estimator.k_candidates)
    losses, chosen = r["losses"], r["chosen"]
    n = chosen.numel()
    picked = losses.gather(0, chosen[None])[0]
    gain = picked - losses[-1]
    best = losses.argmin(0)
    oracle = losses.min(0).values - losses[-1]
    rows = []
    for c, k in enumerate(candidates):
        mask = chosen == c
        count = int(mask.sum())
        rows.append(
            {
                "K": k,
                "images": count,
                "share": count / n,
                "mean_gain": float(gain[mask].mean()) if count else None,
                "mean_oracle_gain": float(oracle[mask].mean()) if count else None,
                "choice_is_best": float((best[mask] == c).float().mean()) if count else None,
                "best_share": float((best == c).float().mean()),
            }
        )
    predictions = r["logits"].gather(0, chosen[None, :, None].expand(1, n, r["logits"].shape[-1]))[0].argmax(-1)
    from vitlab.rundir import environment

    out = {
        "command": ["python", "benchmarks/experiments/dynamic_k_gain.py", *sys.argv[1:]],
        "environment": environment(),
        "run": str(args.run),
        "images": n,
        "k_candidates": candidates,
        "per_chosen_budget": rows,
        "mean_gain": float(gain.mean()),
        "mean_oracle_gain": float(oracle.mean()),
        "choice_is_best": float((best == chosen).float().mean()),
        "acc_chosen": float((predictions == r["labels"]).float().mean()),
        "acc_largest": float((r["logits"][-1].argmax(-1) == r["labels"]).float().mean()),
    }
    atomic_write_json(args.out, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

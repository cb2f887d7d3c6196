"""The test-time grouping ablation of one CET-ViT run and its slot-usage K at init and at the end (issue 13).

    python -m benchmarks.experiments.cet_grouping runs/cet-ablation/select-seed0 --data /path/to/cifar10.npz \
        --out grouping.json

Accuracy with the learned S, a random top-k S and a uniform S on the first ``--images`` test images
(:func:`vitlab.families.cet_vit.grouping.grouping_ablation`), with the run's final weights (its export/ folder, else
best.ckpt, else last.ckpt). "At init": the same preset and options freshly initialised with ``torch.manual_seed(seed)``
(an initialisation at the run's seed, not bit-for-bit the run's own first weights), on the first ``--init-images``
test images.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from vitlab.evaluation.target import load_evaluation_target
from vitlab.families.cet_vit.grouping import grouping_ablation
from vitlab.models.builder import create_model
from vitlab.rundir import RunDir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--data", required=True, help="the npz the run was trained on")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--images", type=int, default=5000, help="test images for the final model (multiple of 500)")
    p.add_argument("--init-images", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    target = load_evaluation_target(args.run, data_overrides={"path": args.data, "eval_batch_size": 500})
    dm = target.datamodule
    dm.setup("test")
    final = grouping_ablation(target.model, itertools.islice(dm.test_dataloader(), max(1, args.images // 500)))
    model = target.model
    seed = RunDir(args.run).config_dict()["run"]["seed"]  # the run's resolved config
    torch.manual_seed(seed)
    fresh = create_model(model.preset, **model.init_kwargs)
    batches = itertools.islice(dm.test_dataloader(), max(1, args.init_images // 500))
    init = grouping_ablation(fresh, batches)
    out = {"run": str(args.run), "seed": seed, "num_slots": model.num_slots, "final": final, "init": init}
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

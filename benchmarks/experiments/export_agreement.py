"""Does an exported ONNX file predict what the model predicts, on real images? Each trained run's model is exported
(``vitlab.export_formats.export_onnx``, checked on a batch of the run's validation images) and run through
onnxruntime on the run's whole test set beside the model's own forward in torch: the max |logits difference| and
the top-1 agreement (the share of test images whose argmax is the same), per run.

    OMP_NUM_THREADS=1 python -m benchmarks.experiments.export_agreement runs/vit-seed0 runs/global-seed0 ...

writes ``benchmarks/results/experiments/export_agreement_<device>_<date>.json`` (:mod:`benchmarks.naming`) with each
run's model, test images, max |diff|, top-1 agreement, the command, git revision and CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from vitlab.environment import environment
from vitlab.evaluation.target import load_evaluation_target
from vitlab.export_formats import ClassifierGraph, export_onnx, validation_images
from vitlab.rundir import RunDir

if __package__ in (None, ""):  # run as a file: the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import repo_relative, results_path


def agreement(run: Path) -> dict:
    """Export ``run``'s model to ONNX and compare onnxruntime with torch on the run's whole test set (in its
    ``eval_batch_size`` batches)."""
    start = time.perf_counter()
    target = load_evaluation_target(run)
    model, dm = target.model.eval(), target.datamodule
    dm.set_normalisation(target.mean, target.std)
    config = RunDir(run).config_dict()
    images = validation_images(model, config["data"], {"mean": target.mean, "std": target.std})
    with tempfile.TemporaryDirectory() as tmp:
        path, check = export_onnx(model, Path(tmp) / "model.onnx", images=images)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        graph, diffs, same, count = ClassifierGraph(model).eval(), [], 0, 0
        for x, _ in dm.test_dataloader():
            with torch.no_grad():
                want = graph(x)
            got = torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])
            diffs.append(float((got - want).abs().max()))
            same += int((got.argmax(-1) == want.argmax(-1)).sum())
            count += len(x)
    return {
        "run": str(run),
        "model": config["model"]["name"],
        "model_options": {k: v for k, v in config["model"].items() if k in ("dynamic_k", "k_candidates")},
        "dataset": Path(config["data"].get("path") or config["data"]["name"]).name,
        "n_test": count,
        "export_check_max_abs_diff": check,
        "export_check_images": None if images is None else len(images),
        "max_abs_diff": max(diffs),
        "top1_agreement": same / count,
        "top1_flips": count - same,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of trained models")
    parser.add_argument("--out", type=Path, default=results_path("experiments", "export_agreement"))
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for run in args.runs:
        rows.append(agreement(run))
        print(json.dumps(rows[-1]))
    lines = ["| model | test images | max abs diff | top-1 agreement |", "|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['model']} {row['model_options'] or ''} | {row['n_test']} | {row['max_abs_diff']:.1e} | "
            f"{100 * row['top1_agreement']:.2f}% ({row['top1_flips']} flips) |"
        )
    table = "\n".join(lines) + "\n"
    print(table, end="")
    env = {**environment(), "command": repo_relative(["python", "-m", __spec__.name, *sys.argv[1:]])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": "export_agreement", "environment": env, "rows": rows, "table": table}
    args.out.write_text(json.dumps(record, indent=2, default=lambda v: np.asarray(v).tolist()))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()

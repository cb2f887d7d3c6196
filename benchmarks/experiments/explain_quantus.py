"""Faithfulness of the explanation methods by quantus (Hedström et al., JMLR 2023) on trained runs, beside the
project's own deletion and insertion AUC (``vitlab explain RUN --evaluate``).

Per run and method, on the first ``--images`` test images (those ``--evaluate`` uses), per image: Faithfulness
Correlation (Bhatt et al., IJCAI 2020: the correlation between the relevance of random pixel subsets and the logit's
drop when they are set to the image mean), pixel flipping (Bach et al., PLOS ONE 2015: the mean of the curve of the
target's score as pixels are set to the image mean, most relevant first: low is faithful), ROAD (Rong et al.,
ICML 2022: the accuracy as the most relevant 1-46% of pixels are imputed by noisy linear interpolation, averaged
over the percentages; one number per run and method: low is faithful), random-logit randomisation (Sixt et al.,
ICML 2020: the SSIM between the map of the target class and that of a random other class: low passes) and
sparseness (Chalasani et al., ICML 2020: the Gini index of the map). Beside them, the spread of the logit's drop
over the random subsets that Faithfulness Correlation draws: where masking barely moves the logit (a backbone robust
to spatial masking), the correlation is of noise and uninformative. The methods are the ones that apply to any
classifier (the attention methods and Grad-CAM need the model's declarations, which the quantus wrapper hides).
Writes JSON with per-image values, the environment and lscpu.

    python -m benchmarks.experiments.explain_quantus RUN [RUN ...] \\
        --out benchmarks/results/experiments/explain_quantus_<cpu>_<date>.json
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.experiments.explain_architectures import write_record
from vitlab.explain import explain, explainer_for
from vitlab.explain.run import _test_images

METHODS = ("lrp", "cp_lrp", "lrp_epsilon", "saliency", "input_x_gradient", "smoothgrad", "integrated_gradients")


class Logits(nn.Module):
    """The run's model as ``images -> logits`` (the tensor quantus's torch wrapper expects)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return explainer_for(self.model).logits(self.model, x)


def explain_func(model: nn.Module, inputs: np.ndarray, targets: np.ndarray, method: str = "lrp", **_: Any):
    """quantus's ``explain_func``: ``[B, 1, H, W]`` maps of ``method`` for ``targets``."""
    x = torch.as_tensor(inputs, dtype=torch.float32)
    maps = explain(model, x, method=method, target=torch.as_tensor(targets).long()).maps
    return maps[:, None].numpy()


def _metrics(quantus: Any, side: int, classes: int) -> dict[str, Any]:
    subset = max(1, side * side // 16)
    return {
        "faithfulness_correlation": quantus.FaithfulnessCorrelation(
            nr_runs=50, subset_size=subset, perturb_baseline="mean", return_aggregate=False, disable_warnings=True
        ),
        "pixel_flipping": quantus.PixelFlipping(
            features_in_step=subset, perturb_baseline="mean", return_aggregate=False, disable_warnings=True
        ),
        "road": quantus.ROAD(percentages=list(range(1, 50, 5)), return_aggregate=False, disable_warnings=True),
        "random_logit": quantus.RandomLogit(num_classes=classes, return_aggregate=False, disable_warnings=True),
        "sparseness": quantus.Sparseness(return_aggregate=False, disable_warnings=True),
    }


def _per_image(name: str, values: Any) -> list[float]:
    """One number per image: pixel flipping's curve and ROAD's accuracies by their mean."""
    if name == "road":
        return [float(np.mean(list(values.values())))] if isinstance(values, dict) else values
    return [float(np.mean(v)) for v in values]


def masking_spread(model: nn.Module, x: torch.Tensor, target: torch.Tensor, subset: int, runs: int = 50) -> list:
    """Per image: the standard deviation, relative to the logit, of the logit's drop when ``subset`` random pixels
    are set to the image mean (what Faithfulness Correlation correlates against)."""
    generator, out = torch.Generator().manual_seed(0), []
    with torch.no_grad():
        for i in range(x.shape[0]):
            xi = x[i : i + 1]
            base = model(xi)[0, target[i]]
            drops = []
            for _ in range(runs):
                flat = xi.clone().flatten(2)
                idx = torch.randperm(flat.shape[-1], generator=generator)[:subset]
                flat[..., idx] = xi.mean()
                drops.append(float(base - model(flat.view_as(xi))[0, target[i]]))
            out.append(float(np.std(drops) / abs(float(base))))
    return out


def run_results(run: str, images: int) -> dict[str, Any]:
    import quantus

    loaded, x, labels = _test_images(run, images)
    model = Logits(loaded.model).eval()
    with torch.no_grad():
        target = model(x).argmax(-1)
    metrics = _metrics(quantus, x.shape[-1], int(model(x[:1]).shape[-1]))
    x_np, y_np = x.numpy(), target.numpy()
    out: dict[str, Any] = {"run": run, "kind": explainer_for(loaded.model).kind, "labels": labels.tolist()}
    out["masking_spread"] = masking_spread(model, x, target, max(1, x.shape[-1] ** 2 // 16))
    out["methods"] = {}
    for method in METHODS:
        start = time.perf_counter()
        a = explain_func(model, x_np, y_np, method=method)
        values = {}
        for name, metric in metrics.items():
            torch.manual_seed(0)
            np.random.seed(0)
            result = metric(
                model=model,
                x_batch=x_np,
                y_batch=y_np,
                a_batch=a,
                device="cpu",
                explain_func=explain_func,
                explain_func_kwargs={"method": method},
                channel_first=True,
            )
            values[name] = _per_image(name, result)
        values["seconds"] = time.perf_counter() - start
        out["methods"][method] = values
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = [run_results(run, args.images) for run in args.runs]
    write_record(args.out, {"runs": results, "images": args.images}, load_before)
    for r in results:
        print(r["run"], "masking spread", np.round(np.median(r["masking_spread"]), 3))
        for method, v in r["methods"].items():
            print(f"  {method:22s}", {k: round(float(np.nanmean(x)), 3) for k, x in v.items() if k != "seconds"})


if __name__ == "__main__":
    main()

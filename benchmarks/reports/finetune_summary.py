"""Summary of benchmarks/experiments/finetune_celeba32.sh: test accuracy per arm over seeds, and where the heads
converge.

    python -m benchmarks.reports.finetune_summary runs/finetune

Per arm: test accuracy mean ± std over the seeds and Welch's t-test against scratch (and against pretrained for
the later arms). Per layer, mean over heads and seeds (``dynamics.jsonl``; in the arms with ``dynamics.mode=fixed``
the controller only measures): the drift d after epoch 1, its peak over the epochs and after the last epoch (patch
widths), consensus clusters kappa at the end, the share of heads converged at the end and the mean epoch at which
they first converged, the share frozen and the mean tau at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from vitlab.diagnostics.plots import dynamics_arrays, read_dynamics
from vitlab.evaluation.stats import summarize, welch_ttest
from vitlab.rundir import DYNAMICS_FILE, TEST_METRICS_FILE, RunDir

ARMS = ("scratch", "pretrained", "controlled", "probe", "layerdecay")


def main(root: Path) -> None:
    acc = {}
    for arm in ARMS:
        runs = sorted(root.glob(f"{arm}-seed*"))
        tests = {r: RunDir(r).test_metrics() for r in runs}
        runs = [r for r in runs if tests[r] is not None]
        acc[arm] = [100 * tests[r]["test/acc"] for r in runs]
        times = [
            float((r.parent / f"{r.name}.time").read_text().split()[0])
            for r in runs
            if (r.parent / f"{r.name}.time").exists()
        ]
        if not acc[arm]:
            continue
        s = summarize(acc[arm])
        values = ", ".join(f"{a:.2f}" for a in acc[arm])
        line = f"{arm:11s} test acc {s['mean']:.2f} ± {s['std']:.2f} % (n={s['n']}: {values})"
        for other in ("scratch", "pretrained"):
            if ARMS.index(arm) > ARMS.index(other) and len(acc[arm]) > 1 and len(acc[other]) > 1:
                t, p = welch_ttest(acc[arm], acc[other])
                line += f"; vs {other} t={t:.2f} p={p:.3g}"
        if times:
            line += f"; wall {np.mean(times):.0f} s per run"
        print(line)
    print()
    for arm in ARMS:
        arrays = [
            dynamics_arrays(read_dynamics(r))
            for r in sorted(root.glob(f"{arm}-seed*"))
            if (r / DYNAMICS_FILE).exists() and (r / TEST_METRICS_FILE).exists()  # finished runs only
        ]
        if not arrays:
            continue
        drift1 = np.stack([a["drift"][1] for a in arrays])  # [S, L, H]
        drift_end = np.stack([a["drift"][-1] for a in arrays])
        peak = np.stack([np.nanmax(np.nanmean(a["drift"][1:], axis=2), axis=0) for a in arrays])  # [S, L]
        kappa = np.stack([a["kappa"][-1] for a in arrays])
        converged = np.stack([a["converged"][-1] for a in arrays])
        first = np.stack(
            [np.where(a["converged"].any(0), a["epochs"][a["converged"].argmax(0)], np.nan) for a in arrays]
        )
        frozen = np.stack([a["frozen"][-1] for a in arrays])
        tau = np.stack([a["tau"][-1] for a in arrays])
        print(f"{arm}: per layer (mean over heads and {len(arrays)} seeds)")
        print("  layer  d(epoch 1)  d(peak)  d(last)  kappa  converged  first converged (epoch)  frozen  tau")
        for layer in range(drift1.shape[1]):
            f = first[:, layer]
            when = f"{np.nanmean(f):.1f}" if np.isfinite(f).any() else "-"
            print(
                f"  {layer:5d}  {drift1[:, layer].mean():10.3f}  {peak[:, layer].mean():7.3f}  "
                f"{drift_end[:, layer].mean():7.3f}  "
                f"{kappa[:, layer].mean():5.2f}  {converged[:, layer].mean():9.0%}  {when:>23s}  "
                f"{frozen[:, layer].mean():6.0%}  {tau[:, layer].mean():.3f}"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/finetune"))

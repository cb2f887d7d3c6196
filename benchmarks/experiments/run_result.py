"""One finished run as a small results file: the per-seed record that a summary table is computed from.

Writes ``OUT`` (JSON) with the run's test metrics (of the best checkpoint, ``test``, and of the last epoch's,
``test_last``: which one a fork's claim reads is its choice, and both are here), generative metrics, the
controller's end state and its convergence rule, the timing, the command, git revision, CPU and torch version (from
the run's ``env.json``), and, for a controlled ViTCAE run, how many head-epochs the paper's tau clause would have
blocked on the recorded drift (the measurement behind ``dynamics.tau_clause: none``). Drivers call it as each run
finishes, so every run's result can be committed as soon as it exists.

    python -m benchmarks.experiments.run_result RUN_DIR --experiment table1_digits --arm controlled --seed 0 \
        --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from vitlab.rundir import RunDir

if __package__ in (
    None,
    "",
):  # run as a file (python -m benchmarks.experiments.run_result): the suite is imported from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.naming import repo_relative
from benchmarks.reports.table1_summary import _freeze_epochs as first_converged
from benchmarks.reports.table1_summary import paper_rule_replay


def tau_clause_replay(records: list[dict[str, Any]], eps_tau: float = 0.05, alpha: float = 4.0) -> dict[str, Any]:
    """On the recorded directedness: head-epochs that pass the directedness test, and how many of them the tau
    clause blocks, with the head's own tau (``own``: the paper's clause; in a fixed arm it never blocks) and with
    the tau the schedule would set from the recorded drift (``schedule``: the clause applied alike in both arms)."""
    passing = blocked_own = blocked_schedule = 0
    previous_tau = previous_implied = None
    rho = next((r.get("rho") for r in records if r.get("rho") is not None), None)
    if rho is None:
        return {}
    for record in records:
        tau = torch.tensor(record["tau"], dtype=torch.float64)
        implied = None if record.get("drift") is None else 1 / (1 + alpha * torch.tensor(record["drift"]))
        if record.get("directedness") is not None and previous_tau is not None:
            frozen = torch.tensor(record["frozen"])
            stable = (torch.tensor(record["directedness"]) < rho) & ~frozen
            passing += int(stable.sum())
            blocked_own += int((stable & ((tau - previous_tau).abs() >= eps_tau)).sum())
            if implied is not None and previous_implied is not None:
                blocked_schedule += int((stable & ((implied - previous_implied).abs() >= eps_tau)).sum())
        previous_tau, previous_implied = tau, implied
    return {
        "rho": rho,
        "head_epochs_passing_directedness": passing,
        "blocked_by_own_tau_clause": blocked_own,
        "blocked_by_schedule_tau_clause": blocked_schedule,
    }


def last_epoch_test(run: Path) -> dict[str, float]:
    """The test loop of the run's ``last.ckpt`` (the model as training left it; ``test_metrics.json`` is the best
    checkpoint's), or {} where the run kept none."""
    from vitlab.training.run import evaluate

    last = run / "checkpoints" / "last.ckpt"
    return evaluate(str(last), "test", ["trainer.enable_progress_bar=false"]) if last.is_file() else {}


def best_epoch(run: Path) -> int | None:
    """The epoch of the run's ``best.ckpt`` (Lightning's ``epoch`` key, counted from 0), or None."""
    best = run / "checkpoints" / "best.ckpt"
    if not best.is_file():
        return None
    return torch.load(best, map_location="cpu", weights_only=False, mmap=True).get("epoch")


def last_decision(record: dict[str, Any]) -> dict[str, Any]:
    """Why the heads were or were not converged at the last epoch, under the decay or response rule: how many heads'
    level (the largest recent drift, per unit rate under ``response``) was below its threshold, and under the
    response rule the range of their directedness against ``rho`` and how many were below it, and how many heads'
    score drifts per unit rate were below theirs (records written since the score clause)."""
    key = {"decay": "decay_level", "response": "response_level"}.get(record.get("convergence"))
    if key is None or record.get(key) is None or record.get("threshold") is None:
        return {}
    pairs = [
        (v, t) for vs, ts in zip(record[key], record["threshold"], strict=True) for v, t in zip(vs, ts, strict=True)
    ]
    out: dict[str, Any] = {
        "epoch": record["epoch"],
        "heads": len(pairs),
        "below_threshold": sum(v is not None and t is not None and v < t for v, t in pairs),
    }
    if record.get("rho") is not None and record.get("directedness") is not None:
        directed = [d for row in record["directedness"] for d in row]
        out |= {"rho": record["rho"], "directedness_range": [min(directed), max(directed)]}
        out["directedness_below_rho"] = sum(d < record["rho"] for d in directed)
    if key == "response_level" and record.get("score_level") is not None:  # the score clause (since 54f842c)
        levels = [v for row in record["score_level"] for v in row]
        limits = [t for row in record["score_threshold"] for t in row]
        out["scores_below_threshold"] = sum(
            v is not None and t is not None and v < t for v, t in zip(levels, limits, strict=True)
        )
    return out


def run_result(run: Path) -> dict[str, Any]:
    rundir = RunDir(run)
    env, test, timing = rundir.env() or {}, rundir.test_metrics() or {}, rundir.timing() or {}
    if not test:
        raise SystemExit(f"{run} has no test_metrics.json: the run has not finished")
    records = rundir.dynamics()
    last = records[-1] if records else {}
    hardware = env.get("hardware", {})
    result: dict[str, Any] = {
        "run": run.name,
        "command": repo_relative(env.get("command")),
        "git": env.get("git"),
        "cpu": hardware.get("cpu_model"),
        "torch": (env.get("versions") or {}).get("torch"),
        "precision": env.get("precision"),
        "test": test,
        "test_last": last_epoch_test(run),
        "best_epoch": best_epoch(run),
        "generate": rundir.generate_metrics() or {},
        "timing": timing,
    }
    epochs = rundir.metrics()
    if epochs:
        keys = ["val/acc", "val/slot_k", "val/reversibility", "time/step_s", "time/epoch_s", "step"]
        keys += sorted({k for e in epochs for k in e if k.startswith("train/k_frac_")})
        result["val_curve"] = {k: [e.get(k) for e in epochs] for k in keys if any(k in e for e in epochs)}
    grouping = rundir.json("grouping.json") or {}
    if grouping:
        result["grouping"] = {"final": grouping.get("final"), "init": grouping.get("init")}
    if records:
        result["dynamics"] = {
            "mode": last.get("mode"),
            "convergence": last.get("convergence"),
            "rho": last.get("rho"),
            "tau_clause": last.get("tau_clause", "own"),
            "epochs": last.get("epoch"),
            "non_converged": last.get("non_converged"),
            "frozen": sum(sum(row) for row in last.get("frozen", [])),
            "mean_drift_last_epoch": last.get("mean_drift"),
            "first_converged_epochs": first_converged(records),
            # heads frozen in each layer after each epoch (the freezing frontier replays these to time the steps)
            "frozen_per_layer": [[sum(row) for row in r.get("frozen", [])] for r in records],
            "tau_clause_replay": tau_clause_replay(records),
            "non_converged_paper_rule_replay": paper_rule_replay(rundir, records, None),
            "last_decision": last_decision(last),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {"experiment": args.experiment, "arm": args.arm, "seed": args.seed, **run_result(args.run)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()

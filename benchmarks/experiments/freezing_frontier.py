"""The freezing frontier (issue 44, item 4): test accuracy against the measured saving of training-step time.

Reads the per-run result files that ``benchmarks/experiments/freezing_frontier.sh`` writes (``RESULTS/r<ratio>/
controlled-seed<s>.json`` per ``dynamics.decay_ratio``, and ``RESULTS/r<first>/nofreeze-seed<s>.json``, the same
recipe with the decisions logged and nothing frozen: the reference of every ratio, since without freezing the ratio
changes nothing in training). Each result records the heads frozen per layer after every epoch
(``dynamics.frozen_per_layer``).

The saving is measured, not predicted, in two ways:

- **replay** (the frontier's axis): the recipe's model and loss (rebuilt from a run's checkpoint, ``--run``), one
  thread, batch as trained; every frozen configuration that occurs (heads per layer; which heads does not matter,
  the heads are symmetric) is timed against nothing frozen, interleaved in one process (``--rounds`` rounds, each
  timing nothing frozen and every configuration for ``--steps`` steps in a shuffled order, the thread's CPU time:
  other processes on a shared core are not counted). A run's saving is ``1 - mean_e t(F_e) / t(none)`` over its
  epochs, ``F_e`` the heads frozen while epoch ``e`` trained (those frozen after epoch ``e - 1``). Also timed: every
  head frozen, the ceiling no rule can pass on this model. Each round's times are against that round's nothing
  frozen, so each round gives a paired saving per setting: reported as the mean over rounds with its 95% t interval
  (:func:`saving_summary`); a saving whose interval holds 0 is not resolved from 0.
- **own clock**: the run's own per-epoch step time against its fork's (``time/step_s``), noisy where the two ran
  beside other work; recorded beside the replay.

    python -m benchmarks.experiments.freezing_frontier RESULTS --run RUN_DIR --out FILE.json [--figure FILE.png]
    python -m benchmarks.experiments.freezing_frontier table FILE.json
    python -m benchmarks.experiments.freezing_frontier RESULTS --run RUN_DIR --out FILE.json --ceiling
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.experiments.freezing_flops import flops_record, run_options
from benchmarks.naming import repo_relative
from benchmarks.reports.claims import MARGIN, Difference


def load_results(root: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """``{arm: {seed: result}}``; arms ``nofreeze`` and ``r<ratio>`` (the controlled run at that ratio)."""
    arms: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(root.glob("r*/*-seed*.json")):
        data = json.loads(path.read_text())
        arm = "nofreeze" if data["arm"] == "nofreeze" else path.parent.name
        arms.setdefault(arm, {})[int(data["seed"])] = data
    return arms


def epoch_configs(result: dict[str, Any]) -> list[tuple[int, ...]]:
    """The heads frozen per layer while each epoch trained. ``dynamics.jsonl`` has a record for epoch 0 (the probe
    before training) and one after each epoch, so epoch ``e`` (from 1) trains with record ``e - 1``'s frozen heads;
    a run recorded without the epoch-0 record starts with none frozen."""
    frozen = [tuple(row) for row in result["dynamics"]["frozen_per_layer"]]
    epochs = len(result["val_curve"]["val/acc"])
    if len(frozen) <= epochs:
        frozen = [tuple([0] * len(frozen[0])), *frozen] if frozen else []
    return frozen[:epochs]


def build_step(run: Path, threads: int = 1):
    """A training step of the run's model and loss (with its guard), a function to freeze heads per layer, the
    number of layers and of heads, and the model."""
    import torch

    from vitlab.dynamics.freezing import FrozenHeadGuard
    from vitlab.dynamics.probe import controlled_modules
    from vitlab.export import checkpoint_hparams, read_checkpoint
    from vitlab.layers.attention_path import force_attention_path
    from vitlab.models import create_model
    from vitlab.rundir import LAST_CHECKPOINT, config_with_overrides, locate_checkpoint
    from vitlab.training.run import build_task

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hp = checkpoint_hparams(read_checkpoint(locate_checkpoint(run, prefer=(LAST_CHECKPOINT,))))
    cfg = config_with_overrides(hp["config"], None)
    if cfg.trainer.attention_path != "auto":  # the kernel the run trained with
        force_attention_path(cfg.trainer.attention_path)
    model = create_model(cfg.model["name"], **hp["model_kwargs"])
    task = build_task(cfg, model, hp)
    named = controlled_modules(model, cfg.dynamics.target if cfg.dynamics else None)
    modules = [m for _, m in named]
    blocks = [model.get_submodule(name.rsplit(".", 1)[0]) for name, _ in named]
    prefix = named[0][0].split("blocks.")[0]  # the encoder's ("encoder.")
    stem = [p for n, p in model.named_parameters() if n.startswith(prefix) and ("embed" in n or "token" in n)]
    guard = FrozenHeadGuard(modules)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    guard.attach(optimizer)
    kwargs = hp["model_kwargs"]
    size, chans = kwargs["img_size"], kwargs.get("in_chans", 3)
    x = torch.rand(cfg.data.batch_size, chans, size, size)
    y = torch.randint(0, kwargs["num_classes"], (cfg.data.batch_size,))
    heads = modules[0].num_heads
    model.train()

    def freeze(config: tuple[int, ...]) -> None:
        """Per layer the heads frozen, or -1: the layer frozen whole (every parameter; the embedding too under the
        first), so that from the first layers up frozen whole the backward stops above them."""
        mask = torch.zeros(len(modules), heads, dtype=torch.bool)
        for layer, count in enumerate(config):
            mask[layer, : max(count, 0)] = True
        guard.freeze(mask)
        for parameter in stem:
            parameter.requires_grad_(config[0] >= 0)
        for block, count in zip(blocks, config, strict=True):
            for parameter in block.parameters():
                parameter.requires_grad_(count >= 0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        task.compute_losses((x, y), "train")["loss"].backward()
        optimizer.step()

    return step, freeze, len(modules), heads, model


def time_configs(built: tuple, configs: list[tuple[int, ...]], rounds: int, steps: int) -> dict[tuple[int, ...], Any]:
    """Thread-CPU seconds per step of each configuration against nothing frozen: ``{config: (median ratio to none,
    [ratios per round], median seconds)}``. Each round times nothing frozen and every configuration once, in an
    order drawn afresh per round (seeded), each after one untimed step; a configuration's ratio in a round is its
    time over that round's nothing frozen. ``built``: :func:`build_step`'s result."""
    step, freeze, layers = built[:3]
    none = tuple([0] * layers)
    everything = [none, *configs]
    timings: dict[tuple[int, ...], list[float]] = {c: [] for c in everything}

    def seconds(config: tuple[int, ...]) -> float:
        freeze(config)
        step()  # the first step after a change pays for nothing the others do not
        start = time.thread_time()
        for _ in range(steps):
            step()
        return (time.thread_time() - start) / steps

    order = np.random.default_rng(0)
    for _ in range(rounds):
        for index in order.permutation(len(everything)):
            timings[everything[index]].append(seconds(everything[index]))
    ratios = {
        c: [value / reference for value, reference in zip(timings[c], timings[none], strict=True)] for c in configs
    }
    return {c: (float(np.median(r)), r, float(np.median(timings[c]))) for c, r in ratios.items()}


def counted_step_flops(built: tuple) -> int:
    """FLOPs of one step of :func:`build_step` (the recipe's loss, nothing frozen) as ``FlopCounterMode`` counts
    them on the math attention path (where it sees every product; it misses the CPU flash kernel's backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from vitlab.layers.attention_path import forcing

    step, freeze, layers = built[:3]
    freeze(tuple([0] * layers))
    with forcing("math"), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def saving_summary(per_round: list[float]) -> dict[str, Any]:
    """A saving measured once per round (``per_round: [rounds]``, each the fraction of the step saved against that
    round's reference): its mean and 95% t interval over rounds (:class:`~benchmarks.reports.claims.Difference`
    paired by round against no saving), and whether the interval excludes 0 (no interval from one round)."""
    d = Difference(list(per_round), [0.0] * len(per_round), paired=True)
    summary: dict[str, Any] = {"mean": d.diff, "per_round": list(per_round), "interval": None, "resolved": False}
    if d.resolved:
        low, high = d.interval()
        summary |= {"interval": [low, high], "resolved": bool(low > 0 or high < 0)}
    return summary


def round_savings(configs_e: list[tuple[int, ...]], ratios: dict[tuple[int, ...], list[float]]) -> list[float]:
    """A run's saving in each round: ``1 - mean_e ratio_r(F_e)``, ``F_e`` the heads frozen while epoch ``e`` trained
    (:func:`epoch_configs`), ``ratios[c][r]`` configuration ``c``'s step time over nothing frozen in round ``r``
    (nothing frozen: 1)."""
    rounds = len(next(iter(ratios.values())))
    return [1 - float(np.mean([ratios[c][r] if any(c) else 1.0 for c in configs_e])) for r in range(rounds)]


def ceiling(run: Path, rounds: int, steps: int) -> dict[str, Any]:
    """Before any result: the step time with 1, 2, ... every head of every layer frozen, against none (the most any
    rule can save on the run's model is the last); and, beyond what freezing heads can do, the first 1, 2, ... every
    layer frozen whole (``-1`` per layer: no backward through them, MLPs and embedding included)."""
    built = build_step(run)
    layers, heads = built[2], built[3]
    configs = [(n,) * layers for n in range(1, heads + 1)]
    configs += [(-1,) * k + (0,) * (layers - k) for k in range(1, layers + 1)]
    timed = time_configs(built, configs, rounds, steps)
    return {"experiment": "freezing-frontier-ceiling", **timing_record(run, timed, rounds, steps)}


def timing_record(run: Path, timed: dict[tuple[int, ...], Any], rounds: int, steps: int) -> dict[str, Any]:
    """What a results file records of :func:`time_configs`' measurements."""
    return {
        "model_from": repo_relative(str(run)),
        "rounds": rounds,
        "steps": steps,
        "clock": "thread CPU time, one thread, each round nothing frozen and every configuration in a shuffled order",
        "configs": [
            {
                "frozen_per_layer": list(c),
                "ratio_to_none": v[0],
                "ratios": v[1],
                "seconds": v[2],
                "saving": saving_summary([1 - r for r in v[1]]),
            }
            for c, v in sorted(timed.items())
        ],
    }


def frontier(root: Path, run: Path, rounds: int, steps: int) -> dict[str, Any]:
    arms = load_results(root)
    if "nofreeze" not in arms:
        raise SystemExit(f"{root} has no nofreeze-seed*.json: the reference arm has not finished")
    sample = next(iter(arms["nofreeze"].values()))
    layers = len(sample["dynamics"]["frozen_per_layer"][0])
    configs = {c for arm in arms.values() for r in arm.values() for c in epoch_configs(r)}
    built = build_step(run)
    heads = built[3]
    ceiling = tuple([heads] * layers)  # every head frozen in every epoch
    configs.add(ceiling)
    configs.discard(tuple([0] * layers))
    timed = time_configs(built, sorted(configs), rounds, steps)
    ratios = {c: v[1] for c, v in timed.items()}
    rows: list[dict[str, Any]] = []
    reference = arms["nofreeze"]
    for arm, runs in sorted(arms.items()):
        if arm == "nofreeze":
            continue
        per_seed, per_round = [], []
        for seed in sorted(set(runs) & set(reference)):
            r, ref = runs[seed], reference[seed]
            configs_e = epoch_configs(r)
            own = r["val_curve"].get("time/step_s"), ref["val_curve"].get("time/step_s")
            per_round.append(round_savings(configs_e, ratios))
            per_seed.append(
                {
                    "seed": seed,
                    "acc": 100 * r["test"]["test/acc"],
                    "acc_nofreeze": 100 * ref["test"]["test/acc"],
                    "head_epochs_frozen": sum(map(sum, configs_e)) / (len(configs_e) * layers * heads),
                    "saving_replay": float(np.mean(per_round[-1])),
                    "saving_own_clock": None if None in own else 1 - sum(own[0]) / sum(own[1]),
                }
            )
        d = Difference([s["acc"] for s in per_seed], [s["acc_nofreeze"] for s in per_seed], paired=True)
        row = {"arm": arm, "decay_ratio": float(arm[1:]), "seeds": per_seed, "acc_diff": d.diff}
        if d.resolved:
            low, high = d.interval()
            row |= {"acc_diff_interval": [low, high], "keeps_accuracy": low > -MARGIN}
        # the setting's saving in each round: the mean of its seeds' savings in that round
        row["saving_replay"] = saving_summary([float(x) for x in np.mean(per_round, axis=0)]) if per_seed else None
        row["saving_replay_mean"] = row["saving_replay"]["mean"] if per_seed else None
        rows.append(row)
    top = saving_summary([1 - x for x in ratios[ceiling]])
    return {
        "experiment": "freezing-frontier",
        "results": repo_relative(str(root)),
        "timing": {**timing_record(run, timed, rounds, steps), "ceiling": top, "ceiling_saving": top["mean"]},
        "arms": rows,
    }


def _saving_text(summary: dict[str, Any]) -> str:
    """``0.6% [0.2, 1.0]``, or with ``: not resolved from 0`` where the interval holds 0."""
    text = f"{summary['mean']:.2%}"
    if summary["interval"] is not None:
        low, high = summary["interval"]
        text += f" [{100 * low:+.2f}, {100 * high:+.2f}]" + ("" if summary["resolved"] else ": not resolved from 0")
    return text


def table(data: dict[str, Any]) -> str:
    lines = [
        "| decay_ratio | seeds | test acc, controlled - no freezing (paired, 95%) | head-epochs frozen | "
        "step time saved (replay, 95% over rounds; per seed) | step time saved (own clock) |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["arms"]:
        s = row["seeds"]
        interval = row.get("acc_diff_interval")
        ci = f"{row['acc_diff']:+.2f}" + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "")
        own = [x["saving_own_clock"] for x in s if x["saving_own_clock"] is not None]
        each = ", ".join(f"{x['saving_replay']:.2%}" for x in s)
        lines.append(
            f"| {row['decay_ratio']} | {len(s)} | {ci} | {np.mean([x['head_epochs_frozen'] for x in s]):.1%} | "
            f"{_saving_text(row.get('saving_replay') or {'mean': row['saving_replay_mean'], 'interval': None})} "
            f"({each}) | "
            f"{np.mean(own):.1%} |"
        )
    ceiling = data["timing"].get("ceiling", {"mean": data["timing"]["ceiling_saving"], "interval": None})
    lines.append(f"\nEvery head frozen for the whole run (the ceiling): {_saving_text(ceiling)}.")
    return "\n".join(lines)


def figure(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for row in data["arms"]:
        xs = [100 * s["saving_replay"] for s in row["seeds"]]
        ys = [s["acc"] - s["acc_nofreeze"] for s in row["seeds"]]
        ax.scatter(xs, ys, alpha=0.5, s=18)
        low, high = row.get("acc_diff_interval", (row["acc_diff"], row["acc_diff"]))
        mean_x = 100 * row["saving_replay_mean"]
        ax.errorbar(
            mean_x,
            row["acc_diff"],
            yerr=[[row["acc_diff"] - low], [high - row["acc_diff"]]],
            fmt="o",
            capsize=3,
            label=f"decay_ratio {row['decay_ratio']}",
        )
    ax.axhline(-MARGIN, color="grey", ls="--", lw=1, label=f"-{MARGIN:g} point")
    ax.axvline(100 * data["timing"]["ceiling_saving"], color="black", ls=":", lw=1, label="every head frozen")
    ax.axvline(20, color="red", ls=":", lw=1, label="goal: 20%")
    ax.set_xlabel("training-step time saved (%, measured)")
    ax.set_ylabel("test accuracy vs no freezing (points)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "table":
        print(table(json.loads(Path(argv[1]).read_text())))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--run", type=Path, required=True, help="a run folder of the recipe (its model and loss)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--figure", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="only time 1..H heads per layer and the first 1..L layers frozen whole (no results)",
    )
    args = parser.parse_args(argv)
    from vitlab.acceleration.precision import cpu_bf16_flags
    from vitlab.environment import environment

    env = environment()
    env["command"] = repo_relative(env.get("command"))
    env["hardware"]["cpu_bf16_flags"] = list(cpu_bf16_flags())  # amx_bf16 (AMX) and/or avx512_bf16
    if args.ceiling:
        data = ceiling(args.run, args.rounds, args.steps)
    else:
        data = frontier(args.results, args.run, args.rounds, args.steps)
    data["flops"] = flops_record(*run_options(args.run))
    data["flops"]["counter_math_path_task_step"] = counted_step_flops(build_step(args.run))
    data["environment"] = env
    data["command"] = repo_relative(["python", "-m", "benchmarks.experiments.freezing_frontier", *argv])
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    if args.ceiling:
        print("\n".join(f"{c['frozen_per_layer']}: {_saving_text(c['saving'])}" for c in data["configs"]))
        return
    if args.figure:
        figure(data, args.figure)
    print(table(data))


if __name__ == "__main__":
    main()

"""``vitlab dynamics``: redraw a run's attention-dynamics figures and print its per-head table (and, for a run that
froze layers, its per-block table).

Examples::

    vitlab dynamics runs/vitcae-digits-20261130-101500
    vitlab dynamics runs/controlled --compare runs/uncontrolled --out figures/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.registry import Runner, command


@command("dynamics", "redraw the attention-dynamics figures of a run (dynamics.jsonl) and print its per-head table")
def _dynamics(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("run_dir", help="run directory trained with a 'dynamics' section (or its dynamics.jsonl)")
    p.add_argument("--compare", metavar="BASELINE_RUN_DIR", help="another run, drawn on the left (e.g. uncontrolled)")
    p.add_argument("--out", help="folder for the figures (default: <run_dir>/dynamics)")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.diagnostics.frozen_layers import format_layer_table, layer_summary
        from vitlab.diagnostics.plots import draw_run, head_table, read_dynamics
        from vitlab.rundir import DYNAMICS_FILE

        source = Path(args.run_dir)
        run_dir = source if source.is_dir() else source.parent
        out = Path(args.out) if args.out else run_dir / "dynamics"
        layers = layer_summary(run_dir)
        if layers is not None:
            print(format_layer_table(layers))
            if not (run_dir / DYNAMICS_FILE).exists():  # frozen by a signal that reads no attention: nothing to draw
                return 0
        records = read_dynamics(source)
        print(format_table(head_table(records), records[-1]["epoch"]))
        for path in draw_run(source, out, baseline=args.compare):
            print(f"wrote {path}")
        return 0

    return run


def format_table(rows: list[dict], epoch: int) -> str:
    """The per-head table of :func:`vitlab.diagnostics.plots.head_table` as aligned text."""

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rate = rows[0].get("rate") if rows else None
    lines = [
        f"attention heads after epoch {epoch}" + ("" if rate is None else f" (mean learning rate {rate:.3g})"),
        f"{'layer':>5} {'head':>4} {'d':>8} {'d/lr':>9} {'s/lr':>9} {'kappa':>6} {'tau':>6} {'converged':>9} "
        f"{'frozen at':>9}",
    ]
    for row in rows:
        frozen = "-" if row["frozen_at"] is None else str(row["frozen_at"])
        lines.append(
            f"{row['layer']:>5} {row['head']:>4} {number(row['d'], 4):>8} {number(row.get('d_per_rate'), 2):>9} "
            f"{number(row.get('s_per_rate'), 1):>9} "
            f"{number(row['kappa'], 2):>6} "
            f"{number(row['tau'], 3):>6} {'yes' if row['converged'] else 'no':>9} {frozen:>9}"
            + (f"  {row['decision']}" if row.get("decision") else "")
        )
    converged = sum(row["converged"] for row in rows)
    lines.append(f"converged {converged}/{len(rows)}, non-converged {len(rows) - converged}")
    return "\n".join(lines)

"""The methods x architectures table and the conservation table of docs/explain.md, from the results file of
``benchmarks.experiments.explain_architectures``. Prints Markdown.

    python -m benchmarks.reports.explain_architectures_table benchmarks/results/experiments/explain_architectures_*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LRP = ("lrp", "cp_lrp", "lrp_epsilon", "lrp_gamma")


def _cell(r: dict) -> str:
    if "refused" in r:
        return "refused"
    if r["conservation"] is not None:
        return f"{max(r['conservation']):.0e}"
    return "yes"


def tables(results: dict) -> str:
    archs = results["architectures"]
    methods = list(next(iter(archs.values())))
    lines = [
        "| architecture | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    lines += [f"| {a} | " + " | ".join(_cell(r[m]) for m in methods) + " |" for a, r in archs.items()]
    reasons: dict[str, set[str]] = {}
    for a, r in archs.items():
        for m in methods:
            if "refused" in r[m]:
                reasons.setdefault(r[m]["refused"].split(": ", 1)[1], set()).add(a)
    lines += ["", "Refusals:", "", *(f"- {', '.join(sorted(a))}: {why}" for why, a in reasons.items()), ""]
    lines += [
        "| architecture | max conservation error, " + ", ".join(LRP) + " | input share of the logit (lrp) |",
        "|---|---|---|",
    ]
    for a, r in archs.items():
        error = max(max(r[m]["conservation"]) for m in LRP if "refused" not in r[m])
        share = r["lrp"]["input_share"]
        lines.append(f"| {a} | {error:.1e} | {min(share):+.2f} .. {max(share):+.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    print(tables(json.loads(parser.parse_args().results.read_text())))


if __name__ == "__main__":
    main()

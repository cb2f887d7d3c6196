"""docs/img/architecture.svg drawn from the layers contract in pyproject.toml, so the picture is the contract.

One box per layer, top to bottom as ``[tool.importlinter]``'s ``vitlab layers`` lists them (names joined by ``|`` share
a row), the families on top beside each other (the independence contract), an arrow for "imports only from below".

    python -m benchmarks.reports.architecture_figure            # -> docs/img/architecture.svg
    python -m benchmarks.reports.architecture_figure --check    # exit 1 when the figure is not the contract's
"""

from __future__ import annotations

import argparse
import io
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parents[2]
FIGURE = ROOT / "docs" / "img" / "architecture.svg"


def contract_layers(pyproject: Path = ROOT / "pyproject.toml") -> tuple[list[list[str]], list[str]]:
    """The layers (top first, each a list of the names that share it) and the independent families (a wildcard
    ``package.*``: the sub-packages of that package in ``src``)."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["type"] == "layers")["layers"]
    independent = next((c for c in config if c["type"] == "independence"), {"modules": []})["modules"]
    families = []
    for module in independent:
        if module.endswith(".*"):
            folder = pyproject.parent / "src" / Path(*module[:-2].split("."))
            families += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
        else:
            families.append(module.rsplit(".", 1)[-1])
    return [[name.strip() for name in row.split("|")] for row in layers], families


def draw(layers: list[list[str]], families: list[str]) -> plt.Figure:
    height = 0.42 * len(layers) + 0.6
    fig, ax = plt.subplots(figsize=(7.0, height))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, len(layers))
    ax.axis("off")
    for i, row in enumerate(layers):
        y = len(layers) - 1 - i
        names = families if row == ["families"] and families else row
        width = 8.0 / len(names)
        for j, name in enumerate(names):
            x = 0.3 + j * width
            family = row == ["families"]
            face, edge = ("#fdf0e0", "#c07a2c") if family else ("#e8eef7", "#4a6fa5")
            ax.add_patch(
                FancyBboxPatch(
                    (x + 0.05, y - 0.36),
                    width - 0.1,
                    0.72,
                    boxstyle="round,pad=0.02",
                    facecolor=face,
                    edgecolor=edge,
                    linewidth=1.0,
                )
            )
            label = f"families.{name}" if family and families else name
            size = 9 if len(names) <= 4 else 7
            ax.text(x + width / 2, y, label, ha="center", va="center", fontsize=size, family="monospace")
    ax.add_patch(
        FancyArrowPatch((9.1, len(layers) - 1), (9.1, 0), arrowstyle="-|>", mutation_scale=14, color="#555555")
    )
    ax.text(9.3, (len(layers) - 1) / 2, "imports only\nfrom below", rotation=90, ha="left", va="center", fontsize=8)
    ax.set_title("vitlab's layers (pyproject.toml, [tool.importlinter]) and its families", fontsize=10)
    fig.tight_layout()
    return fig


def render(layers: list[list[str]], families: list[str]) -> str:
    buffer = io.StringIO()
    plt.rcParams["svg.hashsalt"] = "vitlab"  # stable ids: the same contract gives the same file
    plt.rcParams["svg.fonttype"] = "none"  # text as text: the labels can be searched and read in the file
    fig = draw(layers, families)
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "benchmarks/reports/architecture_figure.py"})
    plt.close(fig)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURE)
    parser.add_argument("--check", action="store_true", help="exit 1 when --out is not the contract's figure")
    args = parser.parse_args(argv)
    svg = render(*contract_layers())
    if args.check:
        if not args.out.is_file() or args.out.read_text() != svg:
            print(f"{args.out} is not the layers contract's figure; run python -m {__spec__.name}", file=sys.stderr)
            return 1
        return 0
    from vitlab.atomic import atomic_write_text

    atomic_write_text(args.out, svg)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

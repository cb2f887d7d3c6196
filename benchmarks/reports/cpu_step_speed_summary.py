"""The Markdown tables of a ``benchmarks/micro/cpu_step_speed.py`` record (docs/benchmarks.md, "Experiments faster on
the CPU"), generated from its per-round numbers so the page quotes nothing by hand.

    python -m benchmarks.reports.cpu_step_speed_summary benchmarks/results/cpu_step_speed_<cpu>.json [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WAYS = ("fp32_before", "fp32_after", "bf16_before", "auto_after")


def _iqr(summary: dict) -> str:
    return f"{summary['median']:.2f} ({summary['q1']:.2f}-{summary['q3']:.2f})"


def tables(record: dict, clock: str = "cpu") -> str:
    measured = record["clocks"][clock]
    batch = record["settings"]["batch_size"]
    load = record["load_average"]
    peaks = measured["matmul_peak_flops_per_s"]
    lines = [
        f"{record['environment']['hardware']['cpu_model']}, torch {record['environment']['versions']['torch']}, "
        f"one thread, batch {batch}, {record['settings']['repeats']} rounds, {clock} clock; git "
        f"{record['environment']['git']['revision'][:7]}; load average {load['before'][0]:.1f} -> "
        f"{load['after'][0]:.1f}. Matmul peak 1024^2: fp32 {peaks['32-true']['median'] / 1e9:.0f}, bf16 "
        f"{peaks['bf16-mixed']['median'] / 1e9:.0f} GFLOP/s (medians over the rounds).",
        "",
        "| model | fp32 before, img/s | fp32 after | bf16 before | auto after | auto after / fp32 before (IQR) "
        "| auto after: measured s / matmul-only s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in measured["models"].items():
        ways = entry["ways"]
        speeds = [f"{ways[w]['images_per_s']['median']:.0f}" for w in WAYS]
        for i, way in enumerate(WAYS[1:], start=1):
            speeds[i] += f" (x{ways[way]['factor_over_fp32_before']['median']:.2f})"
        after = ways["auto_after"]
        step = batch / after["images_per_s"]["median"]
        limit = after["limit_seconds_at_matmul_peak"]["median"]
        lines.append(
            f"| `{name}` | {' | '.join(speeds)} | {_iqr(after['factor_over_fp32_before'])} | "
            f"{step:.3f} / {limit:.3f} = {after['measured_over_limit']['median']:.1f} |"
        )
    drop = measured["dropout_ms"]
    lines += [
        "",
        "| ms per call (median) | fp32 | bf16 |",
        "|---|---|---|",
    ]
    for label, key in (
        ("`F.dropout`, MLP hidden [128, 65, 256]", "dropout mlp torch"),
        ("vitlab `dropout`, MLP hidden", "dropout mlp vitlab"),
        ("`F.dropout`, attention [128, 4, 65, 65]", "dropout attn torch"),
        ("vitlab `dropout`, attention", "dropout attn vitlab"),
        ("the matching product [8320, 128] @ [128, 256]", "matmul fc1"),
    ):
        lines.append(f"| {label} | {drop[f'{key} fp32']['median']:.2f} | {drop[f'{key} bf16']['median']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record")
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    args = parser.parse_args()
    print(tables(json.loads(Path(args.record).read_text()), args.clock))


if __name__ == "__main__":
    main()

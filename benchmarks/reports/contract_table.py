"""The model-contract table of docs/pretrained.md ("timm's model contract"), from the test suite: runs
``tests/models/test_timm_contract.py`` for the table's columns and prints one row per test, "yes" where that
preset's case passed.

    OMP_NUM_THREADS=1 python -m benchmarks.reports.contract_table
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

MODULE = "tests/models/test_timm_contract.py"
COLUMNS = {
    "vit_nano": ["vit_nano"],
    "tome_nano": ["tome_nano"],
    "swin_nano": ["swin_nano"],
    "cet_vit_nano / _global": ["cet_vit_nano", "cet_vit_nano_global"],
    "vitcae_nano's encoder": ["vitcae_nano.encoder"],
}


def main() -> None:
    ids = [case for cases in COLUMNS.values() for case in cases]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", MODULE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    nodes = [node for node in collected if any(node.endswith(f"[{case}]") for case in ids)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(report)]
        subprocess.run([*pytest, *nodes], check=False)
        outcome: dict[tuple[str, str], bool] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            test, _, param = case.get("name").partition("[")
            outcome[(test, param.rstrip("]"))] = not any(child.tag in ("failure", "error", "skipped") for child in case)
    tests = sorted({test for test, _ in outcome}, key=lambda t: [k for k, _ in outcome].index(t))
    print("| test | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for test in tests:
        cells = [
            "yes" if all(outcome.get((test, case), False) for case in cases) else "no" for cases in COLUMNS.values()
        ]
        print(f"| `{test}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

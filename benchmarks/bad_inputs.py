"""Every bad input tried on the ``vitlab`` command, and the message it gets: the table of ``docs/errors.md``.

Each case runs the real command line (in this process, in a scratch folder, on data the script makes) and records
the exit code and the first line of standard error. A case that prints a traceback, exits 0 or leaves a
half-written file is marked as a failure. Run from the repository root::

    python benchmarks/bad_inputs.py > /tmp/bad_inputs.md
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from vitlab.cli.main import main

TINY = ["trainer.accelerator=cpu", "model.depth=1", "data.limit_train=128", "run.generate=false", "run.report=false"]
FIT = ["fit", "--config", "vit/digits", "trainer.max_epochs=1", *TINY]


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, err.getvalue()


def make_inputs(work: Path) -> dict[str, Path]:
    """A trained run, a truncated and a foreign checkpoint, a folder with a user's file, an npz without labels,
    an image folder with a broken image."""
    run_dir = work / "run"
    with contextlib.redirect_stdout(sys.stderr):
        assert main([*FIT, f"run.dir={run_dir}", "trainer.enable_progress_bar=false"]) == 0
    ckpt = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    (work / "truncated.ckpt").write_bytes(ckpt[: len(ckpt) // 2])
    (work / "foreign.ckpt").write_bytes(b"not a checkpoint")
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("my notes")
    (work / "file.txt").write_text("a file")
    x = np.zeros((8, 8, 8), np.uint8)
    np.savez(work / "nolabels.npz", x_train=x, x_test=x)
    for label in ("a", "b"):
        for i in range(4):
            (work / "pets" / label).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(work / "pets" / label / f"{i}.png")
    broken = work / "pets" / "b" / "3.png"
    broken.write_bytes(broken.read_bytes()[:30])
    return {"run": run_dir}


def cases(work: Path, run_dir: Path) -> list[tuple[str, list[str]]]:
    return [
        ("unknown config key", [*FIT, "optim.lrr=1e-3"]),
        ("value of the wrong type", [*FIT, "trainer.max_epochs=ten"]),
        ("malformed override", [*FIT, "optim.lr"]),
        ("unknown command-line flag", ["fit", "--config", "vit/digits", "--lr", "1e-3"]),
        ("config file not found", ["fit", "--config", "vit/digitz"]),
        ("unknown model", [*FIT, "model.name=vit_tinyy"]),
        ("unknown model option", [*FIT, "model.embed_dimm=64"]),
        ("patch size does not divide the image", [*FIT, "model.patch_size=3", f"run.dir={work / 'p3'}"]),
        ("unknown dataset", [*FIT, "data.name=imagenet-1k"]),
        ("dataset files missing", [*FIT, "data.name=mnist", f"data.root={work / 'nothing'}"]),
        ("npz file not given", [*FIT, "data.name=npz"]),
        ("npz without labels", [*FIT, "data.name=npz", f"data.path={work / 'nolabels.npz'}"]),
        (
            "unreadable image, data.strict_images=true",
            [*FIT, "data.name=imagefolder", f"data.path={work / 'pets'}", "data.strict_images=true"],
        ),
        ("data.in_chans on a fixed dataset", [*FIT, "data.in_chans=3"]),
        ("negative batch size", [*FIT, "data.batch_size=0"]),
        ("run directory already holds a run", [*FIT, f"run.dir={run_dir}"]),
        ("training diverges (NaN loss)", [*FIT, "optim.lr=1e3", "trainer.max_epochs=10", f"run.dir={work / 'nan'}"]),
        ("--resume of a folder that does not exist", ["fit", "--resume", str(work / "runs" / "nope")]),
        ("--resume of a truncated checkpoint", ["fit", "--resume", str(work / "truncated.ckpt")]),
        ("test on a foreign file", ["test", str(work / "foreign.ckpt")]),
        ("export of a truncated checkpoint", ["export", str(work / "truncated.ckpt")]),
        ("export into a folder with a user's files", ["export", str(run_dir), "--out", str(work / "mine")]),
        ("export onto a file", ["export", str(run_dir), "--out", str(work / "file.txt")]),
        ("dynamics of a run trained without them", ["dynamics", str(run_dir)]),
        ("evaluate a folder that is not a run", ["evaluate", str(work / "mine")]),
        ("load a model option that changes the weights", ["evaluate", str(run_dir), "--model", "embed_dim=32"]),
        ("a model option that does not exist", ["evaluate", str(run_dir), "--model", "tome_rr=2"]),
        ("dynamics of a folder that does not exist", ["dynamics", str(work / "nope")]),
        ("test of a run that does not exist", ["test", str(work / "nope")]),
        ("report of a folder that is not a run", ["report", str(work / "mine")]),
        ("compare of a folder that is not a run", ["compare", str(run_dir), str(work / "mine")]),
        ("generate on a run that is not a ViTCAE", ["generate", str(run_dir)]),
        ("slot assignments of a run that is not a CET-ViT", ["probe", "slot-k", str(run_dir)]),
        ("bench of an unknown model", ["bench", "vit_tinyy"]),
        ("list-models with a pattern that matches nothing", ["list-models", "zzz*"]),
    ]


def main_table() -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            inputs = make_inputs(work)
            rows = []
            for name, argv in cases(work, inputs["run"]):
                rc, err = run(argv)
                lines = err.strip().splitlines()
                first = next(
                    (line for line in lines if "error:" in line or "stopped:" in line), lines[0] if lines else ""
                )
                ok = rc != 0 and "Traceback" not in err and first != ""
                failures += not ok
                shown = first.replace(str(work), "<tmp>").replace("|", "\\|")
                shown_argv = ["fit", "--config", "vit/digits", *argv[len(FIT) :]] if argv[: len(FIT)] == FIT else argv
                command = " ".join(a.replace(str(work), "<tmp>") for a in shown_argv)
                flag = "" if ok else " **(not a clean error)**"
                rows.append(f"| {name} | `vitlab {command}` | {rc} | {shown}{flag} |")
            if (work / "mine" / "notes.txt").read_text() != "my notes":
                print("export deleted the user's file", file=sys.stderr)
                failures += 1
        finally:
            os.chdir(cwd)
    print("| input | command | exit | message (first line of stderr) |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_table())

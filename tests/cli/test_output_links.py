"""One output rule for every command that takes ``--out``: with ``--force`` too, nothing is replaced or removed
through a symbolic link out of what vitlab wrote (docs/errors.md, "A symlink is a door out of the room")."""

from __future__ import annotations

from pathlib import Path

import pytest

from run_fixtures import make_run, write_checkpoint, write_png
from vitlab import manifest
from vitlab.cli.main import main


def _argv(command: str, run: Path, out: Path, image: Path) -> tuple[list[str], str]:
    """The command line of ``command`` writing into ``out`` (a link) with ``--force``, and the file it would
    replace there."""
    return {
        "explain": (["explain", str(run), str(image), "--method", "attention", "--out", str(out)], "maps.npz"),
        "export": (["export", str(run), "--out", str(out)], "model.safetensors"),
        "evaluate": (["evaluate", str(run), "--out", str(out), "--no-corruptions"], "evaluation.json"),
        "predict": (["predict", str(run), str(image), "--out", str(out / "preds.csv")], "preds.csv"),
        "report": (["report", str(run), "--out", str(out / "report.html")], "report.html"),
        "bench": (["bench", "vit_pico", "--out", str(out / "bench.json")], "bench.json"),
        "generate": (["generate", str(run), "--out", str(out)], "metrics.json"),
    }[command]


@pytest.mark.parametrize("command", ["explain", "export", "evaluate", "predict", "report", "bench", "generate"])
def test_force_replaces_no_users_file_through_a_linked_out_folder(tmp_path, capsys, command):
    run, image = make_run(tmp_path), tmp_path / "img.png"
    write_checkpoint(run)
    write_png(image, (8, 8))
    mine, link = tmp_path / "mine", tmp_path / "link"
    argv, name = _argv(command, run, link, image)
    mine.mkdir()
    (mine / name).write_text("the user's")
    link.symlink_to(mine, target_is_directory=True)
    assert main([*argv, "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot replace {link / name}: it lies behind link -> {mine}, a symbolic link" in err[0]
    assert {p.name: p.read_text() for p in mine.iterdir()} == {name: "the user's"}


def test_force_replaces_no_link_the_user_named_as_the_out_file(tmp_path, capsys):
    run, image, users = make_run(tmp_path), tmp_path / "img.png", tmp_path / "mine.csv"
    write_png(image, (8, 8))
    users.write_text("the user's")
    (tmp_path / "link.csv").symlink_to(users)
    assert main(["predict", str(run), str(image), "--out", str(tmp_path / "link.csv"), "--force"]) == 2
    assert "it lies behind link.csv -> " in capsys.readouterr().err
    assert (tmp_path / "link.csv").is_symlink() and users.read_text() == "the user's"


def test_force_rewrites_a_file_vitlab_wrote_in_a_run_reached_through_a_users_link(tmp_path):
    """``runs/latest`` a link to a run: a link into a folder vitlab owns, not out of one."""
    run, image = make_run(tmp_path), tmp_path / "img.png"
    write_png(image, (8, 8))
    (tmp_path / "latest").symlink_to(run, target_is_directory=True)
    manifest.start(run, note=False)
    assert main(["predict", str(tmp_path / "latest"), str(image), "--out", str(run / "preds.csv")]) == 0
    again = ["predict", str(tmp_path / "latest"), str(image), "--out", str(tmp_path / "latest" / "preds.csv")]
    (run / "preds.csv").write_text("stale")  # vitlab's file, named in the run's manifest
    assert main([*again, "--force"]) == 0 and (run / "preds.csv").read_text() != "stale"

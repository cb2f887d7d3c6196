"""A symbolic link is a door out of the room: overwrite, ``--force``, resume and cleaning by the manifest act on a
link itself or refuse in one line naming it, and never reach a user's file through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vitlab
from run_fixtures import make_run, write_checkpoint
from vitlab import manifest
from vitlab.atomic import atomic_write_text
from vitlab.claim import LOCK_FILE
from vitlab.cli.main import main
from vitlab.config import RunConfig
from vitlab.errors import OutputError, RunDirError
from vitlab.export import ExportError, export_model
from vitlab.manifest import MANIFEST_FILE
from vitlab.rundir import RunDir
from vitlab.training.run_folder import claim_run_dir


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_with(run: Path, relative: str) -> None:
    """A run folder whose manifest names ``relative`` (written by vitlab), as ``vitlab fit`` leaves it."""
    manifest.start(run, note=False)
    atomic_write_text(run / "config.yaml", "model: {}")
    atomic_write_text(run / relative, "the run's")
    if relative.startswith("tb/"):
        manifest.record(run, glob="tb/events.out.tfevents.*")


def _link_to_users_folder(run: Path, sub: str, tmp_path: Path, name: str) -> Path:
    """Replace the run's ``sub/`` by a link to a folder of the user's holding ``name``."""
    mine = tmp_path / "mine"
    (mine / name).parent.mkdir(parents=True, exist_ok=True)
    (mine / name).write_text("the user's")
    for path in sorted((run / sub).rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (run / sub).rmdir()
    (run / sub).symlink_to(mine, target_is_directory=True)
    return mine


@pytest.mark.parametrize(
    "relative",
    ["checkpoints/best.ckpt", "tb/events.out.tfevents.1.host", "explain/explain_evaluation.json"],
)
def test_overwrite_refuses_a_run_whose_subfolder_is_a_link_and_names_it(tmp_path, relative):
    run = tmp_path / "run"
    _run_with(run, relative)
    sub, name = relative.split("/", 1)
    mine = _link_to_users_folder(run, sub, tmp_path, name)
    with pytest.raises(RunDirError, match=rf"holds {sub} -> {mine}, a symbolic link") as refused:
        RunDir(run).take_for_new_run(overwrite=True)
    assert "\n" not in str(refused.value) and "remove the link" in str(refused.value)
    assert _files(mine) == {name: "the user's"} and (run / sub).is_symlink()


def test_overwrite_refuses_a_linked_export_folder_of_the_users(tmp_path):
    run = tmp_path / "run"
    _run_with(run, "checkpoints/best.ckpt")
    export_model(vitlab.create_model("vit_pico", num_classes=2, img_size=16, patch_size=4), run / "export")
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("model.safetensors", "config.json"):
        (mine / name).write_text("the user's")
    (run / "export" / MANIFEST_FILE).unlink()
    for path in (run / "export").iterdir():
        path.unlink()
    (run / "export").rmdir()
    (run / "export").symlink_to(mine)
    with pytest.raises(RunDirError, match=rf"holds export/model.safetensors \(through the link export -> {mine}\)"):
        RunDir(run).take_for_new_run(overwrite=True)
    assert _files(mine) == {"model.safetensors": "the user's", "config.json": "the user's"}


def test_overwrite_removes_a_linked_file_itself_not_the_users_file_it_points_to(tmp_path):
    run, users = tmp_path / "run", tmp_path / "mine.yaml"
    _run_with(run, "checkpoints/best.ckpt")
    users.write_text("the user's")
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(users)
    RunDir(run).take_for_new_run(overwrite=True)
    assert not (run / "config.yaml").is_symlink() and not (run / "config.yaml").exists()
    assert users.read_text() == "the user's"


def test_a_resume_refuses_a_linked_file_or_folder_it_would_rewrite(tmp_path):
    run, users = tmp_path / "run", tmp_path / "metrics.jsonl"
    _run_with(run, "checkpoints/last.ckpt")
    atomic_write_text(run / "metrics.jsonl", "{}\n")
    users.write_text("the user's")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(users)
    with pytest.raises(RunDirError, match=rf"holds metrics.jsonl -> {users}, a symbolic link, and a resume rewrites"):
        claim_run_dir(RunConfig(), run, resuming=True)
    assert users.read_text() == "the user's" and not (run / LOCK_FILE).exists(), "the claim is let go"
    RunDir(run).refuse_links("run.overwrite=true removes")  # removing the link itself is not through it


def test_a_manifest_entry_through_a_linked_folder_is_never_removed(tmp_path):
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    _run_with(run, "checkpoints/best.ckpt")
    victim.write_text("the user's")
    (run / "up").symlink_to(tmp_path, target_is_directory=True)
    with open(run / MANIFEST_FILE, "a") as f:
        f.write(json.dumps({"path": "up/victim.txt"}) + "\n")
    with pytest.raises(RunDirError, match="holds up -> .*, a symbolic link, and run.overwrite=true removes up/victim"):
        RunDir(run).take_for_new_run(overwrite=True)
    manifest.remove_recorded(run)  # the cleaning itself never follows the link either
    assert victim.read_text() == "the user's"
    assert not (run / "checkpoints").exists() and (run / "up").is_symlink(), (
        "the run's file goes, the user's link stays"
    )


def test_a_manifest_glob_of_everything_clears_the_folder_without_recursing_into_it(tmp_path):
    run = tmp_path / "run"
    _run_with(run, "checkpoints/best.ckpt")
    with open(run / MANIFEST_FILE, "a") as f:
        f.write(json.dumps({"glob": "**"}) + "\n")
    manifest.remove_recorded(run)
    assert run.is_dir() and list(run.iterdir()) == []


# -- export --force ------------------------------------------------------------------------------------------------
@pytest.fixture
def model():
    return vitlab.create_model("vit_pico", num_classes=2, img_size=16, patch_size=4)


def _users_folder(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "notes.txt"):
        (folder / name).write_text("the user's")
    return _files(folder)


def test_export_force_refuses_a_folder_without_a_manifest_naming_the_files(tmp_path, model):
    mine = tmp_path / "mine"
    before = _users_folder(mine)
    with pytest.raises(ExportError) as refused:
        export_model(model, mine, force=True)
    message = str(refused.value)
    assert "holds model.safetensors, config.json, which vitlab did not write (no manifest)" in message
    assert "--force replaces only the files an export wrote there" in message and "\n" not in message
    assert _files(mine) == before and not (mine / MANIFEST_FILE).exists()


def test_export_force_refuses_a_linked_out_folder_and_writes_an_empty_one_through_it(tmp_path, model):
    mine, link = tmp_path / "mine", tmp_path / "link"
    before = _users_folder(mine)
    link.symlink_to(mine)
    with pytest.raises(
        OutputError, match=rf"cannot replace {link}/model.safetensors: it lies behind link -> {mine}, a"
    ):
        export_model(model, link, force=True)
    assert _files(mine) == before
    empty, empty_link = tmp_path / "empty", tmp_path / "empty_link"
    empty.mkdir()
    empty_link.symlink_to(empty)
    assert export_model(model, empty_link) == empty and (empty / "model.safetensors").is_file()


def test_export_force_replaces_what_an_export_wrote_and_keeps_the_rest(tmp_path, model):
    out = export_model(model, tmp_path / "out")
    (out / "notes.txt").write_text("the user's")
    weights = (out / "model.safetensors").read_bytes()
    export_model(vitlab.create_model("vit_pico", num_classes=2, img_size=16, patch_size=4), out, force=True)
    assert (out / "model.safetensors").read_bytes() != weights and (out / "notes.txt").read_text() == "the user's"


def test_export_force_into_a_runs_linked_export_folder_is_refused_on_the_command_line(tmp_path, capsys):
    run = make_run(tmp_path)
    write_checkpoint(run)
    manifest.start(run, note=False)  # as `vitlab fit` leaves it: the run is vitlab's, the link leads out of it
    mine = tmp_path / "mine"
    (run / "export").rename(mine)
    (run / "export").symlink_to(mine)
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    assert main(["export", str(run), "--force"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"vitlab export: error: cannot replace {run / 'export' / 'model.safetensors'}: it lies behind "
        f"export -> {mine}, a symbolic link out of {run}, and vitlab did not write it; move the file, or replace the "
        "link by a folder (vitlab replaces nothing through a link out of a folder it owns)"
    ]
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before


def test_a_users_file_behind_a_linked_run_subfolder_is_never_replaced(tmp_path):
    """``vitlab evaluate`` replaces the run's own ``evaluation/evaluation.json``, but not a user's behind a link."""
    run = tmp_path / "run"
    _run_with(run, "checkpoints/best.ckpt")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "evaluation.json").write_text("the user's")
    (run / "evaluation").symlink_to(mine)
    with pytest.raises(OutputError, match=rf"cannot replace {run}/evaluation/evaluation.json: it lies behind "):
        atomic_write_text(run / "evaluation" / "evaluation.json", "{}")
    assert (mine / "evaluation.json").read_text() == "the user's"
    atomic_write_text(run / "evaluation" / "reliability.png", "new")  # a new file is no rewrite
    atomic_write_text(run / "evaluation" / "reliability.png", "again")  # nor is one vitlab wrote
    assert (mine / "reliability.png").read_text() == "again"

"""The manifest of a run folder (``vitlab.manifest``): every file vitlab writes is named in it as it is written, and
only what it names is ever removed."""

import json

from run_fixtures import TINY
from vitlab import manifest
from vitlab.atomic import append_line, atomic_write_text
from vitlab.cli.main import main
from vitlab.manifest import MANIFEST_FILE


def test_every_file_a_fit_writes_is_named_in_its_manifest(tmp_path):
    run_dir = tmp_path / "run"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY]) == 0
    written = [p for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith(".")]
    assert {"config.yaml", "metrics.jsonl", "best.ckpt", "model.safetensors"} <= {p.name for p in written}
    assert any(p.parent.name == "tb" for p in written)
    assert [p.relative_to(run_dir) for p in written if not manifest.is_recorded(p)] == []
    lines = [json.loads(line) for line in (run_dir / MANIFEST_FILE).read_text().splitlines()]
    assert {"path": "checkpoints/best.ckpt"} in lines and {"glob": "tb/events.out.tfevents.*"} in lines
    assert (run_dir / "export" / MANIFEST_FILE).is_file(), "an export names its own files"


def test_a_write_is_recorded_in_the_nearest_manifest_once_and_nowhere_without_one(tmp_path):
    run, mine = tmp_path / "run", tmp_path / "mine"
    manifest.start(run, note=False)
    for _ in range(3):
        append_line(run / "metrics.jsonl", "{}")
    atomic_write_text(run / "evaluation" / "evaluation.json", "{}")
    atomic_write_text(mine / "notes.txt", "mine")
    assert (run / MANIFEST_FILE).read_text().count("metrics.jsonl") == 1
    assert manifest.is_recorded(run / "evaluation" / "evaluation.json")
    assert not (mine / MANIFEST_FILE).exists() and not manifest.is_recorded(mine / "notes.txt")


def test_removing_a_manifest_takes_only_its_files_and_never_leaves_the_folder(tmp_path):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    atomic_write_text(run / "checkpoints" / "best.ckpt", "old")
    (run / "checkpoints" / "notes.txt").write_text("mine")
    (tmp_path / "outside.txt").write_text("mine")
    with open(run / MANIFEST_FILE, "a") as f:  # a hand-edited manifest cannot reach above its folder
        f.write(json.dumps({"path": "../outside.txt"}) + "\n" + '{"path": "cut of')
    manifest.remove_recorded(run)
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "notes.txt"]
    assert (tmp_path / "outside.txt").read_text() == "mine"


def test_a_removed_entry_leaves_a_later_file_of_that_name_to_the_user(tmp_path):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    atomic_write_text(run / "model.onnx", "vitlab's")
    assert manifest.is_recorded(run / "model.onnx")
    (run / "model.onnx").unlink()
    manifest.note_removed(run / "model.onnx")
    (run / "model.onnx").write_text("the user's")
    assert not manifest.is_recorded(run / "model.onnx")
    atomic_write_text(run / "config.yaml", "vitlab's")
    manifest.remove_recorded(run)
    assert (run / "model.onnx").read_text() == "the user's" and not (run / "config.yaml").exists()


def test_a_write_is_found_up_to_the_search_depth_and_no_deeper(tmp_path):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    deepest = run.joinpath(*["d"] * (manifest.SEARCH_DEPTH - 1), "file.txt")  # run is its SEARCH_DEPTH-th folder up
    too_deep = run.joinpath(*["d"] * manifest.SEARCH_DEPTH, "file.txt")
    for path in (deepest, too_deep):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        manifest.note_written(path)
    assert manifest.is_recorded(deepest)
    assert {"path": too_deep.relative_to(run).as_posix()} not in manifest.entries(run)


def test_a_nested_export_names_its_own_files_and_is_cleared_with_the_run(tmp_path):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    manifest.start(run / "export")  # the run's manifest records the folder; the export's, its files
    atomic_write_text(run / "export" / "model.safetensors", "weights")
    (run / "export" / "README.txt").write_text("the user's")
    assert {"path": "export"} in manifest.entries(run)
    assert manifest.entries(run / "export") == [{"path": "model.safetensors"}]
    manifest.remove_recorded(run)
    assert sorted(p.name for p in run.rglob("*")) == ["README.txt", "export"]


def test_a_glob_names_another_librarys_files_and_no_other_nor_any_above_the_folder(tmp_path):
    run = tmp_path / "run"
    manifest.start(run, note=False)
    manifest.record(run, glob="tb/events.out.tfevents.*")
    manifest.record(run, glob="../*")  # a pattern that would reach above the folder is ignored
    (run / "tb").mkdir()
    for name in ("events.out.tfevents.1", "events.out.tfevents.2", "notes.txt"):
        (run / "tb" / name).write_text("x")
    (tmp_path / "outside.txt").write_text("mine")
    assert [p.name for p in manifest.recorded_paths(run)] == ["events.out.tfevents.1", "events.out.tfevents.2"]
    manifest.remove_recorded(run)
    assert sorted(p.name for p in run.rglob("*")) == ["notes.txt", "tb"] and (tmp_path / "outside.txt").exists()

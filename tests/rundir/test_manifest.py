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

"""Files that appear together: a staging folder beside the target, published whole or file by file, and nothing
left behind when the writer fails."""

import pytest

from vitlab.atomic import publish_files, staging_folder


def test_a_new_folder_appears_whole_with_its_files(tmp_path):
    target = tmp_path / "export"
    with staging_folder(target) as stage:
        (stage / "a.bin").write_bytes(b"a")
        (stage / "b.json").write_text("{}")
        assert not target.exists()
        publish_files(stage, target, ["a.bin", "b.json"], whole=True)
    assert sorted(p.name for p in target.iterdir()) == ["a.bin", "b.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_files_replace_their_namesakes_and_leave_the_rest(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "a.bin").write_bytes(b"old")
    (target / "notes.txt").write_text("mine")
    with staging_folder(target) as stage:
        (stage / "a.bin").write_bytes(b"new")
        publish_files(stage, target, ["a.bin"], whole=False)
    assert (target / "a.bin").read_bytes() == b"new" and (target / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_failing_writer_leaves_neither_the_target_nor_the_stage(tmp_path):
    target = tmp_path / "export"
    with pytest.raises(RuntimeError), staging_folder(target) as stage:
        (stage / "a.bin").write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert list(tmp_path.iterdir()) == []

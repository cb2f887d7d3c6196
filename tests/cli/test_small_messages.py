"""Small things said right: a pattern no config matches, a cache that cannot be written leaves nothing behind, a
resume whose ``last.ckpt`` is a link is told so (not that the file is corrupt)."""

from __future__ import annotations

import errno

from run_fixtures import make_run, write_checkpoint
from vitlab import machine_cache, manifest
from vitlab.cli.main import main


def test_list_configs_with_a_pattern_nothing_matches_exits_2_and_says_so(capsys):
    assert main(["list-configs", "foo"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "vitlab list-configs: error: no packaged config matches 'foo'; `vitlab list-configs` lists them all"
    ]


def test_a_full_cache_folder_is_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv(machine_cache.ENV_VARIABLE, str(tmp_path / "cache"))

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(machine_cache, "atomic_write_text", full)
    assert machine_cache.remembered("s", "case", lambda: 3) == 3
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_resume_whose_last_checkpoint_is_a_link_names_the_link(tmp_path, capsys):
    run, users = make_run(tmp_path), tmp_path / "mine.ckpt"
    write_checkpoint(run, "last.ckpt")
    manifest.start(run, note=False)
    users.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    (run / "checkpoints" / "last.ckpt").unlink()
    (run / "checkpoints" / "last.ckpt").symlink_to(users)
    assert main(["fit", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run}/checkpoints/last.ckpt is a symbolic link (last.ckpt -> {users})" in err[0]
    assert "corrupt" not in err[0] and users.read_bytes()

"""Each refusal names the problem and the fix in one line, and says no more than is true (no "full traceback" hint
where nothing was cut short)."""

from __future__ import annotations

from vitlab.cli.main import main


def _err(capsys, *argv: str) -> tuple[int, list[str]]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


def test_the_traceback_hint_follows_only_an_error_that_cut_one_short(tmp_path, capsys):
    rc, lines = _err(capsys, "fit", "--config", "vit/digits", "data.batch_size=0")
    assert rc == 2 and lines == ["vitlab fit: error: data.batch_size must be >= 1, got 0"]
    (tmp_path / "truncated.ckpt").write_bytes(b"PK\x03\x04 cut")
    rc, lines = _err(capsys, "test", str(tmp_path / "truncated.ckpt"))
    assert rc == 2 and len(lines) == 2 and "cannot be read" in lines[0]
    assert lines[1] == "(set VITLAB_DEBUG=1 for the full traceback)", "torch's own error is behind this one"

"""The shape of a refusal, for the tests of bad input: exit code 2, the message in one ``error:`` line, no traceback,
and nothing written where the run folder would have been."""

from pathlib import Path


def assert_refused(code: int, err: str, message: str, run_dir: Path) -> None:
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    assert not run_dir.exists()

"""Sub-command registry of the ``vitlab`` command. Each ``vitlab.cli.<module>`` registers its commands here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from vitlab.errors import ConfigError

Runner = Callable[[argparse.Namespace, list[str]], int]
Setup = Callable[[argparse.ArgumentParser], Runner]

#: sub-command name -> (function that fills its parser and returns its runner, one-line help)
COMMANDS: dict[str, tuple[Setup, str]] = {}


def command(name: str, help: str, table: dict[str, tuple[Setup, str]] = COMMANDS) -> Callable[[Setup], Setup]:
    """Register a sub-command (in ``table``: a command's own sub-commands, such as ``vitlab probe``'s): the decorated
    function fills the sub-parser and returns the runner, which gets the parsed arguments and the remaining
    ``key.sub=value`` overrides and returns the exit code."""

    def wrap(setup: Setup) -> Setup:
        if name in table:
            raise ValueError(f"vitlab command {name!r} is registered twice")
        table[name] = (setup, help)
        return setup

    return wrap


def refuse_overrides(command: str, overrides: list[str]) -> None:
    """Refuse config overrides given to ``vitlab COMMAND``, which takes none."""
    if overrides:
        raise ConfigError(f"vitlab {command} takes no config overrides, got {' '.join(overrides)}")


def skip_unreadable(skipped: list[Path]) -> Callable[[Path, Exception], None]:
    """An ``on_error`` for image files that a command reads: one line on stderr, and the file added to ``skipped``."""

    def skip(path: Path, e: Exception) -> None:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"skipped {path}: not a readable image ({reason})", file=sys.stderr)
        skipped.append(path)

    return skip

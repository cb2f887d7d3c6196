"""Sub-command registry of the ``vitlab`` command. Each ``vitlab.cli.<module>`` registers its commands here."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Runner = Callable[[argparse.Namespace, list[str]], int]
Setup = Callable[[argparse.ArgumentParser], Runner]

#: sub-command name -> (function that fills its parser and returns its runner, one-line help)
COMMANDS: dict[str, tuple[Setup, str]] = {}


def command(name: str, help: str) -> Callable[[Setup], Setup]:
    """Register a sub-command: the decorated function fills the sub-parser and returns the runner, which gets the
    parsed arguments and the remaining ``key.sub=value`` overrides and returns the exit code."""

    def wrap(setup: Setup) -> Setup:
        if name in COMMANDS:
            raise ValueError(f"vitlab command {name!r} is registered twice")
        COMMANDS[name] = (setup, help)
        return setup

    return wrap

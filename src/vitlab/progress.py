"""What a long command is doing and how far it is, on standard error: a tqdm bar on a terminal, one line per stage
otherwise (a log file gets whole lines, never a bar's carriage returns), as ``vitlab fit`` shows a progress bar or
one line per epoch. ``bench``, ``evaluate``, ``explain --evaluate``, ``generate`` and ``export --format`` use it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TypeVar

T = TypeVar("T")


def on_terminal() -> bool:
    return sys.stderr.isatty()


def stage(what: str) -> None:
    """One line that names the stage a command enters (``vitlab bench: timing 5 rounds``)."""
    print(what, file=sys.stderr, flush=True)


def progress(
    items: Iterable[T], what: str, total: int | None = None, name: Callable[[T], str] | None = None
) -> Iterator[T]:
    """``items`` with a bar named ``what`` on a terminal; otherwise a line ``what k/n`` (``: name(item)``) as item
    ``k`` begins."""
    total = total if total is not None else (len(items) if isinstance(items, Sized) else None)
    if on_terminal():
        from tqdm import tqdm

        yield from tqdm(items, desc=what, total=total, leave=False)
        return
    for k, item in enumerate(items, 1):
        count = f"{k}/{total}" if total is not None else str(k)
        stage(f"{what} {count}: {name(item)}" if name is not None else f"{what} {count}")
        yield item

"""Paths a config names that the file system must take: no folder name over :data:`NAME_MAX` bytes, no path over
:data:`PATH_MAX` (``run.dir``, ``run.root``, ``run.name``), checked before a run claims its folder."""

from __future__ import annotations

from pathlib import Path

from vitlab.errors import ConfigError

#: the longest folder name and path (bytes) of the file systems a run goes on (Linux, macOS, Windows' NTFS)
NAME_MAX, PATH_MAX = 255, 4096


def check_path_length(path: str, name: str, suffix: str = "") -> None:
    """``path`` (the option ``name``), with ``suffix`` added to its last folder name (a run's time stamp), is a path
    the file system takes: no folder name over :data:`NAME_MAX` bytes, the absolute path not over :data:`PATH_MAX`."""
    full = Path(path).expanduser().absolute()
    full = full.with_name(full.name + suffix) if full.name else full
    longest = max(full.parts, key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX:
        raise ConfigError(
            f"{name} gives a folder name of {len(longest.encode())} bytes{' with the time stamp' if suffix else ''} "
            f"({longest[:24]}...); a file system takes at most {NAME_MAX} bytes per name: choose a shorter {name}"
        )
    if len(str(full).encode()) > PATH_MAX:
        raise ConfigError(
            f"{name} is {len(str(full).encode())} bytes long as an absolute path; a file system takes at most "
            f"{PATH_MAX}: choose a shorter {name}"
        )

"""The manifest of a folder vitlab writes: which of its files are vitlab's, so that the user's never are taken.

A run directory (and an export folder) holds ``.vitlab-manifest.jsonl``: one JSON line per file vitlab wrote there,
its path relative to the folder (``{"path": "checkpoints/best.ckpt"}``), or a pattern for files another library
names (``{"glob": "tb/events.out.tfevents.*"}``), or a file vitlab removed (``{"removed": "model.onnx"}``: a file the
user puts there later is the user's). Lines are appended with one ``write`` on an ``O_APPEND``
descriptor as each file appears, so a killed run's manifest still names what it left. ``run.overwrite=true`` and
``vitlab export --force`` remove or replace only what a manifest names; a folder without one is never taken, and a
user's file beside vitlab's (``checkpoints/notes.txt``) survives.

Every writer of :mod:`vitlab.atomic` calls :func:`note_written`: the nearest folder above the file (up to
:data:`SEARCH_DEPTH` levels) that holds a manifest records it. A folder that holds no manifest, and none above it,
records nothing: a file written to a user's ``--out`` is the user's.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path, PurePosixPath

MANIFEST_FILE = ".vitlab-manifest.jsonl"
#: the first line of every manifest: what the file is
HEADER = {"vitlab_manifest": 1}
#: how many folders above a written file are searched for a manifest (``<run>/explain/x/y.png`` is three)
SEARCH_DEPTH = 4
#: (manifest, inode, entry) lines this process appended: a metrics file appended every step is recorded once
_noted: set[tuple[str, int, str]] = set()


def has_manifest(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST_FILE).is_file()


def _append(manifest: Path, entry: dict[str, str]) -> None:
    line = json.dumps(entry)
    key = (str(manifest), manifest.stat().st_ino, line)
    if key in _noted:
        return
    fd = os.open(manifest, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    _noted.add(key)


def start(folder: str | Path, *, note: bool = True) -> None:
    """Give ``folder`` a manifest (an existing one is kept); with ``note``, the manifest above it, if any, records
    the folder (a run records its ``export/``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST_FILE
    if not manifest.exists():
        fd = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            os.write(fd, (json.dumps(HEADER) + "\n").encode())
        finally:
            os.close(fd)
    if note:
        note_written(folder)


def record(folder: str | Path, *, path: str | None = None, glob: str | None = None) -> None:
    """Add one entry to the manifest of ``folder``, if it has one: a ``path`` or a ``glob`` relative to it, for the
    files another library writes under names vitlab does not choose (TensorBoard's event files)."""
    manifest = Path(folder) / MANIFEST_FILE
    if manifest.is_file():
        _append(manifest, {"path": path} if path is not None else {"glob": str(glob)})


def _entries_of(path: Path, relative: str) -> list[str]:
    """``path`` and, for a folder without a manifest of its own, every file and folder under it."""
    if not path.is_dir() or path.is_symlink() or has_manifest(path):
        return [relative]
    entries = [relative]
    for child in sorted(path.iterdir()):
        entries += _entries_of(child, f"{relative}/{child.name}")
    return entries


def note_written(path: str | Path) -> None:
    """Record a file (or a folder, with what it holds) that vitlab has just written, in the nearest manifest above
    it; nothing when there is none."""
    path = Path(path).absolute()
    for folder in list(path.parents)[:SEARCH_DEPTH]:
        manifest = folder / MANIFEST_FILE
        if manifest.is_file():
            for entry in _entries_of(path, path.relative_to(folder).as_posix()):
                _append(manifest, {"path": entry})
            return


def note_removed(path: str | Path) -> None:
    """Record that vitlab removed a file it wrote, so that a file the user puts there later is the user's."""
    path = Path(path).absolute()
    for folder in list(path.parents)[:SEARCH_DEPTH]:
        manifest = folder / MANIFEST_FILE
        if manifest.is_file():
            _append(manifest, {"removed": path.relative_to(folder).as_posix()})
            _noted.difference_update({key for key in _noted if key[0] == str(manifest)})
            return


def _safe(entry: str) -> bool:
    """A manifest names paths inside its folder, never above it (a hand-edited line cannot reach elsewhere)."""
    parts = PurePosixPath(entry).parts
    return bool(parts) and not PurePosixPath(entry).is_absolute() and ".." not in parts


def entries(folder: str | Path) -> list[dict[str, str]]:
    """The entries of ``folder``'s manifest, each once, in the order they were written; ``[]`` without one. A line
    cut off by a killed writer is skipped."""
    manifest = Path(folder) / MANIFEST_FILE
    if not manifest.is_file():
        return []
    seen: list[dict[str, str]] = []
    for line in manifest.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "removed" in entry:
            seen = [e for e in seen if e.get("path") != entry["removed"]]
            continue
        value = entry.get("path", entry.get("glob")) if isinstance(entry, dict) else None
        if isinstance(value, str) and _safe(value) and entry not in seen:
            seen.append(entry)
    return seen


def recorded_paths(folder: str | Path) -> list[Path]:
    """The files and folders ``folder``'s manifest names that exist now (patterns expanded; the folder itself, which
    ``{"glob": "**"}`` matches, is never one of them)."""
    folder = Path(folder)
    found: list[Path] = []
    for entry in entries(folder):
        targets = sorted(folder.glob(entry["glob"])) if "glob" in entry else [folder / entry["path"]]
        found += [t for t in targets if (t.exists() or t.is_symlink()) and t != folder and t not in found]
    return found


def link_on_the_way(folder: Path, path: Path) -> Path | None:
    """The first symbolic link among the folders between ``folder`` and ``path`` (``path`` itself not counted):
    what vitlab would reach through it lies outside the folder it owns."""
    here = folder
    for part in path.relative_to(folder).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return here
    return None


def reached_through_link(folder: str | Path, *, links_too: bool = False) -> tuple[Path, Path] | None:
    """``(link, path)`` for the first path ``folder``'s manifest names that is reached through a symbolic link
    (with ``links_too``, or that is one: a writer that appends or rewrites in place follows it); None when every
    recorded path lies inside ``folder`` itself. ``shutil.rmtree`` refuses links for the same reason."""
    folder = Path(folder)
    for path in recorded_paths(folder):
        link = link_on_the_way(folder, path) or (path if links_too and path.is_symlink() else None)
        if link is not None:
            return link, path
    return None


def _owner(folder: Path) -> Path | None:
    """The nearest folder with a manifest among ``folder`` and the folders above it: the folder vitlab owns that
    ``folder`` is part of, or None (a user's folder)."""
    return next((f for f in [folder, *folder.parents][:SEARCH_DEPTH] if has_manifest(f)), None)


def foreign_behind_link(path: str | Path) -> tuple[Path | None, Path] | None:
    """``(folder, link)`` when replacing or removing ``path`` would follow a symbolic link out of what vitlab wrote;
    ``folder`` is the folder vitlab owns that the link leads out of (None: a user's folder). The one rule of every
    write and of every ``--force``: ``path`` exists and

    - lies behind a link below the nearest folder with a manifest (``<run>/evaluation`` a link to a user's folder),
      and that manifest does not name it;
    - or is itself a link, or its folder is one (``--out LINK`` a link to a user's folder), and the manifest of the
      folder that holds the link does not name it (``runs/latest``, a user's link to a run, leads into a folder
      vitlab owns: a file it wrote there is rewritten; ``<run>/export`` a link to another folder is refused).

    None otherwise (a new file, a file vitlab wrote, no link)."""
    path = Path(path).absolute()
    if not (path.exists() or path.is_symlink()):
        return None
    owner = _owner(path.parent)
    link = link_on_the_way(owner, path) if owner is not None else None
    if link is None:
        link = next((candidate for candidate in (path, path.parent) if candidate.is_symlink()), None)
        if link is None:
            return None
        owner = _owner(link.parent)
    recorded = is_recorded(path) if owner is None else path in {p.absolute() for p in recorded_paths(owner)}
    return None if recorded else (owner, link)


def describe_link(link: Path) -> str:
    """``"checkpoints -> /mnt/big/ckpts"``: a link and where it points, for a message."""
    return f"{link.name} -> {os.readlink(link)}"


def is_recorded(path: str | Path) -> bool:
    """Whether vitlab wrote ``path``: the nearest manifest above it names it (or, for a folder with a manifest of its
    own, names the folder)."""
    path = Path(path).absolute()
    for folder in list(path.parents)[:SEARCH_DEPTH]:
        if has_manifest(folder):
            return path in {p.absolute() for p in recorded_paths(folder)}
    return False


def remove_recorded(folder: str | Path) -> None:
    """Remove what ``folder``'s manifest names, then the manifest, then the folders this left empty; files it does
    not name stay where they are. A named folder with a manifest of its own (an export) is cleared the same way. A
    named link is removed itself, never what it points to, and nothing is reached through a link
    (:func:`reached_through_link`)."""
    folder = Path(folder)
    emptied: set[Path] = set()
    for target in recorded_paths(folder):
        if link_on_the_way(folder, target) is not None:  # never through a link (callers refuse such a folder first)
            continue
        if target.is_dir() and not target.is_symlink():
            if has_manifest(target):
                remove_recorded(target)
            emptied.add(target)
        else:
            target.unlink(missing_ok=True)
            emptied.update(p for p in target.parents if folder in p.parents)
    (folder / MANIFEST_FILE).unlink(missing_ok=True)
    for empty in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # it holds a file vitlab did not write (or is gone already)
            empty.rmdir()
    _noted.clear()


def unlisted(folder: str | Path) -> list[str]:
    """The names in ``folder`` that are not hidden (a lock, a manifest, a half-written temporary file); a folder
    without a manifest that holds any of them holds files vitlab did not write."""
    folder = Path(folder)
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []

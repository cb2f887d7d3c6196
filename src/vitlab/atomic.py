"""Every file vitlab writes, written here: whole files atomically (a temporary file in the same folder, then a
rename), JSON lines appended one whole line per write, a file a user names under the one output rule.

A reader never sees a partial file: :func:`atomic_write_bytes` (and its text, JSON and figure forms) writes beside
the target and renames; :func:`staged_file` gives a writer that needs a path (``torch.save``, ONNX, ``torch.export``)
a temporary file that becomes the target only when the block succeeds; :func:`staging_folder` and
:func:`publish_files` do the same for several files that appear together (an export's weights and config, an
archive torchvision unpacks). Each file written inside a folder that keeps a manifest (a run directory, an export)
is recorded in it as it appears (:func:`vitlab.manifest.note_written`). :func:`append_line` writes a JSON line
with one ``write`` on an append-only descriptor, so concurrent appenders never interleave and a crash can cut at
most the last line (which ``read_jsonl`` reports). Nothing else in ``src/`` opens a file for writing, but for the
claims of a folder (``claim.RunClaim``: a lock file created with ``O_EXCL``, which is the point of it), the
manifest's own lines (:mod:`vitlab.manifest`, appended the same way) and the kernel file ``/proc/self/clear_refs``
of the memory benchmark (a control file, not an output).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vitlab.errors import OutputError
from vitlab.jsonio import strict_dumps
from vitlab.manifest import describe_link, foreign_behind_link, note_written


def umask_mode(directory: bool = False) -> int:
    """The mode a plain ``open()`` / ``mkdir()`` would give (mkstemp's 0600 would hide outputs from colleagues)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def check_not_foreign(path: str | Path) -> None:
    """The one rule of every file vitlab writes or removes, a file a user names with ``--out`` and ``--force``
    included: nothing is replaced or removed through a symbolic link out of what vitlab wrote
    (:func:`vitlab.manifest.foreign_behind_link`); a :class:`OutputError` naming the link."""
    found = foreign_behind_link(path)
    if found is None:
        return
    folder, link = found
    if folder is None:
        raise OutputError(
            f"cannot replace {path}: it lies behind {describe_link(link)}, a symbolic link, and vitlab did not write "
            "it; --force replaces nothing through a link: pass the path it points to as --out, or another --out"
        )
    raise OutputError(
        f"cannot replace {path}: it lies behind {describe_link(link)}, a symbolic link out of {folder}, and vitlab "
        "did not write it; move the file, or replace the link by a folder (vitlab replaces nothing through a link "
        "out of a folder it owns)"
    )


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader never sees a partial file (temp file in the same folder + rename); a
    user's file behind a link out of a run is refused (:func:`check_not_foreign`)."""
    path = Path(path)
    check_not_foreign(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
        note_written(path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a full disk names no file: name the one that was being written
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Strict JSON (NaN as null), indented, written atomically."""
    atomic_write_text(path, strict_dumps(obj, indent=2))


#: errors of the file system that are the environment's, not a bug: said in one line
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def environment_error(e: OSError, path: str | Path) -> OutputError | None:
    """``e`` as a one-line :class:`OutputError` naming ``path`` when it is the environment's (a full disk, a quota,
    a read-only folder, no permission); None for any other error."""
    reason = _ENVIRONMENT_ERRNOS.get(e.errno or 0)
    if reason is None:
        return None
    fix = "free space, or write elsewhere" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "write elsewhere"
    return OutputError(f"cannot write {path}: {reason} (no file is left half-written); {fix}")


def check_outputs(paths: Sequence[str | Path], *, force: bool, flag: str = "--force") -> None:
    """Refuse before any work is done when a file a command would write exists (unless ``force``) or is a folder.

    The one output rule of every command that writes a file a user names: ``report``, ``predict``, ``compare``,
    ``generate``, ``evaluate``, ``probe``, ``bench``, ``explain`` (``export`` checks its files the same way): with
    ``force`` too, nothing is replaced through a symbolic link (:func:`check_not_foreign`).
    """
    for path in map(Path, paths):
        if path.is_dir():
            raise OutputError(f"{path} is a folder; name a file to write (or another folder with --out)")
        if path.exists() and not force:
            raise OutputError(f"{path} exists; pass {flag} to replace it, or choose another --out")
        check_not_foreign(path)


def write_output(path: str | Path, data: str | bytes, *, force: bool = False) -> Path:
    """Write a file a user named: refused if it exists (unless ``force``), written atomically (a temporary file in
    the same folder, then a rename), and a full disk or a read-only folder is a one-line :class:`OutputError`
    that leaves any existing file as it was."""
    path = Path(path)
    check_outputs([path], force=force)
    try:
        atomic_write_bytes(path, data.encode() if isinstance(data, str) else data)
    except OSError as e:
        error = environment_error(e, path)
        if error is None:
            raise
        raise error from e
    return path


def save_figure(figure: Any, path: str | Path, **savefig_kwargs: Any) -> Path:
    """A matplotlib figure written atomically (rendered in memory, then :func:`atomic_write_bytes`, which creates
    the folder); returns ``path``."""
    import io

    path = Path(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def append_line(path: str | Path, line: str) -> None:
    """Append ``line`` (a newline is added) to ``path`` in one ``write`` on an ``O_APPEND`` descriptor."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    note_written(path)


@contextlib.contextmanager
def staged_file(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary file beside ``path`` for a writer that needs a path; it becomes ``path`` (with the umask's mode)
    only when the block succeeds, and is removed otherwise."""
    path = Path(path)
    check_not_foreign(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
        note_written(path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def staging_folder(beside: str | Path) -> Iterator[Path]:
    """A fresh folder next to ``beside`` (the same file system, so a rename out of it is atomic) for writers that
    need paths; removed, with whatever is left in it, when the block ends. :func:`publish_files` moves its files out."""
    beside = Path(beside)
    beside.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=beside.parent, prefix=f".{beside.name}.stage-"))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish_files(stage: str | Path, target: str | Path, names: Sequence[str], *, whole: bool) -> None:
    """Move ``names`` from the :func:`staging_folder` ``stage`` into the folder ``target``, each on the disk first
    (``fsync``) and with the umask's mode. ``whole``: ``target`` is absent or empty and ``stage`` becomes it in one
    rename, so a reader sees every file or none; otherwise each file replaces its namesake in ``target`` atomically
    and ``target``'s other files stay."""
    stage, target = Path(stage), Path(target)
    for name in names:
        with open(stage / name, "rb") as f:  # read-only: flush what the writer wrote before the rename publishes it
            os.fsync(f.fileno())
        os.chmod(stage / name, umask_mode(directory=False))
    if whole:
        os.chmod(stage, umask_mode(directory=True))
        os.replace(stage, target)  # rename(2) replaces an empty folder
    else:
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            os.replace(stage / name, target / name)
    for name in names:
        note_written(target / name)
    if whole:
        note_written(target)

"""One writer per folder: the claim of a run directory by ``vitlab fit`` (``<run>/.lock``), of an ``--out``
folder by ``vitlab explain`` (``<out>/.explain.lock``) and by ``vitlab export`` (``.<out>.export.lock`` beside it:
an export appears in one rename of a staged folder onto ``<out>``, which must be empty).

A lock file created with ``O_EXCL`` (atomic on every local file system: of two processes, exactly one creates it)
holds ``<pid> <host>``; a lock whose process is gone is taken over, a live one refused in one line naming the pid
and the lock file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path

from vitlab import manifest
from vitlab.atomic import umask_mode
from vitlab.errors import RunDirError

LOCK_FILE = ".lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class RunClaim:
    """The exclusive right of one process to write a run directory: ``<run>/.lock``, created with ``O_EXCL`` and
    holding ``<pid> <host>``.

    A lock whose process is gone (a run killed with SIGKILL, a crashed machine's pid on this host) is stale and
    taken over; a live one is a :class:`~vitlab.errors.RunDirError` that names the pid. Whether the folder holds
    a run is decided after the lock is held, so two ``vitlab fit`` started together on one folder cannot both
    pass the check. :meth:`release` removes the lock, and the folder too when this claim created it and nothing
    else was written (a run that failed before it started leaves no empty folder, nor an empty manifest).
    ``lock``, ``what`` and ``other`` name the lock file, the folder and the option that chooses another one
    (``vitlab explain``: ``.explain.lock``, "explain folder", "--out").
    """

    def __init__(
        self, path: str | Path, *, lock: str = LOCK_FILE, what: str = "run directory", other: str = "run.dir"
    ) -> None:
        self.path = Path(path)
        self.lock = self.path / lock  # an absolute ``lock`` lies elsewhere (:meth:`beside`)
        self.what, self.other = what, other
        self.created = False
        self._made: list[Path] = []
        self._held = False

    @classmethod
    def beside(cls, path: str | Path, *, what: str, other: str) -> RunClaim:
        """The claim of ``path`` by a lock beside it (``.<name>.<what's first word>.lock`` in its parent), for a
        folder that must stay empty until its files appear together (``vitlab export``'s staged rename)."""
        path = Path(path).absolute()
        return cls(path, lock=str(path.parent / f".{path.name}.{what.split()[0]}.lock"), what=what, other=other)

    def acquire(self) -> RunClaim:
        self._made = [folder for folder in (self.path, *self.path.parents) if not folder.exists()]  # deepest first
        self.created = bool(self._made)
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(
                f"{self.what} {self.path} is a file, not a folder; pass {self.other} a new or empty folder"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create {self.what} {self.path} ({e.strerror}); {self._writable_advice()}") from e
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise RunDirError(f"{self.what} {self.path} is not writable; {self._writable_advice()}")
        try:
            for _ in range(3):
                try:
                    self._create_lock()
                except FileExistsError:
                    self._take_over_if_stale()
                    continue
                self._held = True
                return self
            self._refuse()
        except BaseException:  # refused: the folders made for this claim go again
            self._remove_made()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _writable_advice(self) -> str:
        other = "run.root= (or run.dir=)" if self.other == "run.dir" else self.other
        return f"set {other} to a folder you can write"

    def _create_lock(self) -> None:
        """Create the lock with its owner already in it: the line is written to a private file, then hard-linked
        to ``.lock`` (atomic, and fails if the lock exists), so a second process never reads a lock without its
        pid. A filesystem without hard links falls back to ``O_EXCL`` with the line written just after."""
        line = f"{os.getpid()} {socket.gethostname()}\n"
        private = self.lock.with_name(f"{self.lock.name}.{os.getpid()}.new")
        fd = os.open(private, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, umask_mode())
        with os.fdopen(fd, "w") as f:
            f.write(line)
        try:
            os.link(private, self.lock)
        except FileExistsError:
            raise
        except OSError:  # no hard links here (some network and FAT filesystems)
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, umask_mode())
            with os.fdopen(fd, "w") as f:
                f.write(line)
        finally:
            private.unlink(missing_ok=True)

    def _owner(self) -> tuple[int, str] | None:
        try:
            pid, host = self.lock.read_text().split()
            return int(pid), host
        except (OSError, ValueError):
            return None

    def _refuse(self) -> None:
        owner = self._owner()
        who = f"vitlab process {owner[0]} on {owner[1]}" if owner else "another vitlab process"
        raise RunDirError(
            f"{self.what} {self.path} is being written by {who}; wait for it to finish, or choose another {self.other} "
            f"(if no such process runs, delete {self.lock})"
        )

    def _take_over_if_stale(self) -> None:
        """Remove the lock if its process is gone; otherwise refuse. The lock is first renamed aside and checked to
        be the same file, so two processes that find one stale lock cannot remove each other's fresh one."""
        try:
            before = self.lock.stat()
        except FileNotFoundError:
            return  # released meanwhile: try again
        owner = self._owner()
        if owner is None:
            if time.time() - before.st_mtime < 10:  # being written this instant
                self._refuse()
        elif owner[1] != socket.gethostname() or _pid_alive(owner[0]):
            self._refuse()
        aside = self.lock.with_name(f"{self.lock.name}.stale-{os.getpid()}")
        try:
            os.rename(self.lock, aside)
        except FileNotFoundError:
            return
        if aside.stat().st_ino != before.st_ino:  # another process took it over between our look and the rename
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.lock)
            aside.unlink()
            self._refuse()
        aside.unlink()
        print(f"removed the stale lock of vitlab process {owner[0] if owner else '?'} in {self.path}", file=sys.stderr)

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        self.lock.unlink(missing_ok=True)
        if self.created:
            with contextlib.suppress(OSError):
                if os.listdir(self.path) == [manifest.MANIFEST_FILE] and not manifest.entries(self.path):
                    (self.path / manifest.MANIFEST_FILE).unlink()
            self._remove_made()

    def _remove_made(self) -> None:
        for folder in self._made:  # this folder, and the parents made for it (`runs/`), while they are empty
            try:
                folder.rmdir()
            except OSError:  # not empty: the run wrote something, keep it
                break

    def __enter__(self) -> RunClaim:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

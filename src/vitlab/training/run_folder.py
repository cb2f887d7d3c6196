"""The run folder of ``vitlab fit``: its path, its claim (one writer per folder, checked while held), what a
stopped run needs to continue, and the checkpoint a resume reads."""

from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path

from vitlab import manifest
from vitlab.claim import RunClaim
from vitlab.config import RunConfig
from vitlab.errors import RunDirError
from vitlab.rundir import CONFIG_FILE, RUN_DIR_ENV, TEST_METRICS_FILE, RunDir


def is_launching_process() -> bool:
    """True in the process that starts a run: not in the DDP children Lightning or torchrun start."""
    return (
        int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0))) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0
    )


def run_dir_path(cfg: RunConfig) -> Path:
    """Where the run goes, without creating anything: ``run.dir`` if set, else ``<run.root>/<run.name>-<timestamp>``.

    DDP children started by Lightning inherit ``VITLAB_RUN_DIR`` so every process writes to the same folder.
    """
    if cfg.run.dir:
        path = Path(cfg.run.dir).expanduser()
    elif os.environ.get(RUN_DIR_ENV) and not is_launching_process():
        path = Path(os.environ[RUN_DIR_ENV])
    else:
        stamp = os.environ.get("TORCHELASTIC_RUN_ID") or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(cfg.run.root).expanduser() / f"{cfg.run.name}-{stamp}"
        if is_launching_process() and not os.environ.get("TORCHELASTIC_RUN_ID"):
            base, n = path, 1
            while path.exists():  # two runs started in the same second get their own folders
                path, n = base.with_name(f"{base.name}-{n}"), n + 1
    os.environ[RUN_DIR_ENV] = str(path.absolute())
    return path


def claim_run_dir(cfg: RunConfig, path: Path, *, resuming: bool = False) -> RunClaim:
    """Claim ``path`` for this run (:class:`vitlab.claim.RunClaim`: one writer per folder), then check it.

    A new run takes only a new or empty folder, or, with ``run.overwrite``, one that holds a run: its manifest's
    files are removed and nothing else (:meth:`vitlab.rundir.RunDir.take_for_new_run`); a folder of the user's is
    never taken. The check runs while the claim is held, so it cannot race another ``vitlab fit``.
    """
    claim = RunClaim(path).acquire()
    try:
        if resuming:  # a resume appends to the run's files and rewrites its checkpoints in place
            RunDir(path).refuse_links("a resume rewrites", links_too=True)
        else:
            run = RunDir(path)
            stopped = run.is_run() and manifest.has_manifest(path) and stopped_before_a_checkpoint(path)
            if stopped:
                print(
                    f"run directory {path} holds a run that stopped before its first checkpoint (nothing to resume): "
                    "its files are replaced",
                    file=sys.stderr,
                    flush=True,
                )
            run.take_for_new_run(overwrite=cfg.run.overwrite or stopped)
    except BaseException:
        claim.release()
        raise
    return claim


def stopped_before_a_checkpoint(path: Path) -> bool:
    """True for the folder of a run that stopped (a full disk, Ctrl+C, a crash) before it wrote ``last.ckpt``, the
    export or the test metrics: it can be neither continued nor used, so it is not a run a retry must keep."""
    run = RunDir(path)
    return not any(p.exists() for p in (run.last_checkpoint, run.export_dir, run / TEST_METRICS_FILE))


def recovery_hint(path: Path) -> str:
    """How to go on after ``vitlab fit`` on ``path`` stopped part-way (a full disk, a read-only folder, Ctrl+C)."""
    if RunDir(path).last_checkpoint.is_file():
        return f"continue the run from its last checkpoint: vitlab fit --resume {path}"
    return "run the same command again: the run stopped before its first checkpoint, so it starts over"


def resolve_resume(target: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` for ``--resume TARGET``: a run directory (its ``last.ckpt``) or a ``.ckpt`` file."""
    target = Path(target).expanduser()
    if target.is_dir():
        ckpt = RunDir(target).last_checkpoint
        if not ckpt.is_file():
            raise RunDirError(
                f"--resume {target}: the folder has no checkpoints/last.ckpt; pass the run directory `vitlab fit` "
                "printed, or a .ckpt file"
            )
        run_dir = target
    elif target.is_file():
        run_dir, ckpt = target.parent.parent, target
    else:
        raise RunDirError(
            f"--resume {target}: no such run directory or checkpoint; pass the folder `vitlab fit` printed"
        )
    if ckpt.is_symlink():  # read before the run's links are checked: said as a link, not as a corrupt file
        raise RunDirError(
            f"--resume {target}: {ckpt} is a symbolic link ({manifest.describe_link(ckpt)}), and a resume rewrites it "
            "in place; vitlab acts on nothing outside the folder it owns: put the checkpoint itself there in place "
            f"of the link, or start a new run from its weights with model.pretrained={ckpt.resolve()}"
        )
    run = RunDir(run_dir)
    lost = "lost its" if manifest.has_manifest(run_dir) and not run.is_run() else None
    if lost or (run.is_run() and not run.config_dict()):
        raise RunDirError(
            f"--resume {target}: the run directory {run_dir} has {lost or 'an empty'} {CONFIG_FILE}, which the run, "
            f"its report and evaluation read; put it back, or start a new run from the weights with "
            f"model.pretrained={ckpt}"
        )
    return run_dir, ckpt

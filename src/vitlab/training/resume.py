"""What ``vitlab fit --resume`` continues and what it may change (docs/rundir.md, "Resume").

A resume continues the run its checkpoint holds: the weights, the optimiser's state (its learning rate, betas and
weight decay included), the schedule, the data's order and the dynamics controller's measurements. The config it is
given (the run's ``config.yaml`` with the command's overrides, or ``--config``) is compared with the checkpoint's
own, key by key: a key in :data:`HONOURED` may differ and takes effect from the resumed epoch, said in one line;
any other difference is refused before anything is written, naming the key and the command for a new run from the
checkpoint's weights. A config section may name keys of an honoured section that a resume still cannot change (its
``fixed_on_resume``: the dynamics controller's measurement settings, whose saved state they shape).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from vitlab.atomic import append_line
from vitlab.config import ConfigError, RunConfig, from_dict, to_dict
from vitlab.errors import RunDirError
from vitlab.export import checkpoint_hparams, read_checkpoint
from vitlab.rundir import RESUMES_FILE, RunDir
from vitlab.training.preflight import absolute_data_paths, changed_settings
from vitlab.training.run_folder import resolve_resume
from vitlab.training.tasks import WarmupCosine

#: the keys a resume takes up (patterns over dotted keys): how the run executes and what it does at its end, the
#: data's location, the clipping and smoothing read at every step, and the dynamics controller's rule and thresholds
HONOURED = (
    "trainer.*",
    "run.test",
    "run.export",
    "run.generate",
    "run.report",
    "run.part_stats_every",
    "data.root",
    "data.path",
    "data.num_workers",
    "data.eval_batch_size",
    "optim.grad_clip",
    "optim.label_smoothing",
    "dynamics.*",
)
#: keys a resume does not read (where the run is, how a new one is named): neither refused nor said
UNUSED = ("run.dir", "run.name", "run.root", "run.overwrite")
#: at most this many refused keys are spelt out in the new-run command of a refusal
SHOWN = 4


@dataclass
class Resume:
    """A checked ``--resume``: the checkpoint, its hyperparameters, the changes it honours and a schedule warning."""

    checkpoint: Path
    hparams: dict[str, Any]
    changes: dict[str, list[Any]]
    note: str | None

    def lines(self) -> list[str]:
        """What the run says before it starts: the honoured changes in one line, then the schedule's warning."""
        said = [f"resume changes {', '.join(f'{k} {a} -> {b}' for k, (a, b) in self.changes.items())}"]
        return (said if self.changes else []) + ([self.note] if self.note else [])


def read_resume(cfg: RunConfig, target: str | Path) -> Resume:
    """``--resume TARGET``: the checkpoint read (a corrupt file fails here, early), ``cfg`` checked against the
    checkpoint's config (:func:`resume_changes`) and the warning of a schedule the run outlasts
    (:func:`schedule_note`). Without ``run.dir`` the run continues in the checkpoint's run directory."""
    resumed_dir, ckpt_path = resolve_resume(target)
    checkpoint = read_checkpoint(ckpt_path)
    if not cfg.run.dir:
        cfg.run.dir = str(resumed_dir)
    absolute_data_paths(cfg)  # as the checkpoint's config stores them
    hparams = checkpoint_hparams(checkpoint)
    changes = resume_changes(cfg, hparams["config"], ckpt_path)
    return Resume(ckpt_path, hparams, changes, schedule_note(checkpoint, cfg.trainer.max_epochs, cfg.run.dir))


def record_resume(run: RunDir, cfg: RunConfig, resumed: Resume) -> None:
    """The resume in the run's records: a line of ``resumes.jsonl`` (when, from which checkpoint, the command, the
    changes) and, when it changed a setting, ``config.yaml`` rewritten to the config the run now trains with, so the
    file says what the run is (and a later resume of it starts from there); ``env.json`` stays that of its start."""
    time = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    record = {"time": time, "checkpoint": str(resumed.checkpoint), "command": sys.argv, "changed": resumed.changes}
    append_line(run / RESUMES_FILE, json.dumps(record, default=str))
    if resumed.changes:
        run.write_config(cfg)


def config_changes(cfg: RunConfig, stored: dict[str, Any]) -> dict[str, list[Any]]:
    """``{"trainer.max_epochs": [3, 5], ...}``: the keys whose value in ``cfg`` differs from the checkpoint's config
    ``stored``, both read through :class:`RunConfig` (a key added since the checkpoint has its default in both)."""
    try:
        old = to_dict(from_dict(RunConfig, stored))
    except ConfigError:  # a checkpoint of an older vitlab whose config no longer reads: compare it as stored
        old = stored
    normal = json.loads(json.dumps(old, default=str)), json.loads(json.dumps(to_dict(cfg), default=str))
    changes = changed_settings(*normal)
    return {key: values for key, values in changes.items() if key not in UNUSED}


def honoured(key: str, cfg: RunConfig) -> bool:
    """Whether a resume takes up a change of ``key`` (:data:`HONOURED`, less its section's ``fixed_on_resume``)."""
    section, _, name = key.partition(".")
    fixed = getattr(getattr(cfg, section, None), "fixed_on_resume", ())
    return name not in fixed and any(fnmatch(key, pattern) for pattern in HONOURED)


def resume_changes(cfg: RunConfig, stored: dict[str, Any], ckpt: Path) -> dict[str, list[Any]]:
    """The changes of ``cfg`` from the checkpoint's config that a resume honours; a :class:`RunDirError` that names
    every other one, before anything is written."""
    changes = config_changes(cfg, stored)
    refused = {key: values for key, values in changes.items() if not honoured(key, cfg)}
    if not refused:
        return changes
    listed = "; ".join(f"{key} (checkpoint {_shown(key, a)}, now {_shown(key, b)})" for key, (a, b) in refused.items())
    if any(key.startswith("model.") for key in refused):
        new_run = "start a new run with another run.dir"  # another model: the weights would not carry over
    else:
        values = [(key, b) for key, (_, b) in refused.items() if not isinstance(b, dict)][:SHOWN]
        sections = [key for key, (_, b) in refused.items() if isinstance(b, dict)]  # a section added: its keys
        new_run = (
            f"train a new run from these weights: vitlab fit --config {Path(cfg.run.dir or '.') / 'config.yaml'} "
            f"model.pretrained={ckpt} {''.join(f'{key}={json.dumps(b)} ' for key, b in values)}run.dir=NEW_FOLDER"
            + "".join(f" with your {key}.* settings" for key in sections)
        )
    raise RunDirError(
        f"--resume {ckpt}: the checkpoint does not match this config: {listed}. A resume continues the checkpoint's "
        f'run and changes only {honoured_keys(cfg)} (docs/rundir.md, "Resume"). Undo the change (the override, or '
        f"the edit to the run's config.yaml) to resume, or {new_run}; nothing was written"
    )


def _shown(key: str, value: Any) -> str:
    """A config value in a refusal: a whole section (``dynamics``) as ``a section`` or ``none``."""
    if "." not in key:
        return "a section" if isinstance(value, dict) else "none"
    return repr(value)


def honoured_keys(cfg: RunConfig) -> str:
    """:data:`HONOURED` in a line: ``trainer.*, run.{test,export}, ..., dynamics.* but its measurement settings``."""
    sections: dict[str, list[str]] = {}
    for pattern in HONOURED:
        section, _, name = pattern.partition(".")
        sections.setdefault(section, []).append(name)
    shown = [f"{s}.{n[0]}" if len(n) == 1 else f"{s}.{{{','.join(n)}}}" for s, n in sections.items()]
    fixed = [bool(getattr(getattr(cfg, s, None), "fixed_on_resume", ())) for s in sections]
    return ", ".join(
        f"{text} but its measurement settings" if f else text for text, f in zip(shown, fixed, strict=True)
    )


def schedule_note(checkpoint: dict[str, Any], max_epochs: int | None, run_dir: Any) -> str | None:
    """A warning for ``vitlab fit --resume`` with more epochs than the checkpoint's cosine schedule spans, else None.

    The schedule (:class:`WarmupCosine`) is part of the checkpoint: a resume keeps its length, so it does not stretch
    over the new ``trainer.max_epochs``, and the epochs after its end train at ``optim.min_lr``, as a resumed run
    should (the same steps, the same rates). A first run that stopped inside its warm-up (``optim.warmup_epochs``
    longer than its ``trainer.max_epochs``) goes on warming up past that end: the rates are the schedule's own, read
    from it. A new run from the weights gets a schedule of its own.
    """
    schedulers = checkpoint.get("lr_schedulers") or [{}]
    state = (schedulers[0].get("lr_lambdas") or [None])[0]
    if not isinstance(state, dict) or "total" not in state or not max_epochs or max_epochs < 1:
        return None
    step = int(checkpoint.get("global_step", 0))
    per_epoch = max(1, step // max(1, int(checkpoint.get("epoch", 0)) + 1))
    end = math.ceil(state["total"] / per_epoch)
    if max_epochs <= end:
        return None
    base = schedulers[0].get("base_lrs", [0.0])[0]
    schedule = WarmupCosine(state.get("warmup", 0), state["total"], state.get("min_ratio", 0.0))
    ended = "ended" if step >= state["total"] else "ends"
    new_run = (
        f"For a new warm-up and cosine, train a new run from these weights: vitlab fit --config {run_dir}/config.yaml "
        f"model.pretrained={run_dir} trainer.max_epochs={max_epochs - end} run.dir=NEW_FOLDER"
    )
    final, first = f"{base * schedule.min_ratio:.2g}", end * per_epoch
    rates = [base * schedule(s) for s in range(first, max_epochs * per_epoch)]
    warm = [i for i, rate in enumerate(rates) if rate != base * schedule.min_ratio]  # the rest of a warm-up
    if not warm:
        return (
            f"warning: the run's cosine schedule {ended} at epoch {end} and a resume keeps it: epochs {end + 1}.."
            f"{max_epochs} train at its final rate ({final}). {new_run}"
        )
    last = math.ceil((first + warm[-1] + 1) / per_epoch)  # the last epoch with a step of it
    lo, hi = min(rates[i] for i in warm), max(rates[i] for i in warm)
    return (
        f"warning: the run's cosine schedule {ended} at epoch {end}, inside its warm-up (optim.warmup_epochs was "
        f"longer than the first run's trainer.max_epochs), and a resume keeps both: epochs {end + 1}..{last} go on "
        f"with the warm-up, at rates from {lo:.2g} up to {hi:.2g}, and the steps after it train at the schedule's "
        f"final rate ({final}). {new_run}"
    )

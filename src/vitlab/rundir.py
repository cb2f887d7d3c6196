"""The run directory: its layout, and the one place that reads and writes it.

Every command reads or writes the folder ``vitlab fit`` makes; this module owns it. It holds the file names
(constants), the rule that finds the model in a run directory, an export folder or a checkpoint
(:func:`locate_model`), the final metrics of a run in one schema (:meth:`RunDir.final_metrics`), the resolved config
with overrides (:meth:`RunDir.config`) and the ``env.json`` it writes (the probing itself is
:mod:`vitlab.environment`), and whether a folder may take a new run (:meth:`RunDir.take_for_new_run`, by the folder's
manifest). The JSON readers are :mod:`vitlab.jsonio`'s and the atomic writes :mod:`vitlab.atomic`'s (their names are
also this module's). It sits near the bottom of the package: it imports only ``atomic``, ``manifest``,
``environment``, ``config``, ``jsonio`` and ``errors``; training writes through it, evaluation, compare, the report
and the plots read through it.

The layout, file by file: docs/rundir.md.

Files a user names (``--out``) follow one rule, :func:`check_outputs` and :func:`write_output`: an existing file is
refused unless ``--force``, and a file is written whole or not at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitlab import manifest

# the writing itself is vitlab.atomic's (every write goes through it); its names are also this module's
from vitlab.atomic import atomic_write_json as atomic_write_json
from vitlab.atomic import atomic_write_text as atomic_write_text
from vitlab.atomic import check_outputs as check_outputs
from vitlab.atomic import environment_error as environment_error
from vitlab.atomic import save_figure as save_figure
from vitlab.atomic import write_output as write_output
from vitlab.environment import environment as environment
from vitlab.errors import CheckpointError, ConfigError, RunDirError
from vitlab.jsonio import flatten
from vitlab.jsonio import read_json as read_json
from vitlab.jsonio import read_jsonl as read_jsonl

if TYPE_CHECKING:
    from vitlab.config import RunConfig

CONFIG_FILE = "config.yaml"
ENV_FILE = "env.json"
METRICS_FILE = "metrics.jsonl"
STEPS_FILE = "steps.jsonl"
TIMING_FILE = "timing.json"
ATTENTION_PATHS_FILE = "attention_paths.json"
TEST_METRICS_FILE = "test_metrics.json"
DDP_CHECK_FILE = "ddp_check.json"
DYNAMICS_FILE = "dynamics.jsonl"
DYNAMICS_DIR = "dynamics"
LAYERS_FILE = "layers.jsonl"  # the frozen encoder prefix per epoch (dynamics.freeze=layers)
REPORT_FILE = "report.html"
TENSORBOARD_DIR = "tb"
CHECKPOINTS_DIR = "checkpoints"
BEST_CHECKPOINT = "best.ckpt"
LAST_CHECKPOINT = "last.ckpt"
EXPORT_DIR = "export"
EXPORT_CONFIG_FILE = "config.json"
EXPORT_WEIGHTS_FILE = "model.safetensors"
#: the deployment files ``vitlab export --format`` writes beside the weights
EXPORT_FORMAT_FILES = {"onnx": "model.onnx", "torch-export": "model.pt2"}
GENERATE_DIR = "generate"
GENERATE_METRICS_FILE = "metrics.json"
EVALUATION_DIR = "evaluation"
EVALUATION_FILE = "evaluation.json"
RESUMES_FILE = "resumes.jsonl"
RUN_DIR_ENV = "VITLAB_RUN_DIR"

#: the files of a run at names ``vitlab fit`` chooses: ``run.overwrite=true`` refuses to start when one of them is
#: there and the run's manifest does not name it (a user's file at that name)
RUN_FILES = (
    CONFIG_FILE,
    ENV_FILE,
    METRICS_FILE,
    STEPS_FILE,
    TIMING_FILE,
    ATTENTION_PATHS_FILE,
    TEST_METRICS_FILE,
    DDP_CHECK_FILE,
    DYNAMICS_FILE,
    LAYERS_FILE,
    RESUMES_FILE,
    REPORT_FILE,
    f"{CHECKPOINTS_DIR}/{BEST_CHECKPOINT}",
    f"{CHECKPOINTS_DIR}/{LAST_CHECKPOINT}",
    f"{EXPORT_DIR}/{EXPORT_WEIGHTS_FILE}",
    f"{EXPORT_DIR}/{EXPORT_CONFIG_FILE}",
)
#: sections of evaluation.json that hold per-run metrics (``run`` is provenance, ``per_class`` a table)
EVALUATION_SECTIONS = ("test", "calibration", "test_calibrated", "tta", "corruptions", "mean_corrupted", "assignment")


# -------------------------------------------------------------------------------------------------------------------
# Finding the model
# -------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelLocation:
    """Where a model is: ``source`` is an export folder or a ``.ckpt`` file; ``run_dir`` the run directory it
    belongs to, or None (a lone export or checkpoint)."""

    source: Path
    run_dir: Path | None

    @property
    def is_export(self) -> bool:
        return self.source.is_dir()


def _run_of(path: Path) -> Path | None:
    return path if (path / CONFIG_FILE).exists() else None


def locate_model(path: str | Path) -> ModelLocation:
    """The one rule for "a run directory, an export folder or a checkpoint".

    - a file is a checkpoint; its run directory is two levels up (``<run>/checkpoints/best.ckpt``) if that holds a
      ``config.yaml``;
    - a folder with ``config.json`` is an export; its run directory is its parent if that holds a ``config.yaml``;
    - a folder with ``config.yaml`` or ``checkpoints/`` is a run directory: its model is ``export/`` if present,
      else ``checkpoints/best.ckpt``, else ``checkpoints/last.ckpt`` (``run_dir`` is None without ``config.yaml``:
      the checkpoint's stored config is then the run's).
    """
    path = Path(path).expanduser()
    if path.is_file():
        return ModelLocation(path, _run_of(path.parent.parent))
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist; pass a run directory, its export/ folder or a .ckpt file")
    if (path / EXPORT_CONFIG_FILE).exists():
        return ModelLocation(path, _run_of(path.parent))
    if (path / CONFIG_FILE).exists() or (path / CHECKPOINTS_DIR).is_dir():
        run = RunDir(path)
        for candidate in (run.export_dir, run.best_checkpoint, run.last_checkpoint):
            if candidate.exists() and (candidate.is_file() or (candidate / EXPORT_CONFIG_FILE).exists()):
                return ModelLocation(candidate, _run_of(path))
        raise CheckpointError(
            f"run directory {path} holds no export/ folder and no checkpoint; train it to the end or `vitlab export` it"
        )
    raise ConfigError(
        f"{path} is neither a run directory ({CONFIG_FILE}), an exported model ({EXPORT_CONFIG_FILE}) nor a checkpoint"
    )


def locate_checkpoint(path: str | Path, prefer: Sequence[str] = (BEST_CHECKPOINT, LAST_CHECKPOINT)) -> Path:
    """A ``.ckpt`` file as given, or the first of ``prefer`` under a run directory's ``checkpoints/``."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in prefer:
            candidate = path / CHECKPOINTS_DIR / name
            if candidate.is_file():
                return candidate
        raise CheckpointError(
            f"{path} has no {' or '.join(f'{CHECKPOINTS_DIR}/{n}' for n in prefer)}; pass the run directory "
            "`vitlab fit` printed, or a .ckpt file"
        )
    return path


# -------------------------------------------------------------------------------------------------------------------
# The run directory
# -------------------------------------------------------------------------------------------------------------------
def _flatten_floats(node: Any, prefix: str) -> dict[str, float]:
    """Finite float leaves of nested dicts as ``{"prefix/a/b": value}``; counts (ints), lists and strings left out."""
    return {k: v for k, v in flatten(node, prefix, "/").items() if isinstance(v, float) and math.isfinite(v)}


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class RunDir:
    """One run directory: paths of its files, and readers and writers for them.

    Readers of optional files return None (JSON) or ``[]`` (JSON lines) when the run does not have the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, relative: str | Path) -> Path:
        return self.path / relative

    # paths -----------------------------------------------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def best_checkpoint(self) -> Path:
        return self.path / CHECKPOINTS_DIR / BEST_CHECKPOINT

    @property
    def last_checkpoint(self) -> Path:
        return self.path / CHECKPOINTS_DIR / LAST_CHECKPOINT

    @property
    def export_dir(self) -> Path:
        return self.path / EXPORT_DIR

    # state -----------------------------------------------------------------------------------------------------
    def is_run(self) -> bool:
        """True when the folder holds a run's resolved config."""
        return self.config_file.is_file()

    def take_for_new_run(self, *, overwrite: bool) -> None:
        """Make the folder ready for a new run, or refuse in one line before anything is touched.

        A new or empty folder (hidden files aside) gets a manifest (:mod:`vitlab.manifest`). A folder that holds
        files and no manifest holds none of vitlab's: refused, whatever ``overwrite`` says (a run that lost its
        manifest is told to delete the folder itself). A folder with one holds a run: refused unless ``overwrite``,
        which removes what the manifest names and nothing else, but not when a file at a name the run writes
        (:data:`RUN_FILES`) is not the run's, nor when a file it names lies behind a symbolic link
        (:meth:`refuse_links`).
        """
        names = manifest.unlisted(self.path)
        trained = self.is_run() and (self.checkpoints_dir.is_dir() or (self.path / METRICS_FILE).is_file())
        if names and not manifest.has_manifest(self.path) and trained:
            raise RunDirError(
                f"run directory {self.path} holds a run ({CONFIG_FILE}, {METRICS_FILE} or {CHECKPOINTS_DIR}/) but no "
                "run manifest "
                f"({manifest.MANIFEST_FILE}), so vitlab cannot tell its files from yours and removes none, "
                "run.overwrite=true or not: delete the folder yourself if nothing in it is yours, or choose another "
                "run.dir"
            )
        if names and not manifest.has_manifest(self.path):
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise RunDirError(
                f"run directory {self.path} holds files vitlab did not write ({shown}) and no run manifest "
                f"({manifest.MANIFEST_FILE}); choose a new or empty run.dir (vitlab never writes into a folder of "
                "yours)"
            )
        if names and not overwrite:
            raise RunDirError(
                f"run directory {self.path} already holds a run; continue it with `vitlab fit --resume {self.path}`, "
                "choose another run.dir, or set run.overwrite=true to remove the files that run wrote (named in its "
                f"{manifest.MANIFEST_FILE}; other files stay)"
            )
        self.refuse_links("run.overwrite=true removes")
        for name in RUN_FILES:
            if (self.path / name).exists() and not manifest.is_recorded(self.path / name):
                link = manifest.link_on_the_way(self.path, self.path / name)
                through = f" (through the link {manifest.describe_link(link)})" if link else ""
                raise RunDirError(
                    f"run directory {self.path} holds {name}{through}, which vitlab did not write; move it elsewhere "
                    "or choose another run.dir (run.overwrite=true removes only the files the run's manifest names)"
                )
        manifest.remove_recorded(self.path)
        manifest.start(self.path, note=False)

    def refuse_links(self, action: str, *, links_too: bool = False) -> None:
        """Refuse in one line when a file the run's manifest names is reached through a symbolic link (``links_too``:
        or is one), naming the link; ``action`` says what would follow it (``"run.overwrite=true removes"``)."""
        found = manifest.reached_through_link(self.path, links_too=links_too)
        if found is not None:
            link, path = found
            raise RunDirError(
                f"run directory {self.path} holds {manifest.describe_link(link)}, a symbolic link, and {action} "
                f"{path.relative_to(self.path)} through it; vitlab acts on nothing outside the folder it owns: move "
                "the files into the run directory in place of the link, or remove the link, or choose another run.dir"
            )

    def require_run(self) -> RunDir:
        if not self.is_run():
            raise ConfigError(
                f"{self.path} is not a run directory (no {CONFIG_FILE}); pass the folder `vitlab fit` printed"
            )
        return self

    # readers ---------------------------------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        """``config.yaml`` as plain data."""
        from vitlab.config import read_yaml

        self.require_run()
        return read_yaml(self.config_file) or {}

    def config(self, overrides: Sequence[str] | Mapping[str, Any] | None = None) -> RunConfig:
        """The run's resolved config with ``overrides`` (``["optim.lr=1e-3"]`` or a nested mapping) applied.

        ``run.dir`` is this directory (unless an override sets it): the one in ``config.yaml`` names where the run was
        made, so a moved or copied run would otherwise resume into, or evaluate, the original."""
        data = self.config_dict()
        data.setdefault("run", {})["dir"] = str(self.path)
        return config_with_overrides(data, overrides)

    def json(self, relative: str | Path) -> Any:
        """A JSON file of the run, or None if it is not there."""
        file = self.path / relative
        return read_json(file) if file.exists() else None

    def env(self) -> dict[str, Any] | None:
        return self.json(ENV_FILE)

    def metrics(self) -> list[dict[str, Any]]:
        """``metrics.jsonl``: one record per epoch."""
        return read_jsonl(self.path / METRICS_FILE, "epoch")

    def steps(self) -> list[dict[str, Any]]:
        """``steps.jsonl``: ``step``, ``epoch``, ``loss``, ``lr`` in step order."""
        return read_jsonl(self.path / STEPS_FILE, "step")

    def dynamics(self) -> list[dict[str, Any]]:
        """``dynamics.jsonl``: one record per epoch of the dynamics controller."""
        return read_jsonl(self.path / DYNAMICS_FILE, "epoch")

    def test_metrics(self) -> dict[str, Any] | None:
        return self.json(TEST_METRICS_FILE)

    def timing(self) -> dict[str, Any] | None:
        return self.json(TIMING_FILE)

    def generate_metrics(self) -> dict[str, Any] | None:
        return self.json(Path(GENERATE_DIR) / GENERATE_METRICS_FILE)

    def evaluation(self, suffix: str = "") -> dict[str, Any] | None:
        """``evaluation/evaluation.json`` (``evaluation-KEY=VALUE/`` with ``suffix="-KEY=VALUE"``)."""
        return self.json(Path(f"{EVALUATION_DIR}{suffix}") / EVALUATION_FILE)

    def model_state(self) -> str | None:
        """What the run's model is now: the SHA-256 of ``checkpoints/last.ckpt`` (from its sidecar), which every
        epoch trained changes, a resumed one included; its size and time without a sidecar; None without one."""
        sidecar = self.last_checkpoint.with_name(LAST_CHECKPOINT + ".sha256")
        if sidecar.is_file():
            return sidecar.read_text().split()[0]
        if self.last_checkpoint.is_file():
            stat = self.last_checkpoint.stat()
            return f"size {stat.st_size}, mtime {stat.st_mtime_ns}"
        return None

    def is_current(self, made_from: str | None) -> bool:
        """Whether a result that records the :meth:`model_state` it was made from (``evaluate`` and ``explain
        --evaluate`` record it as ``run_model``) describes the run's model now; one made during a fit, or before a
        ``--resume``, does not. A result that records none (older, or of a lone export) is taken as it is."""
        return made_from is None or made_from == self.model_state()

    def current_evaluation(self) -> dict[str, Any] | None:
        """``evaluation/evaluation.json`` when it describes the run's model now (:meth:`is_current`), else None."""
        evaluation = self.evaluation()
        if evaluation is None or not self.is_current((evaluation.get("run") or {}).get("run_model")):
            return None
        return evaluation

    def final_metrics(self) -> dict[str, float]:
        """The run's final numbers, in the one schema every command uses:

        - ``test_metrics.json`` as logged (``test/acc``, ``test/loss``, ...);
        - with them, the training times of ``timing.json`` (``time/step_total_s``, ...);
        - the float values of ``evaluation/evaluation.json`` as ``eval/<section>/<key>`` (``eval/test/top1``,
          ``eval/test_calibrated/ece``, ``eval/tta/top1``, ``eval/mean_corrupted``,
          ``eval/corruptions/contrast/mean``), when it describes the run's model now (:meth:`current_evaluation`:
          one made during a fit or before a ``--resume`` is left out);
        - ``generate/metrics.json`` as ``generate/<key>``.

        Counts (ints), lists and non-finite values are left out of the evaluation's part.
        """
        metrics: dict[str, float] = {}
        test = self.test_metrics()
        if test is not None:
            metrics.update(_numbers(test))
            timing = self.timing()
            if timing is not None:
                metrics.update({k: float(v) for k, v in timing.items() if k.startswith("time/")})
        evaluation = self.current_evaluation()
        if evaluation is not None:
            for section in EVALUATION_SECTIONS:
                metrics.update(_flatten_floats(evaluation.get(section), f"eval/{section}"))
        for key, value in _numbers(self.generate_metrics() or {}).items():
            metrics[f"generate/{key}"] = value
        return metrics

    def model(self) -> ModelLocation:
        """Where the run's model is (:func:`locate_model`)."""
        return locate_model(self.path)

    # writers ---------------------------------------------------------------------------------------------------
    def write_config(self, cfg: RunConfig) -> None:
        from vitlab.config import dump_yaml

        atomic_write_text(self.config_file, dump_yaml(cfg))

    def write_env(self, **extra: Any) -> None:
        """``env.json``: :func:`environment` and the run's own ``extra`` entries (e.g. its resolved precision)."""
        atomic_write_text(self.path / ENV_FILE, json.dumps({**environment(), **extra}, indent=2))

    def write_json(self, relative: str | Path, obj: Any) -> Path:
        """Strict JSON into the run, atomically; returns the path."""
        path = self.path / relative
        atomic_write_json(path, obj)
        return path


def config_with_overrides(
    values: Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any] | None = None
) -> RunConfig:
    """A :class:`~vitlab.config.RunConfig` from plain data (a run's ``config.yaml``, a checkpoint's stored config)
    with dotted ``overrides`` (``["optim.lr=1e-3"]``) or a nested mapping merged in."""
    from vitlab.config import RunConfig, deep_merge, from_dict, parse_overrides

    if overrides is None:
        update: Mapping[str, Any] = {}
    elif isinstance(overrides, Mapping):
        update = overrides
    else:
        update = parse_overrides(list(overrides))
    return from_dict(RunConfig, deep_merge(dict(values), dict(update)))

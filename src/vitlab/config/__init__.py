"""Typed run configuration: the dataclasses of a run's sections and their checks.

A run is described by :class:`RunConfig`. YAML files under ``configs/`` (packaged as ``vitlab/configs``) give
values; ``key.sub=value`` overrides on the command line change them; unknown keys are errors that name the key,
the section and the closest valid names (the files and overrides are read in :mod:`vitlab.config.files`). The
resolved config is written into every run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vitlab.config.coerce import from_dict, to_dict
from vitlab.config.dynamics import DynamicsConfig
from vitlab.config.files import (
    CONFIG_ROOT,
    deep_merge,
    load_yaml,
    parse_overrides,
    read_config,
    read_yaml,
)
from vitlab.config.loss import ClassificationLossConfig, check_loss_section
from vitlab.config.model import ModelConfig, model_class_name, model_section
from vitlab.config.paths import check_path_length
from vitlab.data.config import DataConfig, check_dataset_name
from vitlab.errors import ConfigError


@dataclass
class OptimConfig:
    """Optimiser and schedule. ``schedule``: ``cosine`` (with linear warm-up), ``plateau`` (ReduceLROnPlateau on the
    validation loss, the ViTCAE paper's choice) or ``none``."""

    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    min_lr: float = 1e-6
    plateau_factor: float = 0.5
    plateau_patience: int = 5
    grad_clip: float | None = 1.0
    label_smoothing: float = 0.0
    #: AdamW's implementation: ``auto`` (fused where the device has the kernel), ``true`` (fused, or an error),
    #: ``false`` (torch's default: foreach on CUDA, a per-tensor loop on CPU); ``vitlab.acceleration.optim.adamw``
    fused: bool | str = "auto"

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"optim.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            problems.append(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0 <= beta < 1 for beta in self.betas):
            problems.append(f"optim.betas must both be in [0, 1), got {list(self.betas)}")
        if self.schedule not in SCHEDULES:
            problems.append(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.warmup_epochs < 0 or self.min_lr < 0:
            problems.append("optim.warmup_epochs and optim.min_lr must be >= 0")
        if not 0 < self.plateau_factor < 1 or self.plateau_patience < 0:
            problems.append("optim.plateau_factor must be in (0, 1) and optim.plateau_patience >= 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            problems.append(f"optim.grad_clip must be > 0 or null (off), got {self.grad_clip}")
        if not 0 <= self.label_smoothing < 1:
            problems.append(f"optim.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if problems:
            raise ConfigError("; ".join(problems))


#: values of ``optim.schedule``
SCHEDULES = ("cosine", "plateau", "none")


@dataclass
class TrainerConfig:
    """Arguments passed through to ``lightning.pytorch.Trainer``, and vitlab's own (``VITLAB_KEYS``): ``compile``
    (``torch.compile`` of the network whole with its loss, and of its blocks, ``vitlab.acceleration``) with
    ``compile_mode`` (``auto``: timed once per machine on CUDA, ``default`` elsewhere,
    ``vitlab.acceleration.compile_mode.choose_compile_mode``; or ``default``, ``reduce-overhead``, ``max-autotune``,
    ``max-autotune-no-cudagraphs``) and ``compile_backend``;
    ``grad_checkpointing`` (activation checkpointing of the model's blocks). ``precision: auto`` (the default) is
    bf16-mixed where the device computes bf16 natively and 32-true elsewhere
    (:func:`vitlab.acceleration.precision.choose_precision`); any of Lightning's precisions is used as given."""

    max_epochs: int = 10
    accelerator: str = "auto"
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "auto"
    deterministic: bool = False
    log_every_n_steps: int = 10
    limit_train_batches: float | int | None = None
    limit_val_batches: float | int | None = None
    limit_test_batches: float | int | None = None  # quick looks only: the test metrics then cover part of the set
    check_val_every_n_epoch: int = 1
    enable_progress_bar: bool = True
    max_time: str | None = None
    compile: bool = False
    compile_mode: str | None = "auto"
    compile_backend: str = "inductor"
    #: recompute the blocks' activations in the backward pass instead of keeping them (the model's
    #: ``set_grad_checkpointing``): less activation memory for one more forward of the blocks, same loss and gradients
    grad_checkpointing: bool = False
    #: the attention kernel: ``auto`` (measured per call shape, :mod:`vitlab.layers.attention_path`; the choices go to
    #: the run's ``attention_paths.json`` and a resumed run reuses them) or one of ``sdpa``, ``math``, ``eager`` for
    #: every call. The paths round differently, so two fresh ``auto`` runs that measure differently are not
    #: bit-identical; a fixed path is
    attention_path: str = "auto"

    def __post_init__(self) -> None:
        if self.max_epochs == -1 and self.max_time is None:
            raise ConfigError("trainer.max_epochs=-1 (no limit) needs trainer.max_time= to end the run")
        if self.max_epochs < 1 and self.max_epochs != -1:
            raise ConfigError(
                f"trainer.max_epochs must be >= 1, got {self.max_epochs}: a run trains at least one epoch; to test or "
                "export a trained run use `vitlab test RUN` or `vitlab export RUN`"
            )
        if self.log_every_n_steps < 1 or self.check_val_every_n_epoch < 1:
            raise ConfigError("trainer.log_every_n_steps and trainer.check_val_every_n_epoch must be >= 1")
        if self.attention_path not in ATTENTION_PATHS:
            raise ConfigError(
                f"trainer.attention_path must be one of {', '.join(ATTENTION_PATHS)}, got {self.attention_path!r}"
            )
        if str(self.precision) not in PRECISIONS:
            raise ConfigError(
                f"trainer.precision must be auto or one of Lightning's precisions ({', '.join(PRECISIONS[1:])}), "
                f"got {self.precision!r}"
            )

    def lightning_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``lightning.pytorch.Trainer``: every set key but ``VITLAB_KEYS``."""
        return {k: v for k, v in to_dict(self).items() if v is not None and k not in VITLAB_KEYS}


#: values of ``trainer.precision``: ``auto`` and Lightning's names (with their short forms)
PRECISIONS: tuple[str, ...] = (
    *("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "transformer-engine"),
    *("transformer-engine-float16", "32", "16", "bf16", "64"),
)

#: keys of :class:`TrainerConfig` that vitlab uses itself, not passed to Lightning
VITLAB_KEYS: tuple[str, ...] = ("compile", "compile_mode", "compile_backend", "grad_checkpointing", "attention_path")
#: ``trainer.attention_path``: ``auto`` and :data:`vitlab.layers.attention_path.PATHS` (kept here: no torch import)
ATTENTION_PATHS: tuple[str, ...] = ("auto", "sdpa", "math", "eager")


#: the largest seed every generator takes: numpy's (``seed_everything``) accepts 0..2**32-1
SEED_MAX = 2**32 - 1


def check_seed(seed: int, name: str) -> None:
    """``seed`` (the option ``name``) is one every random generator of a run takes: an integer in 0..2**32-1."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"{name} must be a whole number in 0..{SEED_MAX} (2**32-1), got {seed!r}; choose one there")


@dataclass
class RunSection:
    """Where and how the run is recorded. ``dir`` defaults to ``runs/<name>-<timestamp>``."""

    name: str = "run"
    dir: str | None = None
    root: str = "runs"
    overwrite: bool = False  # a run.dir that holds a run is refused unless true (then that run's files are replaced)
    seed: int = 0
    export: bool = True
    test: bool = True
    generate: bool = True
    report: bool = True
    #: per-part gradient norms and update/weight ratios every this many optimisation steps, logged per epoch as
    #: ``parts/<part>/grad_norm`` and ``parts/<part>/update_ratio`` (``vitlab.training.callbacks.PartStats``); 0 = off
    part_stats_every: int = 0

    def __post_init__(self) -> None:
        check_seed(self.seed, "run.seed")
        if self.name in ("", ".", "..") or any(sep in self.name for sep in ("/", "\\")):
            raise ConfigError(
                f"run.name={self.name!r} must be one folder name (no '/' or '\\', not '.' or '..'): the run goes to "
                "<run.root>/<run.name>-<time>; set run.root= to choose the folder it goes in"
            )
        if self.dir:
            check_path_length(self.dir, "run.dir")
        else:
            check_path_length(self.root, "run.root")
            check_path_length(str(Path(self.root) / self.name), "run.name", "-YYYYmmdd-HHMMSS-N")
        if self.part_stats_every < 0:
            raise ConfigError(
                f"run.part_stats_every must be 0 (off) or a number of optimisation steps, got {self.part_stats_every}"
            )


@dataclass
class FinetuneConfig:
    """Fine-tuning options (docs/recipes.md, "Pretrained weights and fine-tuning"); the weights themselves come from
    ``model.pretrained``. ``layer_decay``: layer-wise learning-rate decay (BEiT, Bao et al. 2022, sec. 2.6) over
    the layers of the model's ``group_matcher`` (timm's; every vitlab model has one): layer ``l`` of ``0..L`` trains
    at ``lr * layer_decay ** (L - l)``, the embeddings (layer 0) slowest, the head (layer ``L``) at ``lr``; for a ViT
    block ``i`` is layer ``i + 1`` and the final norm shares the head's; ``None`` = off. ``freeze``: ``none``, or
    ``backbone`` (the ViT's weights get no gradient: a linear probe for a ViT, only the decoder side for ViTCAE).
    ``early_stopping_patience``: stop after this many validation epochs without improvement of
    ``early_stopping_monitor`` (default: the metric that picks best.ckpt) by more than ``early_stopping_min_delta``
    (Lightning's ``EarlyStopping``); ``None`` = off."""

    layer_decay: float | None = None
    freeze: str = "none"
    #: ``pretrained``: normalise the data with the mean and std of ``model.pretrained``'s ``pretrained_cfg`` (timm's
    #: for ``timm:NAME``, the pretraining data's for a vitlab run), as timm's fine-tuning does; ``data``: with the
    #: training images' own. Weights that name none (a bare file) or another channel count leave the data's.
    normalisation: str = "pretrained"
    early_stopping_patience: int | None = None
    early_stopping_monitor: str | None = None
    early_stopping_mode: str | None = None
    early_stopping_min_delta: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            problems.append(f"finetune.layer_decay must be in (0, 1] (or null for off), got {self.layer_decay}")
        if self.normalisation not in ("pretrained", "data"):
            problems.append(f"finetune.normalisation must be pretrained or data, got {self.normalisation!r}")
        if self.freeze not in ("none", "backbone"):
            problems.append(f"finetune.freeze must be none or backbone, got {self.freeze!r}")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            problems.append(
                f"finetune.early_stopping_patience must be >= 1 (or null), got {self.early_stopping_patience}"
            )
        if self.early_stopping_mode not in (None, "min", "max"):
            problems.append(f"finetune.early_stopping_mode must be min, max or null, got {self.early_stopping_mode!r}")
        if problems:
            raise ConfigError("; ".join(problems))


@dataclass
class RunConfig:
    """Everything one ``vitlab fit`` needs. Two sections are checked by the preset's class and hold the keys the config
    sets: ``model``, ``{name: <preset>, pretrained: <weights>, **constructor overrides}``, typed by the class's
    options dataclass (:func:`vitlab.config.model.model_section`); ``loss``, the loss weights of the task that trains
    the class, typed and checked by its dataclass (:func:`vitlab.config.loss.check_loss_section`), which the task
    builds. A section given in Python is checked in ``__post_init__`` as one read from YAML; ``dynamics`` is the
    attention-dynamics controller's section, or None for no controller."""

    model: dict[str, Any] = field(default_factory=lambda: ModelConfig(name="vit_pico"))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunSection = field(default_factory=RunSection)
    loss: dict[str, Any] = field(default_factory=dict)
    dynamics: DynamicsConfig | None = None
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        self.model = model_section(self.model)
        class_name = model_class_name(self.model)
        self.loss = check_loss_section(class_name, self.loss)
        if self.dynamics is not None:
            self.dynamics.check_model(self.model)
            self.dynamics.check_data(self.data)


def build_config(config: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply dotted overrides, validate every key and type of every section, all
    before torch is imported: the dataclasses and their checks, the ``model`` and ``loss`` sections by the preset's
    class (:func:`vitlab.config.model.model_section`, :func:`vitlab.config.loss.check_loss_section`), the dataset's
    name (``data``). The data's files and the model's option values together are checked where they are used, still
    before ``fit`` claims its folder."""
    cfg = from_dict(RunConfig, read_config(config, overrides))
    check_dataset_name(cfg.data.name)
    return cfg


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


__all__ = [
    "CONFIG_ROOT",
    "ClassificationLossConfig",
    "ConfigError",
    "DataConfig",
    "DynamicsConfig",
    "FinetuneConfig",
    "OptimConfig",
    "RunConfig",
    "RunSection",
    "TrainerConfig",
    "build_config",
    "check_seed",
    "deep_merge",
    "dump_yaml",
    "from_dict",
    "load_yaml",
    "parse_overrides",
    "read_yaml",
    "to_dict",
]

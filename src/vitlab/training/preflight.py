"""What ``vitlab fit`` checks before it claims a folder: the data's paths and description, the model's arguments
from the data, that a first batch fits in memory, and that a resumed checkpoint is this config's model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitlab.config import ConfigError, RunConfig, to_dict
from vitlab.config.hf_model import HF_PREFIX
from vitlab.data import VisionDataModule
from vitlab.errors import RunDirError
from vitlab.models import hf_models, tv_models
from vitlab.models.hf_weights import pretrained_options
from vitlab.models.registry import constructor_args, get_preset
from vitlab.models.timm_models import DATA_OPTIONS, data_options


def absolute_data_paths(cfg: RunConfig) -> None:
    """Store ``data.root`` and ``data.path`` as absolute paths, so the run's config works from any folder (as
    ``vitlab evaluate`` and ``vitlab report`` use it). A relative ``data.path`` is resolved the way the loaders
    look for it: relative to the current folder if it is there, else relative to ``data.root``."""
    data = cfg.data
    root = Path(data.root).expanduser().absolute()
    if data.path is not None and not Path(data.path).expanduser().is_absolute():
        given = Path(data.path).expanduser()
        data.path = str((given if given.exists() or not (root / given).exists() else root / given).absolute())
    elif data.path is not None:
        data.path = str(Path(data.path).expanduser())
    data.root = str(root)


def data_info(dm: VisionDataModule) -> dict[str, Any]:
    return {
        "dataset": dm.cfg.name,
        "num_classes": dm.num_classes,
        "in_chans": dm.in_chans,
        "img_size": dm.img_size,
        "mean": list(dm.mean),
        "std": list(dm.std),
        "class_names": list(dm.class_names),
    }


def model_kwargs_for(cfg: RunConfig, info: dict[str, Any]) -> dict[str, Any]:
    """Model overrides from the config, with image size, channels and classes filled in from the data."""
    kwargs = {k: v for k, v in cfg.model.items() if k not in ("name", "pretrained")}  # pretrained: weights, not shape
    preset = get_preset(cfg.model["name"])
    if preset.factory is None:
        accepted = constructor_args(preset.cls)
    elif preset.name.startswith(HF_PREFIX):  # the network of a save_pretrained folder, under the config's keys
        kwargs = {k: v for k, v in kwargs.items() if not (k in DATA_OPTIONS and v is None)}
        folder = cfg.model.get("pretrained")
        kwargs = {**pretrained_options(preset.name, folder), **kwargs} if folder else kwargs
        accepted = hf_models.data_options(preset.name)
    else:  # a timm model: a null data option is the data's, and img_size goes only to a model that takes it
        kwargs = {k: v for k, v in kwargs.items() if not (k in DATA_OPTIONS and v is None)}
        foreign = tv_models.data_options if preset.name.startswith(tv_models.TV_PREFIX) else data_options
        accepted = foreign(preset.name)
    for key in ("img_size", "in_chans", "num_classes"):
        if key in accepted:
            kwargs.setdefault(key, info[key])
    if kwargs.get("img_size", info["img_size"]) != info["img_size"]:
        raise ConfigError(
            f"model.img_size={kwargs['img_size']} but the data gives {info['img_size']}x{info['img_size']} images; "
            "set data.img_size to resize the data instead"
        )
    if isinstance(kwargs.get("num_classes"), int) and kwargs["num_classes"] < info["num_classes"]:
        raise ConfigError(
            f"model.num_classes={kwargs['num_classes']} but the data has {info['num_classes']} classes (labels "
            f"0..{info['num_classes'] - 1}); unset model.num_classes (it is taken from the data) or set it to "
            f"{info['num_classes']}"
        )
    return kwargs


def check_first_batch_fits(name: str, kwargs: dict[str, Any], batch_size: int) -> None:
    """Refuse an input whose first batch cannot fit in this machine's memory, before the model is built.

    The estimate counts only what a ViT-like model surely holds: the position embedding ``[N, C]`` (with its
    gradient and two AdamW moments), one batch of tokens ``[B, N, C]`` and the batch of images ``[B, C_in, S, S]``,
    in float32, for ``N = (S / patch)^2`` tokens of width ``C = embed_dim``. Presets without those options are not
    checked.
    """
    resolved = {**get_preset(name).kwargs, **kwargs}
    size, patch, width = (resolved.get(key) for key in ("img_size", "patch_size", "embed_dim"))
    width = width[0] if isinstance(width, list | tuple) and width else width
    if not all(isinstance(v, int) and v > 0 for v in (size, patch, width)):
        return
    tokens = (size // patch) ** 2
    needed = 4 * (tokens * width * (4 + batch_size) + batch_size * resolved.get("in_chans", 3) * size * size)
    try:
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if needed > available:
        raise ConfigError(
            f"{size}x{size} images in {patch}x{patch} patches give {tokens:,} tokens of width {width} an image: the "
            f"first batch of {batch_size} needs at least {needed / 2**30:,.0f} GiB, more than this machine's "
            f"{available / 2**30:.0f} GiB; choose a smaller data.img_size or a larger model.patch_size"
        )


def check_schedule(cfg: RunConfig, *, validate: bool) -> None:
    """``plateau`` and early stopping follow the validation metrics: refused without a validation set."""
    if not validate and (cfg.optim.schedule == "plateau" or cfg.finetune.early_stopping_patience is not None):
        raise ConfigError(
            "data.val_fraction=0 leaves no validation set, but optim.schedule=plateau and "
            "finetune.early_stopping_patience follow the validation metrics; set data.val_fraction > 0"
        )


def warmup_warning(cfg: RunConfig) -> str | None:
    """A warning for a new run whose cosine warm-up is longer than the run: its rate rises the whole run, never
    reaches ``optim.lr``, and its cosine never starts (a resume then goes on warming up:
    :func:`vitlab.training.resume.schedule_note`). A quick look at a config (one epoch of ``vit/digits``) is one."""
    optim, epochs = cfg.optim, cfg.trainer.max_epochs
    if optim.schedule != "cosine" or not epochs or optim.warmup_epochs <= epochs:
        return None
    return (
        f"warning: optim.warmup_epochs={optim.warmup_epochs:g} is longer than trainer.max_epochs={epochs}: the rate "
        f"rises the whole run to {optim.lr * epochs / optim.warmup_epochs:.2g}, never reaching optim.lr="
        f"{optim.lr:g}, and the cosine never starts; set optim.warmup_epochs below {epochs} for a full schedule"
    )


def check_resume_matches(cfg: RunConfig, kwargs: dict[str, Any], stored: dict[str, Any], ckpt: Path) -> None:
    """``--resume``: the model this config builds must be the checkpoint's (same preset, same constructor
    arguments); checked before any file is touched, so a wrong ``--config`` or ``model.*`` override cannot
    damage the run."""
    import json

    def normal(value: Any) -> Any:
        return json.loads(json.dumps(to_dict(value), sort_keys=True, default=str))

    was, now = stored["config"]["model"]["name"], cfg.model["name"]
    differences = [f"model.name (checkpoint {was}, now {now})"] if was != now else []
    old, new = normal(stored["model_kwargs"]), normal(kwargs)
    for key in sorted(set(old) | set(new)):
        if was == now and old.get(key) != new.get(key):
            differences.append(f"model.{key} (checkpoint {old.get(key)!r}, now {new.get(key)!r})")
    if differences:
        raise RunDirError(
            f"--resume {ckpt}: the checkpoint does not match this config: {'; '.join(differences)}. Resume with the "
            "run's own config (`vitlab fit --resume RUN`, without --config or model.* overrides), or start a new run "
            "with another run.dir; nothing was written"
        )


def changed_settings(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, list[Any]]:
    """``{"trainer.max_epochs": [3, 5], ...}``: the dotted keys whose values differ between two config dicts."""
    changed: dict[str, list[Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed |= changed_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            changed[f"{prefix}{key}"] = [a, b]
    return changed

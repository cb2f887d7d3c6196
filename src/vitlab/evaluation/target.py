"""What an evaluation evaluates: the model at a path (a run directory, an export folder or a ``.ckpt``) with the data
it was trained on, normalised as it was trained (:func:`load_evaluation_target`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.config import DataConfig, deep_merge, from_dict, parse_overrides, to_dict
from vitlab.data import VisionDataModule, build_datamodule
from vitlab.errors import ConfigError
from vitlab.export import load_model, model_from_checkpoint
from vitlab.rundir import EVALUATION_DIR, EXPORT_CONFIG_FILE, RunDir, locate_model, read_json


@dataclass
class EvaluationTarget:
    """A model ready to evaluate with its data: what :func:`load_evaluation_target` finds at a path.

    ``mean`` / ``std`` are the normalisation the model was trained with; ``out_dir`` the default output folder;
    ``run_model`` the run's :meth:`~vitlab.rundir.RunDir.model_state` when it was loaded (None without a run).
    """

    model: nn.Module
    datamodule: VisionDataModule
    mean: tuple[float, ...]
    std: tuple[float, ...]
    out_dir: Path
    source: Path
    train_hflip: bool
    run_model: str | None = None


def _data_overrides(overrides: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    """``["batch_size=32", "augment.hflip=true"]`` or ``{"batch_size": 32, "augment.hflip": True}`` -> nested."""
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        nested: dict[str, Any] = {}
        for key, value in overrides.items():
            *parents, leaf = key.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested
    return parse_overrides([overrides] if isinstance(overrides, str) else list(overrides))


def load_evaluation_target(
    path: str | Path,
    data_overrides: Mapping[str, Any] | Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    model_overrides: Mapping[str, Any] | None = None,
) -> EvaluationTarget:
    """Load the model at ``path`` (run directory, export folder or ``.ckpt``) and the data module it was trained on.

    The data config comes from the run's ``config.yaml`` (or the checkpoint's stored config, or, for a lone export,
    ``DataConfig(name=<dataset in config.json>)``), with ``data_overrides`` (keys of the ``data`` section) applied.
    The output folder defaults to ``<run>/evaluation`` (``<export>/evaluation`` for a lone export).
    ``model_overrides``: constructor options that leave the weights alone (``{"tome_r": 8}``); see
    :func:`vitlab.export.load_model`.
    """
    location = locate_model(path)
    run_dir, source = location.run_dir, location.source
    stored_data: dict[str, Any] | None = None
    if source.is_dir():
        model = load_model(source, map_location=device, overrides=dict(model_overrides or {}))
        info = read_json(source / EXPORT_CONFIG_FILE).get("data") or {}
    else:
        model, hparams = model_from_checkpoint(source, dict(model_overrides or {}))
        model = model.to(device).eval()
        info, stored_data = hparams["data_info"], hparams["config"].get("data")
    data_cfg = _trained_data(run_dir, stored_data, info, source)
    data_cfg = from_dict(DataConfig, deep_merge(data_cfg, _data_overrides(data_overrides)), "data")
    datamodule = build_datamodule(data_cfg)
    _check_data_fits(info, datamodule)
    mean = tuple(info["mean"]) if "mean" in info else datamodule.mean
    std = tuple(info["std"]) if "std" in info else datamodule.std
    out_dir = (run_dir if run_dir is not None else source if source.is_dir() else source.parent) / EVALUATION_DIR
    run_model = RunDir(run_dir).model_state() if run_dir is not None else None
    return EvaluationTarget(model, datamodule, mean, std, out_dir, source, data_cfg.augment.hflip, run_model)


def _trained_data(
    run_dir: Path | None, stored_data: dict[str, Any] | None, info: dict[str, Any], source: Path
) -> dict[str, Any]:
    """The ``data`` section the model was trained with: the run's ``config.yaml``, else the checkpoint's stored
    config, else the dataset an export's ``config.json`` names."""
    if run_dir is not None:
        return to_dict(RunDir(run_dir).config().data)
    if stored_data is not None:
        return stored_data
    if "dataset" in info:
        return {"name": info["dataset"]}
    raise ConfigError(
        f"{source} does not say which dataset it was trained on; pass the run directory, or name the data "
        "with --data name=<dataset>"
    )


def _check_data_fits(info: dict[str, Any], datamodule: VisionDataModule) -> None:
    """The data gives the class count, channels and image size the model was trained with (``info``)."""
    for key, data_value in (
        ("num_classes", datamodule.num_classes),
        ("in_chans", datamodule.in_chans),
        ("img_size", datamodule.img_size),
    ):
        if key in info and info[key] != data_value:
            fix = f"img_size={info[key]}" if key == "img_size" else f"name={info.get('dataset', '<dataset>')}"
            raise ConfigError(
                f"the model was trained with {key}={info[key]} but the data gives {key}={data_value}; evaluate on "
                f"the data it was trained on (--data {fix})"
            )

"""Exported models: ``model.safetensors`` + ``config.json``, rebuilt offline with no pickle.

``config.json`` names the preset and holds the full constructor arguments, so a later vitlab rebuilds the same
network even if the preset's defaults change, and the SHA-256 of ``model.safetensors`` (``weights_sha256``), which
:func:`load_model` checks: safetensors checks the header, not the bytes of the tensors, so a flipped byte would
otherwise load. Checkpoints are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_model as st_save_model
from torch import nn

from vitlab import manifest
from vitlab.atomic import atomic_write_text, check_not_foreign, publish_files, staging_folder
from vitlab.errors import CheckpointError, ConfigError, VitlabError
from vitlab.layers.heads import state_in_original_order
from vitlab.models.builder import create_model
from vitlab.models.protocols import PretrainedConfigured
from vitlab.models.registry import get_preset
from vitlab.rundir import (
    CHECKPOINTS_DIR,
    EXPORT_CONFIG_FILE,
    EXPORT_DIR,
    EXPORT_FORMAT_FILES,
    EXPORT_WEIGHTS_FILE,
    locate_model,
)

EXPORT_FORMAT = "vitlab-export/1"


def _first_sentence(text: str) -> str:
    """The first sentence of an error message (torch's reader errors run on for several sentences)."""
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    end = line.find(". ")
    return line[: end if end > 0 else len(line)].rstrip(".")


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; a device this machine does not have (CUDA without a GPU, ``cuda:2`` with
    two GPUs, MPS off a Mac) is a :class:`ConfigError` that says so."""
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"unknown device {str(device)!r}; use cpu, cuda, cuda:1 or mps") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("CUDA is not available on this machine; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"device {device} asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("MPS is not available on this machine; use --device cpu")
    return device


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def checksum_file(path: str | Path) -> Path:
    """The SHA-256 sidecar of a checkpoint, ``best.ckpt`` -> ``best.ckpt.sha256``, in ``sha256sum``'s format."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def write_checksum(path: str | Path) -> None:
    """Write the sidecar of ``path`` (:func:`checksum_file`), atomically."""
    atomic_write_text(checksum_file(path), f"{file_sha256(path)}  {Path(path).name}\n")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a Lightning checkpoint safely (``weights_only=True``), with a clear error when it is unusable. A
    checkpoint with a sidecar (:func:`checksum_file`; ``vitlab fit`` writes one) must match it: ``torch.load``
    checks the archive's layout, not the bytes of the tensors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass a run directory or a .ckpt file (runs/<run>/checkpoints/last.ckpt)"
        )
    sidecar = checksum_file(path)
    if sidecar.is_file() and sidecar.read_text().split()[:1] != [file_sha256(path)]:
        raise CheckpointError(
            f"checkpoint {path} is corrupt (checksum mismatch with {sidecar.name}): use another checkpoint of the run "
            "(checkpoints/best.ckpt or last.ckpt) or train again"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated / foreign files
        raise CheckpointError(
            f"checkpoint {path} cannot be read: the file is corrupt, truncated or not a checkpoint "
            f"({type(e).__name__}: {_first_sentence(str(e))}). Use another checkpoint of the run "
            "(checkpoints/best.ckpt or last.ckpt) or train again"
        ) from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a vitlab/Lightning checkpoint (no 'state_dict' entry)")
    return ckpt


def checkpoint_hparams(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``{"config", "model_kwargs", "data_info"}`` as ``vitlab fit`` stored them in the checkpoint."""
    hp = ckpt.get("hyper_parameters") or {}
    if not {"config", "model_kwargs", "data_info"} <= set(hp):
        raise CheckpointError("checkpoint has no vitlab config in its hyper_parameters; was it written by vitlab fit?")
    return hp


def _rebuild_kwargs(preset: str, stored: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The stored constructor arguments with ``overrides`` applied, which must leave every weight's shape alone.

    Options such as ``tome_r`` (merging at inference) or ``drop_rate`` change how trained weights are used, not
    which weights there are; one that changes the weights (``embed_dim``, ``depth``) is an error.
    """
    if not overrides:
        return stored
    kwargs = {**stored, **overrides}
    with torch.device("meta"):  # shapes only
        before = {k: v.shape for k, v in create_model(preset, **stored).state_dict().items()}
        after = {k: v.shape for k, v in create_model(preset, **kwargs).state_dict().items()}
    if before != after:
        changed = sorted(set(before) ^ set(after) | {k for k in set(before) & set(after) if before[k] != after[k]})
        options = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        raise ConfigError(
            f"{options} changes the weights of {preset} ({len(changed)} tensors differ, e.g. {changed[0]}), so the "
            "trained weights cannot be loaded into it; only options that leave the weights alone (such as tome_r, "
            "drop_rate) can be changed on a trained model"
        )
    return kwargs


def model_from_checkpoint(
    path: str | Path, overrides: dict[str, Any] | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the trained model of a checkpoint. Returns ``(model, hparams)``.

    Heads that training reordered (frozen heads, ViTCAE eq. 26) are put back in original order
    (:func:`vitlab.layers.heads.state_in_original_order`): the rebuilt model is a plain one.

    ``overrides``: constructor options to change that leave the weights alone, e.g. ``{"tome_r": 8}``.
    """
    return model_from_loaded_checkpoint(read_checkpoint(path), overrides)


def model_from_loaded_checkpoint(
    ckpt: dict[str, Any], overrides: dict[str, Any] | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """:func:`model_from_checkpoint` of a checkpoint already read (:func:`read_checkpoint`), for a caller that also
    reads the rest of it. Returns ``(model, hparams)``."""
    hp = checkpoint_hparams(ckpt)
    name = hp["config"]["model"]["name"]
    model = create_model(name, **_rebuild_kwargs(name, hp["model_kwargs"], overrides))
    state = {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state_in_original_order(model, state))
    _record_normalisation(model, hp.get("data_info"))
    return model, hp


def _record_normalisation(model: nn.Module, info: dict[str, Any] | None) -> None:
    """The data's mean and std into the model's ``pretrained_cfg`` (timm's contract), when both are known."""
    if info and info.get("mean") and isinstance(model, PretrainedConfigured):
        model.pretrained_cfg = {"mean": info["mean"], "std": info["std"]}


#: the files :func:`export_model` writes; ``force=True`` replaces these and leaves anything else in the folder alone
EXPORT_FILES = (EXPORT_WEIGHTS_FILE, EXPORT_CONFIG_FILE)


class ExportError(VitlabError, FileExistsError):
    """The export folder cannot be written as asked (it holds other files, or it is not a folder)."""


def default_export_dir(checkpoint: str | Path) -> Path:
    """``<run>/export`` of the run that owns a checkpoint, the folder that holds its ``checkpoints/``. A checkpoint
    elsewhere has no run to export into: a :class:`ConfigError` asks for a folder."""
    checkpoint = Path(checkpoint)
    if checkpoint.parent.name != CHECKPOINTS_DIR:
        raise ConfigError(
            f"{checkpoint} is not in a run's {CHECKPOINTS_DIR}/ folder, so it has no <run>/{EXPORT_DIR} to export to; "
            "pass --out FOLDER"
        )
    return checkpoint.parent.parent / EXPORT_DIR


def _check_force(out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """What ``--force`` may do in ``out_dir``, which holds files: refused, naming them, when a file at a name the
    export writes (:data:`EXPORT_FILES`, and the deployment file of each of ``formats``) is not one an export wrote
    there (the folder's manifest does not name it: a folder without one is the user's), or when one would be
    replaced through a symbolic link (the output rule of every command, :func:`vitlab.atomic.check_not_foreign`).
    Returns the deployment files (``model.onnx``, ``model.pt2``) an earlier export wrote, which hold the earlier
    weights and go."""
    names = (*EXPORT_FILES, *(name for fmt, name in EXPORT_FORMAT_FILES.items() if fmt in formats))
    earlier = [out_dir / n for n in EXPORT_FORMAT_FILES.values() if manifest.is_recorded(out_dir / n)]
    for path in [*(out_dir / n for n in names), *earlier]:
        check_not_foreign(path)
    theirs = [n for n in names if (out_dir / n).exists() and not manifest.is_recorded(out_dir / n)]
    if theirs:
        why = f"its {manifest.MANIFEST_FILE} does not name them" if manifest.has_manifest(out_dir) else "no manifest"
        raise ExportError(
            f"export folder {out_dir} holds {', '.join(theirs)}, which vitlab did not write ({why}); move "
            f"{'them' if len(theirs) > 1 else 'it'} elsewhere or pass another --out (--force replaces only the files "
            "an export wrote there)"
        )
    return earlier


def export_model(
    model: nn.Module,
    out_dir: str | Path,
    extra: dict[str, Any] | None = None,
    *,
    force: bool = False,
    formats: Sequence[str] = (),
) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``out_dir``, never deleting a file of the user's.

    A new or empty ``out_dir`` is staged in a temporary folder beside it and renamed into place, so a reader sees
    the whole export or none. A folder that already holds files is refused, unless ``force``: then the export's
    own files (:data:`EXPORT_FILES`) are replaced, each atomically, and the ``model.onnx`` / ``model.pt2`` an
    earlier export wrote (named in the folder's manifest) are removed, being another model's; the folder's other
    files stay. A file at one of the export's names that no export wrote (a folder without a manifest is the
    user's), or a file replaced through a symbolic link, is refused before anything is written (:func:`_check_force`).
    ``formats``: the deployment formats written next (``vitlab export --format``), whose files are checked too.
    """
    out_dir = Path(out_dir).expanduser().absolute()
    if not hasattr(model, "preset"):
        raise ValueError("only models built with vitlab.create_model can be exported (they record their preset)")
    existing = _existing_files(out_dir, force)
    earlier = _check_force(out_dir, formats) if existing else []
    if out_dir.is_symlink():  # checked: nothing is replaced through it; staged beside the folder it points to
        out_dir = out_dir.resolve()
    meta = {
        "format": EXPORT_FORMAT,
        "model": model.preset,
        "architecture": type(model).__name__,
        "kwargs": model.init_kwargs,
        **(extra or {}),
    }
    try:
        with staging_folder(out_dir) as stage:
            for folder in (stage, out_dir) if existing else (stage,):  # the export names its own files
                manifest.start(folder, note=False)
            _save_weights(model, stage / EXPORT_WEIGHTS_FILE)
            meta["weights_sha256"] = file_sha256(stage / EXPORT_WEIGHTS_FILE)
            atomic_write_text(stage / EXPORT_CONFIG_FILE, json.dumps(meta, indent=2, default=str))
            publish_files(stage, out_dir, EXPORT_FILES, whole=not existing)
        for path in earlier:
            path.unlink(missing_ok=True)
            manifest.note_removed(path)
    except OSError as e:  # a full disk, a read-only folder: name the export, not its hidden staging folder
        if isinstance(e, VitlabError):
            raise
        raise OSError(e.errno, e.strerror, str(out_dir)) from e
    return out_dir


def _existing_files(out_dir: Path, force: bool) -> list[str]:
    """The names in ``out_dir`` (``[]`` for a new folder); a file there, or a folder with files and no ``force``, is
    an :class:`ExportError`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"export folder {out_dir} is a file, not a folder; pass --out a new or empty folder")
    existing = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if existing and not force:
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise ExportError(
            f"export folder {out_dir} is not empty ({shown}); pass a new or empty folder to --out, or --force to "
            f"replace only the export's own files ({', '.join(EXPORT_FILES)})"
        )
    return existing


def _save_weights(model: nn.Module, path: Path) -> None:
    """``safetensors.torch.save_model``, whose I/O errors (a full disk) come as a ``SafetensorError`` quoting the
    operating system's error number: raised as the ``OSError`` it is, which the command line says in one line."""
    try:
        st_save_model(model, str(path))
    except SafetensorError as e:
        code = re.search(r"(?:os error |code: )(\d+)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from e


def _check_weights(weights: Path, sha256: str | None) -> None:
    """The export's weights file has the checksum its ``config.json`` records (none recorded: nothing to check)."""
    if sha256 is not None and weights.is_file() and file_sha256(weights) != sha256:
        raise CheckpointError(f"{weights} is corrupt (checksum mismatch): export the model again")


def _numbers(value: Any, key: str) -> Iterator[tuple[str, float]]:
    """Every number in a JSON value, with its dotted key (``data.mean[0]``)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield key, value


def _config_problem(meta: dict[str, Any], model: nn.Module | None) -> str | None:
    """What is wrong with the numbers of an export's ``config.json``, naming the key, or None."""
    for key, number in _numbers(meta, ""):
        if not math.isfinite(number):
            return f"has {key} = {number}, not a finite number"
    data = meta.get("data") or {}
    known = {"num_classes": getattr(model, "num_classes", None), **getattr(model, "init_kwargs", {})}
    for key in ("num_classes", "in_chans", "img_size"):
        if key in data and known.get(key) is not None and data[key] != known[key]:
            return f"has data.{key} = {data[key]}, but the model has {known[key]}"
    chans = known.get("in_chans", data.get("in_chans"))
    for key in ("mean", "std"):
        values = data.get(key)
        if values is not None and (
            not isinstance(values, list)
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            or (chans is not None and len(values) != chans)
        ):
            return f"has data.{key} = {values}, not one number per input channel ({chans})"
    if any(s <= 0 for s in data.get("std") or []):
        return f"has data.std = {data['std']}, which must be > 0 for every channel"
    return None


def check_export_config(meta: dict[str, Any], model: nn.Module | None, cfg_file: Path) -> None:
    """Every number of an export's ``config.json`` is finite; its ``data`` section (the normalisation and the
    geometry that ``vitlab predict`` and ``evaluate`` read) fits the model: one mean and one std > 0 per input
    channel, and the model's ``num_classes``, ``in_chans`` and ``img_size``. A :class:`CheckpointError` names the
    key (a NaN mean or a zero std makes every prediction NaN). ``model`` None: the numbers and the ``data``
    section alone, before the model is built from them."""
    problem = _config_problem(meta, model)
    if problem:
        raise CheckpointError(f"{cfg_file} {problem}; it was edited or damaged: export the model again")


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu", overrides: dict[str, Any] | None = None
) -> nn.Module:
    """Rebuild a model offline from an exported folder, a run directory, or a ``.ckpt`` file; eval mode.

    The exported weights are read by safetensors (no pickle); checkpoints by ``torch.load(weights_only=True)``.
    Heads that training reordered (frozen heads) are put back in original order, as in :func:`model_from_checkpoint`.
    ``overrides``: constructor options to change that leave the weights alone, e.g. ``{"tome_r": 8}`` to merge
    tokens at inference in a ViT trained without merging (an option that changes the weights is a ``ConfigError``).
    """
    check_device(map_location)
    location = locate_model(path)  # one rule for a run directory, an export folder and a checkpoint
    path = location.source
    if location.is_export:
        cfg_file = path / EXPORT_CONFIG_FILE
        try:
            meta = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{cfg_file} is not valid JSON ({e}); export the model again") from e
        if meta.get("format") != EXPORT_FORMAT:
            raise CheckpointError(f"{cfg_file} is not a vitlab export (format {meta.get('format')!r})")
        get_preset(meta["model"])
        check_export_config(meta, None, cfg_file)  # before the numbers build anything
        model = create_model(meta["model"], **_rebuild_kwargs(meta["model"], meta["kwargs"], overrides))
        weights = path / EXPORT_WEIGHTS_FILE
        _check_weights(weights, meta.get("weights_sha256"))  # an export older than the checksum has none
        try:
            state = st_load_file(str(weights), device=str(map_location))
        except FileNotFoundError as e:
            raise CheckpointError(f"{weights} is missing; export the model again") from e
        except Exception as e:
            reason = _first_sentence(str(e))
            raise CheckpointError(
                f"{weights} cannot be read ({reason}); the file is corrupt: export the model again"
            ) from e
        try:
            model.load_state_dict(state_in_original_order(model, state), strict=True)
        except (RuntimeError, KeyError) as e:  # torch lists every mismatch, one per line after a header line
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            detail = lines[min(1, len(lines) - 1)].rstrip(".")
            raise CheckpointError(
                f"{weights} does not fit the model {cfg_file.name} describes ({detail}); "
                f"{cfg_file.name} was edited, or the two files come from different exports: export the model again"
            ) from e
        check_export_config(meta, model, cfg_file)  # the data section against the model the weights fit
        _record_normalisation(model, meta.get("data"))
        return model.eval()
    model, _ = model_from_checkpoint(path, overrides)
    return model.to(map_location).eval()

"""Weights of an HF transformers ``save_pretrained`` folder into an ``hf:TYPE`` model (``model.pretrained=PATH``, or
``model.name=hf:PATH``), read from this disk only, by transformers' ``from_pretrained(local_files_only=True)`` (which
knows its files, shards and the renamed keys of older checkpoints) with ``ignore_mismatched_sizes``. The network is
the folder's (:func:`pretrained_options`: its ``config.json``'s keys, under the ``model.*`` keys the config sets); the
classifier is re-sized to the data's classes (fresh), said in one line; any other missing, extra or mis-shaped tensor
is a :class:`PretrainedWeightsError` that names the options that differ.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.config.hf_model import hf_folder
from vitlab.models.hf_models import HFImageClassifier, folder_options, hf_model_type, option_names
from vitlab.models.pretrained import LoadReport, PretrainedWeightsError, compress_keys

log = logging.getLogger(__name__)

#: where transformers' image classifiers keep their classifier
CLASSIFIER = "classifier."


def pretrained_options(name: str, pretrained: str | Path) -> dict[str, Any]:
    """The network options of the folder ``pretrained`` for the model ``hf:TYPE`` (the folder must hold one)."""
    model_type = hf_model_type(name)
    folder, config = hf_folder(pretrained)
    if config["model_type"] != model_type:
        raise PretrainedWeightsError(
            f"model.pretrained={folder} holds a {config['model_type']} model, not hf:{model_type}; set "
            f"model.name=hf:{config['model_type']} (or model.name=hf:{folder})"
        )
    return folder_options(model_type, config)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and load report off (vitlab says what it loaded in one line), then as they were."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _read_folder(folder: Path, model: HFImageClassifier) -> tuple[nn.Module, dict[str, Any]]:
    """The folder's model, built with ``model``'s config, and transformers' loading info; one line if unreadable."""
    from transformers import AutoModelForImageClassification

    try:
        with _quiet_transformers():
            return AutoModelForImageClassification.from_pretrained(
                folder,
                config=model.hf.config,
                local_files_only=True,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
    except Exception as e:  # OSError without a weights file; safetensors and torch errors for a damaged one
        first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise PretrainedWeightsError(
            f"the weights of {folder} cannot be read ({type(e).__name__}: {first}); pass a folder written by "
            "save_pretrained, with its model.safetensors (or pytorch_model.bin)"
        ) from e


def load_hf_pretrained(model: HFImageClassifier, source: str | Path) -> LoadReport:
    """Load the folder ``source`` into ``model`` strictly, but for its classifier; ``model`` untouched on an error."""
    if not isinstance(model, HFImageClassifier):
        raise PretrainedWeightsError(f"{type(model).__name__} is no hf: model; a save_pretrained folder needs one")
    folder, config = hf_folder(source)
    loaded, info = _read_folder(folder, model)
    report = LoadReport(str(folder))
    mismatched = {key: theirs for key, theirs, _ in info["mismatched_keys"]}
    problems = [
        *(f"{k} missing" for k in info["missing_keys"] if not k.startswith(CLASSIFIER)),
        *(f"{k} unexpected" for k in info["unexpected_keys"]),
        *(f"{k} of shape {list(v)}" for k, v in mismatched.items() if not k.startswith(CLASSIFIER)),
    ]
    if problems:
        names = set(option_names(config["model_type"]).values())
        ours = model.hf.config
        differ = [
            f"{k}={v} (the model's {getattr(ours, k, None)})"
            for k, v in config.items()
            if k in names and getattr(ours, k, None) != v
        ]
        why = f" The folder's config differs in {', '.join(differ)}." if differ else ""
        raise PretrainedWeightsError(
            f"the weights of {folder} do not fit the hf:{ours.model_type} model built "
            f"({compress_keys(problems, 3)}).{why} Leave the folder's options unset (model.* keys), or resize the "
            "data to its image_size (data.img_size)"
        )
    state = loaded.state_dict()
    fresh = {k: v for k, v in model.hf.state_dict().items() if k.startswith(CLASSIFIER)}
    if any(k.startswith(CLASSIFIER) for k in [*mismatched, *info["missing_keys"]]):
        old = next((v[0] for k, v in mismatched.items() if k.endswith("weight")), 0)
        state |= fresh
        report.adapted.append(f"classifier re-sized from {old} to {model.num_classes} classes")
    model.hf.load_state_dict(state, strict=True)
    model.pretrained_summary = report.summary()
    log.info(model.pretrained_summary)
    return report

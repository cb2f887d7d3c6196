"""Weights of an HF transformers ``save_pretrained`` folder into an ``hf:TYPE`` model (``model.pretrained=PATH``, or
``model.name=hf:PATH``), read from this disk only: ``model.safetensors``, ``pytorch_model.bin`` (``torch.load`` with
``weights_only=True``) or a sharded ``model.safetensors.index.json``. The network is the folder's
(:func:`pretrained_options`: its ``config.json``'s keys, under the ``model.*`` keys the config sets); the classifier
is re-sized to the data's classes (fresh, as ``ignore_mismatched_sizes`` does), said in one line; any other missing,
extra or mis-shaped tensor is a :class:`PretrainedWeightsError` that names the options that differ.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from vitlab.config.hf_model import hf_folder
from vitlab.models.hf_models import HFImageClassifier, folder_options, hf_model_type
from vitlab.models.pretrained import LoadReport, PretrainedWeightsError, key_problems, read_weights

log = logging.getLogger(__name__)

#: the single-file weights ``save_pretrained`` writes, in the order they are looked for
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEX = "model.safetensors.index.json"
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


def folder_state(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of a ``save_pretrained`` folder and the file they came from."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return read_weights(folder / name)
    index = folder / SHARD_INDEX
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state |= read_weights(folder / shard)[0]
        return state, str(index)
    raise PretrainedWeightsError(
        f"{folder} holds no {', '.join(WEIGHT_FILES)} or {SHARD_INDEX}; pass a folder written by save_pretrained"
    )


def _fit_classifier(state: dict[str, torch.Tensor], model: HFImageClassifier, report: LoadReport) -> None:
    """A classifier of another size, or none, replaced by the model's fresh one (``ignore_mismatched_sizes``)."""
    target = model.hf.state_dict()
    theirs = {k: v for k, v in state.items() if k.startswith(CLASSIFIER)}
    if theirs and all(k in target and v.shape == target[k].shape for k, v in theirs.items()):
        return
    old = next((v.shape[0] for k, v in theirs.items() if k.endswith("weight")), 0)
    for key in theirs:
        del state[key]
    state |= {k: v for k, v in target.items() if k.startswith(CLASSIFIER)}
    report.adapted.append(f"classifier re-sized from {old} to {model.num_classes} classes")


def load_hf_pretrained(model: HFImageClassifier, source: str | Path) -> LoadReport:
    """Load the folder ``source`` into ``model`` strictly, but for its classifier; ``model`` untouched on an error."""
    if not isinstance(model, HFImageClassifier):
        raise PretrainedWeightsError(f"{type(model).__name__} is no hf: model; a save_pretrained folder needs one")
    folder, config = hf_folder(source)
    state, description = folder_state(folder)
    report = LoadReport(description)
    prefix = model.hf.base_model_prefix
    if prefix and not any(k.startswith(prefix + ".") for k in state):  # the base model saved alone
        state = {f"{prefix}.{k}": v for k, v in state.items()}
    _fit_classifier(state, model, report)
    target = model.hf.state_dict()
    problems = key_problems(state, target)
    if problems:
        ours = model.hf.config
        differ = [
            f"{key}={value} (the model's {getattr(ours, key)})"
            for key, value in config.items()
            if key in vars(ours) and key != "num_labels" and not isinstance(value, dict) and getattr(ours, key) != value
        ]
        why = f" The folder's config differs in {', '.join(differ)}." if differ else ""
        raise PretrainedWeightsError(
            f"the weights of {folder} do not fit the hf:{ours.model_type} model built: {'; '.join(problems)}.{why} "
            "Leave the folder's options unset (model.* keys), or resize the data to its image_size (data.img_size)"
        )
    model.hf.load_state_dict({k: v.to(dtype=target[k].dtype) for k, v in state.items()}, strict=True)
    model.pretrained_summary = report.summary()
    log.info(model.pretrained_summary)
    return report

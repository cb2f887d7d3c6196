"""``vitlab export --format``: the deployment format written beside ``model.safetensors`` + ``config.json``.

Examples::

    vitlab export runs/vit-digits-20261130-101500 --format onnx
"""

from __future__ import annotations

from pathlib import Path


def write_extra_format(model, out: Path, fmt: str, hparams: dict) -> None:
    """After the safetensors export: the ``--format`` file, checked on a batch of the run's validation images when
    its data is at hand (and on built inputs), with a line saying what was written and what it was checked on."""
    from vitlab.export_formats import check_inputs, validation_images, write_format

    if fmt == "safetensors":
        return
    images = validation_images(model, hparams["config"].get("data") or {}, hparams.get("data_info") or {})
    path, diff = write_format(model, out, fmt, images)
    on = f"{len(check_inputs(model))} built inputs"
    on = f"{len(images)} of the run's validation images and {on}" if images is not None else f"{on} (no run data)"
    print(f"wrote {path} (dynamic batch; on {on}, max |logits - model's| = {diff:.1e})")

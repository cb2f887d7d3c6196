"""``vitlab export --format``: the deployment format written beside ``model.safetensors`` + ``config.json``.

Examples::

    vitlab export runs/vit-digits-20261130-101500 --format onnx
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_format_option(p: argparse.ArgumentParser) -> None:
    """``vitlab export --format``: the deployment format written beside model.safetensors + config.json."""
    from vitlab.export_formats import FORMATS

    p.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="also write model.onnx (checked against onnxruntime) or model.pt2 (torch.export); dynamic batch",
    )


def write_extra_format(model, out: Path, fmt: str) -> None:
    """After the safetensors export: the ``--format`` file, with a line saying what was written."""
    from vitlab.export_formats import CHECK_BATCH, write_format

    written = write_format(model, out, fmt)
    if written is not None:
        path, diff = written
        print(f"wrote {path} (dynamic batch; on a batch of {CHECK_BATCH}, max |logits - model's| = {diff:.1e})")

"""Exported models: the public names, the weights' checksum, the device check."""

import json

import pytest
import torch

import vitlab
import vitlab.export
from tests.model_fixtures import tiny_vit
from vitlab.errors import CheckpointError, ConfigError
from vitlab.export import export_model, load_model


def test_export_model_is_a_top_level_name():
    assert vitlab.export_model is vitlab.export.export_model
    assert "export_model" in vitlab.__all__ and "export_model" in dir(vitlab)


def _flip_a_tensor_byte(weights):
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # the last tensor's bytes: the header stays valid, so safetensors reads it
    weights.write_bytes(bytes(data))


def test_a_corrupted_export_is_refused_by_its_checksum(tmp_path):
    out = export_model(tiny_vit().eval(), tmp_path / "export")
    _flip_a_tensor_byte(out / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors is corrupt \(checksum mismatch\): export the model"):
        load_model(out)


def test_an_export_without_a_checksum_still_loads(tmp_path):
    model = tiny_vit().eval()
    out = export_model(model, tmp_path / "export")
    meta = json.loads((out / "config.json").read_text())
    assert len(meta.pop("weights_sha256")) == 64
    (out / "config.json").write_text(json.dumps(meta))  # as an export written before the checksum
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(load_model(out)(x), model(x))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_says_so(tmp_path):
    out = export_model(tiny_vit().eval(), tmp_path / "export")
    with pytest.raises(ConfigError, match=r"^CUDA is not available on this machine; use --device cpu$"):
        load_model(out, map_location="cuda")

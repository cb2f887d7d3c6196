"""Exported models: the public names, the device check."""

import pytest
import torch

import vitlab
import vitlab.export
from tests.model_fixtures import tiny_vit
from vitlab.errors import ConfigError
from vitlab.export import export_model, load_model


def test_export_model_is_a_top_level_name():
    assert vitlab.export_model is vitlab.export.export_model
    assert "export_model" in vitlab.__all__ and "export_model" in dir(vitlab)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_says_so(tmp_path):
    out = export_model(tiny_vit().eval(), tmp_path / "export")
    with pytest.raises(ConfigError, match=r"^CUDA is not available on this machine; use --device cpu$"):
        load_model(out, map_location="cuda")

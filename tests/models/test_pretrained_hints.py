"""Pretrained weights that cannot load say what to do at once: offline hub loading fails before any download
attempt when ``HF_HUB_OFFLINE`` is set, and weights of another width name the preset whose shapes they have."""

from __future__ import annotations

import huggingface_hub
import pytest
import timm

import vitlab
from vitlab.export import export_model
from vitlab.models.pretrained import PretrainedWeightsError


def test_hf_hub_offline_fails_at_once_and_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as if set after huggingface's import
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))

    def no_download(*args, **kwargs):
        raise AssertionError("timm was asked to download although HF_HUB_OFFLINE is set")  # fails the message check

    monkeypatch.setattr(timm, "create_model", no_download)
    with pytest.raises(PretrainedWeightsError) as err:
        vitlab.create_model(
            "vit_tiny", img_size=224, patch_size=16, pretrained="timm:vit_tiny_patch16_224.augreg_in21k"
        )
    message = str(err.value)
    assert "HF_HUB_OFFLINE is set" in message and "model.pretrained=/path/to/model.safetensors" in message
    assert "huggingface.co/timm/vit_tiny_patch16_224.augreg_in21k" in message


def test_weights_of_another_width_suggest_the_preset_they_fit(tmp_path):
    source = vitlab.create_model("vit_nano", img_size=8, patch_size=2, in_chans=1, num_classes=10)
    export_model(source, tmp_path / "nano")
    with pytest.raises(PretrainedWeightsError, match=r"They have the shapes of vit_nano: set model\.name=vit_nano"):
        vitlab.create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, pretrained=str(tmp_path / "nano"))

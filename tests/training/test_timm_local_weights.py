"""``model.pretrained=PATH`` for a timm model (``model.name=timm:NAME``) from a checkpoint timm saved on this disk: a
``.safetensors`` or ``.pth``/``.bin`` state dict, or a folder in the Hugging Face hub's layout copied by hand; fitted
as timm's ``load_pretrained`` fits one (its ``checkpoint_filter_fn``, the input channels, the head), and what is
refused in one line before the run folder exists."""

from __future__ import annotations

import json
import logging

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models._hub import save_for_hf

import vitlab
from vitlab.cli.main import main

NAME = "deit_tiny_patch16_224"
TINY = dict(img_size=8, patch_size=2, depth=2)
FIT = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "run.test=false", "run.export=false"]
FIT += ["run.report=false", f"model.name=timm:{NAME}", "model.img_size=8", "model.patch_size=2", "model.depth=2"]


def _saved(tmp_path, form: str, **options) -> tuple[str, dict[str, torch.Tensor]]:
    """A tiny timm model's weights as timm users save them (RGB, 5 classes): the path and the state dict."""
    torch.manual_seed(0)
    model = timm.create_model(NAME, **{**TINY, "num_classes": 5, **options})
    state = model.state_dict()
    if form == "safetensors":
        save_file(state, tmp_path / "deit.safetensors")
        return str(tmp_path / "deit.safetensors"), state
    if form in ("pth", "bin"):
        torch.save(state, tmp_path / f"deit.{form}")
        return str(tmp_path / f"deit.{form}"), state
    save_for_hf(model, str(tmp_path / "hub"), safe_serialization=form == "hub-safetensors")  # timm's hub layout
    return str(tmp_path / "hub"), state


@pytest.mark.parametrize("form", ["safetensors", "pth", "bin", "hub-safetensors", "hub-bin"])
def test_a_checkpoint_timm_saved_loads_with_the_head_and_channels_refitted(tmp_path, form):
    path, saved = _saved(tmp_path, form)
    model = vitlab.create_model(f"timm:{NAME}", **TINY, in_chans=1, num_classes=10, pretrained=path)
    assert "patch_embed.proj adapted from 3 to 1 input channels; head reset for 10 classes" in model.pretrained_summary
    loaded = model.state_dict()
    for key, value in saved.items():
        if key == "patch_embed.proj.weight":  # gray = the sum over RGB (timm's adapt_input_conv)
            torch.testing.assert_close(loaded[key], value.sum(1, keepdim=True))
        elif not key.startswith("head."):
            assert torch.equal(loaded[key], value), key
    assert loaded["head.weight"].shape == (10, 192)


def test_timms_checkpoint_filter_resamples_the_position_embedding_of_another_image_size(tmp_path):
    path, saved = _saved(tmp_path, "safetensors", img_size=16)
    model = vitlab.create_model(f"timm:{NAME}", **TINY, num_classes=5, pretrained=path)
    assert "pos_embed resampled to the model's by timm's checkpoint filter" in model.pretrained_summary
    assert model.pos_embed.shape == (1, 17, 192)
    assert torch.equal(model.state_dict()["blocks.1.attn.qkv.weight"], saved["blocks.1.attn.qkv.weight"])


def test_fit_fine_tunes_from_a_timm_checkpoint_and_says_what_it_refitted(tmp_path, caplog):
    path, _ = _saved(tmp_path, "hub-safetensors")
    with caplog.at_level(logging.INFO):
        code = main(["fit", "--config", "vit/digits", *FIT, f"model.pretrained={path}", f"run.dir={tmp_path / 'run'}"])
    assert code == 0
    # Lightning's rank_zero_info: a log record, on stderr through whichever handler the first command set up
    assert (
        f"loaded pretrained weights from {path}/model.safetensors; patch_embed.proj adapted from 3 to 1" in caplog.text
    )


def _another_architecture(tmp_path) -> str:
    path, _ = _saved(tmp_path, "hub-bin")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    (tmp_path / "hub" / "config.json").write_text(json.dumps({**config, "architecture": "vit_small_patch16_224"}))
    return path


def _garbage(tmp_path) -> str:
    (tmp_path / "deit.safetensors").write_bytes(b"not a weights file")
    return str(tmp_path / "deit.safetensors")


def _eva(tmp_path) -> str:
    save_file(timm.create_model("eva02_tiny_patch14_224", **TINY).state_dict(), tmp_path / "eva.safetensors")
    return str(tmp_path / "eva.safetensors")


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (
            _another_architecture,
            "holds timm's vit_small_patch16_224 (its config.json), not deit_tiny_patch16_224; set ",
        ),
        (_garbage, "deit.safetensors' cannot be read ("),
        (_eva, "eva.safetensors do not fit timm:deit_tiny_patch16_224: "),
    ],
)
def test_a_wrong_weights_file_is_refused_in_one_line_before_the_run_folder(tmp_path, capsys, weights, message):
    path = weights(tmp_path)
    code = main(["fit", "--config", "vit/digits", *FIT, f"model.pretrained={path}", f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "run").exists()
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_timm_weights_by_tag_without_the_hub_say_where_to_put_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pretrained = f"model.pretrained=timm:{NAME}.fb_in1k"
    code = main(["fit", "--config", "vit/digits", *FIT, pretrained, f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "run").exists()
    assert "or copy the folder https://huggingface.co/timm/deit_tiny_patch16_224.fb_in1k (config.json and" in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1

"""The training options built on timm's model contract: ``trainer.grad_checkpointing`` and ``finetune.layer_decay``
over the model's ``group_matcher``, in ``vitlab fit`` on families other than the ViT."""

import json

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from vitlab.config import ConfigError, build_config
from vitlab.export import load_model
from vitlab.models.weight_sources import source_pretrained_cfg
from vitlab.training.run import enable_grad_checkpointing, fit

QUICK = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.max_epochs=1",
    "data.limit_train=64",
    "run.test=false",
    "run.export=false",
    "run.generate=false",
    "run.report=false",
    "trainer.grad_checkpointing=true",
    "finetune.layer_decay=0.5",
    "optim.lr=0.01",
    "optim.schedule=none",  # the learning rates as the optimiser is built
]


class _Seen(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        model = pl_module.model
        first = dict(model.named_parameters())[f"{model.pretrained_cfg['first_conv']}.weight"]
        head = dict(model.named_parameters())[f"{model.pretrained_cfg['classifier']}.weight"]
        lr_of = {id(p): g["lr"] for g in trainer.optimizers[0].param_groups for p in g["params"]}
        self.checkpointing = model.grad_checkpointing
        self.lrs = sorted({g["lr"] for g in trainer.optimizers[0].param_groups})
        self.first, self.head = lr_of[id(first)], lr_of[id(head)]


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        pytest.param("cet_vit/digits", [], id="cet_vit"),
        pytest.param("vit/digits", ["model.name=swin_pico", "model.patch_size=1", "model.window_size=2"], id="swin"),
    ],
)
def test_fit_with_checkpointing_and_layer_decay(tmp_path, config, overrides):
    seen = _Seen()
    fit(build_config(config, [*QUICK, f"run.dir={tmp_path / 'r'}", *overrides]), callbacks=[seen])
    assert seen.checkpointing
    assert seen.head == 0.01 and seen.first == min(seen.lrs) == pytest.approx(0.01 * 0.5 ** (len(seen.lrs) - 1))
    assert len(seen.lrs) >= 4


def test_grad_checkpointing_on_a_model_without_it_is_a_clear_error():
    with pytest.raises(ConfigError, match="has no set_grad_checkpointing"):
        enable_grad_checkpointing(nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="trainer.grad_checkpointing"):
        build_config("vit/digits", ["trainer.grad_checkpointing=maybe"])
    assert torch.is_grad_enabled()


def test_pretrained_weights_bring_their_normalisation(tmp_path, capsys):
    pretrained = source_pretrained_cfg("timm:vit_tiny_patch16_224.augreg_in21k")  # timm's registry, no download
    assert pretrained["mean"] == (0.5, 0.5, 0.5) and pretrained["input_size"] == (3, 224, 224)
    base = [o for o in QUICK if not o.startswith(("trainer.grad", "finetune"))] + ["model.depth=1"]
    first = fit(build_config("vit/digits", [*base, "run.export=true", f"run.dir={tmp_path / 'a'}"]))
    source = source_pretrained_cfg(first)
    assert source["input_size"] == (1, 8, 8) and len(source["mean"]) == 1
    assert load_model(first).pretrained_cfg["mean"] == source["mean"]  # an export knows its data's statistics
    # weights pretrained on other images (here: the export's record says so) bring their normalisation along
    config = first / "export" / "config.json"
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({**meta, "data": {**meta["data"], "mean": [0.25], "std": [0.5]}}))
    finetune = [*base, "run.export=true", f"model.pretrained={first}"]
    second = fit(build_config("vit/digits", [*finetune, f"run.dir={tmp_path / 'b'}"]))
    assert "finetune.normalisation=pretrained: mean (0.25,), std (0.5,)" in capsys.readouterr().out
    assert source_pretrained_cfg(second)["mean"] == (0.25,)
    third = fit(build_config("vit/digits", [*finetune, "finetune.normalisation=data", f"run.dir={tmp_path / 'c'}"]))
    assert source_pretrained_cfg(third)["mean"] == source["mean"]

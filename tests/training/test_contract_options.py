"""The training options built on timm's model contract: ``trainer.grad_checkpointing`` and ``finetune.layer_decay``
over the model's ``group_matcher``, in ``vitlab fit`` on families other than the ViT."""

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from vitlab.config import ConfigError, build_config
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

"""A third family joins without an edit to the core: a toy model, its task, a command and a config section,
declared once with ``register_family`` and then found by the training, the evaluation and the command line."""

import argparse
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from vitlab.cli.registry import COMMANDS, command
from vitlab.config import ConfigError, build_config
from vitlab.errors import ModelOptionError
from vitlab.evaluation.outputs import logits_and_assignment
from vitlab.family import Family, families, family_of, family_of_class, register_family, unregister_family
from vitlab.models.builder import create_model
from vitlab.models.protocols import GenerativeModel, SlotAssigner
from vitlab.models.registry import _REGISTRY
from vitlab.training.run import task_class_for
from vitlab.training.tasks import ClassificationTask


class ToySlotModel(nn.Module):
    """Logits from a mean over pixels, and a one-slot assignment S: [B, N, 1] for its 4 patches."""

    def __init__(self, num_classes: int = 3, img_size: int = 8, in_chans: int = 1):
        super().__init__()
        self.head = nn.Linear(in_chans, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(dim=(2, 3)))

    def forward_with_aux(self, x: torch.Tensor, compute_ei: bool = True):
        return self(x), {"S": torch.ones(x.shape[0], 4, 1)}


class ToyTask(ClassificationTask):
    pass


def _toy_command(p: argparse.ArgumentParser):
    return lambda args, overrides: 0


@pytest.fixture
def toy_family():
    family = register_family(
        Family(
            name="toy",
            models=(ToySlotModel,),
            task=ToyTask,
            config_types={"loss": dict},
            presets={"toy_pico": ("ToySlotModel", "a toy family's model")},
            commands=(),
            report_sections=(),
        )
    )
    command("toy-command", "the toy family's command")(_toy_command)
    yield family
    unregister_family("toy")
    _REGISTRY.pop("toy_pico", None)
    COMMANDS.pop("toy-command")


def test_the_built_in_families_declare_themselves():
    names = {family.name for family in families()}
    assert {"vitcae", "cet_vit"} <= names
    assert family_of(create_model("vitcae_pico")).name == "vitcae"
    assert family_of(create_model("vit_nano")) is None


def test_a_toy_family_is_found_by_the_core(toy_family):
    model = create_model("toy_pico")
    assert family_of(model) is toy_family
    assert family_of_class(ToySlotModel) is toy_family
    assert task_class_for(ToySlotModel) is ToyTask
    assert isinstance(model, SlotAssigner) and not isinstance(model, GenerativeModel)
    logits, S = logits_and_assignment(model, torch.zeros(2, 1, 8, 8))
    assert logits.shape == (2, 3) and S.shape == (2, 4, 1)
    assert toy_family.preset_names() == ("toy_pico",)
    assert toy_family.config_type("loss") is dict

    from vitlab.cli.main import build_parser

    _, runners = build_parser(["toy-command"])
    assert "toy-command" in runners


def test_a_family_name_is_declared_once(toy_family):
    with pytest.raises(ValueError, match="registered twice"):
        register_family(Family(name="toy", models=(), task=ToyTask))


@dataclass(frozen=True, kw_only=True)
class ToyModelConfig:
    num_classes: int = 3
    img_size: int = 8
    in_chans: int = 1


@dataclass
class ToyLossConfig:
    slot_weight: float = 1.0


@pytest.fixture
def typed_toy_family(toy_family):
    """The toy family with its own config types."""
    unregister_family("toy")
    family = register_family(
        Family(
            name="toy",
            models=(ToySlotModel,),
            task=ToyTask,
            config_types={"model": ToyModelConfig, "loss": ToyLossConfig},
            presets={"toy_pico": ("ToySlotModel", "a toy family's model")},
        )
    )
    yield family


def test_a_toy_familys_config_sections_are_typed_and_checked_by_its_own_types(typed_toy_family):
    cfg = build_config(None, ["model.name=toy_pico", "model.num_classes=4", "loss.slot_weight=0.5"])
    assert cfg.model == {"name": "toy_pico", "num_classes": 4} and cfg.loss == {"slot_weight": 0.5}
    with pytest.raises(ModelOptionError, match="has no option 'num_clases'. Did you mean num_classes"):
        build_config(None, ["model.name=toy_pico", "model.num_clases=4"])
    with pytest.raises(ConfigError, match="model.num_classes must be of type int"):
        build_config(None, ["model.name=toy_pico", "model.num_classes=four"])
    with pytest.raises(ConfigError, match="unknown config key 'loss.slot_wieght'. Did you mean 'slot_weight'"):
        build_config(None, ["model.name=toy_pico", "loss.slot_wieght=0.5"])

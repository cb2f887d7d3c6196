"""What a family's model claims through ``vitlab.models.protocols`` (``EncoderBacked``, ``DynamicsTarget``,
``AttentionBlocks``): the built-in families claim it, and the test kit's ``check_capabilities`` fails a model whose
claim does not hold."""

import pytest
import torch
from torch import nn

from vitlab.family import Family, register_family, unregister_family
from vitlab.layers import Block
from vitlab.models import create_model
from vitlab.models.protocols import AttentionBlocks, DynamicsTarget, EncoderBacked, classifier_backbone
from vitlab.models.registry import _REGISTRY
from vitlab.testing import check_capabilities
from vitlab.training.tasks import ClassificationTask


def test_the_built_in_families_implement_the_protocols():
    vitcae, cet_vit = create_model("vitcae_pico"), create_model("cet_vit_pico")
    assert (
        isinstance(vitcae, EncoderBacked) and isinstance(vitcae, DynamicsTarget) and isinstance(vitcae, AttentionBlocks)
    )
    assert classifier_backbone(vitcae) is vitcae.encoder and vitcae.dynamics_target == "encoder."
    assert isinstance(cet_vit, AttentionBlocks) and not isinstance(cet_vit, EncoderBacked | DynamicsTarget)
    assert [n for n, _ in cet_vit.attention_blocks()][-2:] == ["macro_encoder.blocks.0", "deep_encoder.0"]


class Claiming(nn.Module):
    """Two attention blocks and a head; ``claim`` picks what it says of itself (each a broken claim but ``fine``)."""

    def __init__(self, *, img_size: int = 8, in_chans: int = 1, num_classes: int = 3, claim: str = "fine") -> None:
        super().__init__()
        self.claim, self.num_classes = claim, num_classes
        self.embed = nn.Linear(in_chans, 8)
        self.blocks = nn.ModuleList(Block(8, num_heads=2) for _ in range(2))
        self.head = nn.Linear(8, num_classes)
        self.dynamics_target = "decoder." if claim == "target" else "blocks.1."

    def attention_blocks(self) -> list[tuple[str, nn.Module]]:
        named = [(f"blocks.{i}", block) for i, block in enumerate(self.blocks)]
        return {
            "elsewhere": [("blocks.1", self.blocks[0])],
            "no_attention": [("head", self.head)],
            "nested": [("blocks.0", self.blocks[0]), ("blocks.0.attn", self.blocks[0].attn)],
        }.get(self.claim, named)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.flatten(2).transpose(1, 2))
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(tokens.mean(1))


class GenerativeWithoutEncoder(Claiming):
    """A ``GenerativeModel`` by its methods, with no ``encoder`` for the commands that read the classifier's."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def prior(self, z_cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return z_cls, z_cls

    def decode(self, z_cls: torch.Tensor, z_pt: torch.Tensor) -> torch.Tensor:
        return z_pt


PRESETS = {"claiming": ("Claiming", "c"), "claiming_generative": ("GenerativeWithoutEncoder", "g")}


@pytest.fixture
def claiming():
    models = (Claiming, GenerativeWithoutEncoder)
    register_family(Family(name="claiming", models=models, task=ClassificationTask, presets=PRESETS))
    yield
    unregister_family("claiming")
    for preset in PRESETS:
        _REGISTRY.pop(preset, None)


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ("target", r"dynamics_target='decoder\.' is the prefix of no shared Attention in \['blocks\.0\.attn'"),
        ("elsewhere", r"'blocks\.1' is not that module"),
        ("no_attention", "head holds no attention"),
        ("nested", r"\['blocks\.0'\] hold other blocks"),
    ],
)
def test_the_kit_fails_a_claim_that_does_not_hold(claiming, claim, message):
    assert isinstance(create_model("claiming"), DynamicsTarget | AttentionBlocks)
    check_capabilities("claiming")
    with pytest.raises(AssertionError, match=message):
        check_capabilities("claiming", claim=claim)


def test_the_kit_fails_a_generative_model_without_an_encoder(claiming):
    with pytest.raises(AssertionError, match="GenerativeWithoutEncoder is a GenerativeModel without an encoder"):
        check_capabilities("claiming_generative")

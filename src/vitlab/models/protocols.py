"""What the core asks of a model, as ``typing.Protocol``s: a capability, never a class name.

Evaluation, probes, the report and the commands test ``isinstance(model, SlotAssigner)`` (and the like) instead of
``hasattr`` or ``isinstance(model, CETViT)``, so a new family's model gets the same treatment by having the methods.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from timm.models import group_parameters
from torch import nn


@runtime_checkable
class SlotAssigner(Protocol):
    """A model with a token-to-slot assignment (CET-ViT): ``forward_with_aux(x: [B, C, H, W]) -> (logits: [B, K],
    aux)`` where ``aux.S: [B, N, K_max]`` (or ``aux["S"]``) assigns each patch token to a slot."""

    def forward_with_aux(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]: ...


@runtime_checkable
class GenerativeModel(Protocol):
    """A conditional generative model over images (ViTCAE): a posterior from ``encode(x: [B, C, H, W])``, the
    conditional ``prior(z_cls)`` of the patch latents, ``decode(z_cls, z_pt) -> x_hat: [B, C, H, W]``. The protocol
    names methods only, so a preset's class can be tested with ``issubclass``; its ``encoder`` is
    :class:`EncoderBacked`'s."""

    def encode(self, x: torch.Tensor) -> Any: ...

    def prior(self, z_cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def decode(self, z_cls: torch.Tensor, z_pt: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class EncoderBacked(Protocol):
    """A model whose classifier is one image encoder with its own head, held as ``encoder`` (ViTCAE: the ViT whose
    features the classifier reads, wrapped by a prior and a decoder). Pretrained ViT weights initialise it, a benchmark
    times it and timm's contract is asked of it (``vitlab_<preset>``); a ``GenerativeModel`` is one (the test kit's
    ``check_capabilities``)."""

    encoder: nn.Module


@runtime_checkable
class DynamicsTarget(Protocol):
    """A model that names the attention the dynamics controller steers when ``dynamics.target`` is unset:
    ``dynamics_target``, a prefix of the qualified names of its shared ``Attention`` modules (ViTCAE eq. 20, 26:
    ``"encoder."``, the encoder's attention, never the decoder's)."""

    dynamics_target: str


@runtime_checkable
class AttentionBlocks(Protocol):
    """A model that names its attention blocks, the units ``trainer.compile`` compiles one by one (PyTorch's regional
    compilation): ``attention_blocks() -> [(qualified name, block)]``, in forward order, none inside another. Without
    it the blocks are found by :func:`vitlab.acceleration.compiled_blocks`."""

    def attention_blocks(self) -> list[tuple[str, nn.Module]]: ...


@runtime_checkable
class HeadFreezing(Protocol):
    """An attention whose heads can be frozen (ViTCAE eq. 26; :class:`vitlab.dynamics.FrozenHeadAttention`):
    ``set_frozen_heads(frozen: [H] bool)`` and ``num_frozen``, the count of frozen heads kept on the host, so that
    reading it never waits for the device."""

    num_frozen: int

    def set_frozen_heads(self, frozen: torch.Tensor) -> torch.Tensor | None: ...


@runtime_checkable
class LayerGrouped(Protocol):
    """A model whose parameters timm can group by depth: ``group_matcher(coarse) -> {group: regex or [(regex,
    ordinal)]}`` (``timm.models.group_parameters``), what layer-wise learning-rate decay builds on."""

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]: ...


def parameter_layers(model: LayerGrouped) -> dict[str, int]:
    """Layer of every parameter name: timm's ``group_parameters`` over ``model.group_matcher()``, 0 the embeddings,
    then the blocks in forward order (block ``i`` is layer ``i + 1``); what no group names (the head) is the last
    layer. Layer-wise learning-rate decay and layer freezing read the model's depth from it."""
    return group_parameters(model, model.group_matcher(coarse=False), reverse=True)


@runtime_checkable
class GradCheckpointing(Protocol):
    """A model that can recompute its blocks' activations in the backward pass instead of keeping them (timm's
    ``set_grad_checkpointing``)."""

    def set_grad_checkpointing(self, enable: bool = True) -> None: ...


@runtime_checkable
class PretrainedConfigured(Protocol):
    """A model with timm's ``pretrained_cfg``: its input size, interpolation, mean and std, classifier and first
    convolution (:class:`vitlab.models.contract.ModelContract`)."""

    pretrained_cfg: dict[str, Any]


def classifier_backbone(model: nn.Module) -> nn.Module:
    """The image encoder a benchmark times: an :class:`EncoderBacked` model's ``encoder``, any other model itself."""
    return model.encoder if isinstance(model, EncoderBacked) else model

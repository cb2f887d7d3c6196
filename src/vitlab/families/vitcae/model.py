"""ViTCAE: ViT-based class-conditioned autoencoder (Jebraeeli, Krim, Cansever, arXiv 2509.16554).

Reads top to bottom as the paper's pipeline (ViTCAE paper, eq. 17-19, the "conditional Gaussian prior" and the
decoder paragraphs; where the paper is silent, docs/vitcae.md decides):

1. Encoder (eq. 17, 19): a :class:`~vitlab.models.vit.VisionTransformer` without a head whose attention has a
   learnable per-head temperature. Its attention modules sit at ``encoder.blocks.{i}.attn``, so the shared
   capture and head-freezing tools work on ``model.encoder`` directly.
2. Latents: Gaussian posteriors ``q(z_cls | x)`` on the CLS token and ``q(z_pt | x)`` on the patch tokens; a
   conditional prior ``p(z_pt | z_cls) = N(f(z_cls))``; a deterministic patch estimator ``g(z_cls)``; a linear
   classifier on ``mu_cls``.
3. Decoder: patch latents projected to the decoder width; every block runs self-attention, cross-attention from
   the patch tokens to ``M`` conditioning tokens made from ``z_cls``, and a FiLM-modulated FFN; a linear head to
   pixels, unpatchified into an image in the same (normalised) space as the input.

``forward`` returns a :class:`ViTCAEOutput` with everything the losses of :mod:`vitlab.families.vitcae.losses` need.
As a classifier the model follows the timm contract: ``forward_head(forward_features(x))`` gives the logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from timm.layers import DropPath, Mlp, trunc_normal_
from timm.models.vision_transformer import init_weights_vit_timm
from torch import nn

from vitlab.config.model import ViTEncoderOptions, takes_options
from vitlab.families.vitcae.config import ViTCAEOptions
from vitlab.families.vitcae.losses import reparameterize
from vitlab.layers import Attention, CrossAttention
from vitlab.models.contract import ModelContract
from vitlab.models.vit import VisionTransformer


@dataclass
class ViTCAEPosterior:
    """Parameters of the Gaussian posteriors ``q(z_cls | x)``, ``q(z_pt | x)`` (ViTCAE paper, eq. 24).

    ``mu_cls, logvar_cls: [B, d_z]``; ``mu_pt, logvar_pt: [B, N, d_p]``.
    """

    mu_cls: torch.Tensor
    logvar_cls: torch.Tensor
    mu_pt: torch.Tensor
    logvar_pt: torch.Tensor


@dataclass
class ViTCAEOutput:
    """Everything one forward pass of :class:`ViTCAE` produces.

    Attributes:
        recon: reconstruction ``x'``, ``[B, C, H, W]``, in the input's (normalised) space.
        logits: class logits from ``mu_cls``, ``[B, num_classes]``.
        z_cls, mu_cls, logvar_cls: global latent sample and its posterior, ``[B, d_z]``.
        z_pt, mu_pt, logvar_pt: patch latent sample and its posterior, ``[B, N, d_p]``.
        prior_mu_pt, prior_logvar_pt: conditional prior ``p(z_pt | z_cls)``, ``[B, N, d_p]``.
        pt_estimate: deterministic estimate ``Z_tilde_pt = g(z_cls)``, ``[B, N, d_p]``.

    In training mode ``z_cls`` and ``z_pt`` are reparameterised samples; in eval mode they are the means.
    """

    recon: torch.Tensor
    logits: torch.Tensor
    z_cls: torch.Tensor
    mu_cls: torch.Tensor
    logvar_cls: torch.Tensor
    z_pt: torch.Tensor
    mu_pt: torch.Tensor
    logvar_pt: torch.Tensor
    prior_mu_pt: torch.Tensor
    prior_logvar_pt: torch.Tensor
    pt_estimate: torch.Tensor


def unpatchify(tokens: torch.Tensor, grid_size: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Pixel tokens ``[B, N, P*P*C]`` (row-major patch grid, ``(P, P, C)`` inside a token) -> ``[B, C, H, W]``."""
    grid_h, grid_w = grid_size
    if tokens.shape[1] != grid_h * grid_w or tokens.shape[2] % (patch_size * patch_size) != 0:
        raise ValueError(
            f"cannot unpatchify tokens of shape {list(tokens.shape)} onto a {grid_h}x{grid_w} grid of "
            f"{patch_size}x{patch_size} patches; expected [B, {grid_h * grid_w}, {patch_size}*{patch_size}*C]"
        )
    return rearrange(tokens, "b (h w) (p q c) -> b c (h p) (w q)", h=grid_h, w=grid_w, p=patch_size, q=patch_size)


class FiLM(nn.Module):
    """Feature-wise linear modulation ``h -> gamma(c) * h + beta(c)`` (Perez et al. 2018; ViTCAE paper,
    decoder paragraph).

    ``h: [B, N, C]``, ``cond: [B, d_c]``. The linear maps start with zero weights and biases 1 (gamma) and 0
    (beta), so the module is the identity at initialisation whatever the condition.
    """

    def __init__(self, cond_dim: int, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Linear(cond_dim, dim)
        self.beta = nn.Linear(cond_dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.gamma.weight)
        nn.init.ones_(self.gamma.bias)
        nn.init.zeros_(self.beta.weight)
        nn.init.zeros_(self.beta.bias)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.gamma(cond).unsqueeze(1) * h + self.beta(cond).unsqueeze(1)


class DecoderBlock(nn.Module):
    """One ViTCAE decoder block (ViTCAE paper, decoder paragraph; docs/vitcae.md). ``x: [B, N, C]`` patch tokens
    -> ``[B, N, C]``.

    Pre-norm residual steps: self-attention (the shared :class:`~vitlab.layers.attention.Attention`);
    cross-attention to the conditioning tokens ``cond_tokens: [B, M, C]``; FFN modulated by FiLM of
    ``z_cls: [B, d_z]``, i.e. ``x + gamma(z_cls) * FFN(LN(x)) + beta(z_cls)``.
    """

    def __init__(
        self,
        dim: int,
        *,
        cond_dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm_cross = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attn = CrossAttention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        self.film = FiLM(cond_dim, dim)
        self.drop_path3 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, cond_tokens: torch.Tensor, z_cls: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        x = x + self.drop_path2(self.cross_attn(self.norm_cross(x), cond_tokens))
        return x + self.drop_path3(self.film(self.mlp(self.norm2(x)), z_cls))


@takes_options(ViTCAEOptions)
class ViTCAE(ModelContract, nn.Module):
    """ViT-based class-conditioned autoencoder. ``x: [B, C, H, W] -> ViTCAEOutput``.

    The encoder is a :class:`~vitlab.models.vit.VisionTransformer` and has all of timm's model contract. The
    autoencoder forwards to it what concerns the image features (``forward_features``, ``forward_intermediates``,
    ``feature_info``) and has the rest for the whole model: ``num_features`` (the encoder's width ``D``),
    ``head_hidden_size`` (``d_z``: ``forward_head(pre_logits=True)`` is ``mu_cls``), ``get_classifier`` /
    ``reset_classifier``, ``set_grad_checkpointing`` (encoder and decoder blocks), ``group_matcher`` (the encoder's
    embeddings and blocks; the latent heads, the decoder and the classifier form the last group) and
    ``pretrained_cfg``.

    Options: :class:`~vitlab.families.vitcae.config.ViTCAEOptions`; ``N = (img_size / patch_size)^2`` patch tokens.
    """

    #: the attention the dynamics controller steers (eq. 20, 26): the encoder's, never the decoder's
    dynamics_target = "encoder."
    first_conv = "encoder.patch_embed.proj"

    def __init__(self, **options: Any) -> None:
        super().__init__()
        o = ViTCAEOptions(**options)
        self.grid_size = (o.grid, o.grid)
        self.num_patches = o.grid * o.grid
        self.patch_size, self.in_chans, self.num_classes = o.patch_size, o.in_chans, o.num_classes
        self.latent_dim, self.patch_latent_dim = o.latent_dim, o.patch_latent_dim
        self.num_cond_tokens, self.decoder_dim = o.num_cond_tokens, o.decoder_dim
        self.num_features, self.head_hidden_size = o.embed_dim, o.latent_dim
        # 1. Encoder (eq. 17, 19).
        encoder = {f.name: getattr(o, f.name) for f in dataclasses.fields(ViTEncoderOptions)}
        self.encoder = VisionTransformer(**{**encoder, "num_classes": 0})
        self._build_latents_and_decoder(o)
        trunc_normal_(self.decoder_pos_embed, std=0.02)
        for name, module in self.named_children():
            if name != "encoder":  # the encoder initialises itself
                module.apply(init_weights_vit_timm)  # timm's ViT init; FiLM's reset_parameters restores its identity

    def _build_latents_and_decoder(self, o: ViTCAEOptions) -> None:
        # 2. Posteriors, conditional prior f, estimator g, classifier.
        self.mu_cls = nn.Linear(o.embed_dim, o.latent_dim)
        self.logvar_cls = nn.Linear(o.embed_dim, o.latent_dim)
        self.mu_pt = nn.Linear(o.embed_dim, o.patch_latent_dim)
        self.logvar_pt = nn.Linear(o.embed_dim, o.patch_latent_dim)
        self.prior_net = Mlp(
            in_features=o.latent_dim,
            hidden_features=o.embed_dim,
            out_features=self.num_patches * 2 * o.patch_latent_dim,
        )
        self.estimator_net = Mlp(
            in_features=o.latent_dim, hidden_features=o.embed_dim, out_features=self.num_patches * o.patch_latent_dim
        )
        self.head = nn.Linear(o.latent_dim, o.num_classes)

        # 3. Decoder.
        self.decoder_embed = nn.Linear(o.patch_latent_dim, o.decoder_dim)
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, self.num_patches, o.decoder_dim))
        self.cond_embed = nn.Linear(o.latent_dim, o.num_cond_tokens * o.decoder_dim)
        dpr = [o.drop_path_rate * i / max(o.decoder_depth - 1, 1) for i in range(o.decoder_depth)]  # meta-device safe
        self.decoder_blocks = nn.ModuleList(
            DecoderBlock(
                o.decoder_dim,
                cond_dim=o.latent_dim,
                num_heads=o.decoder_heads,
                mlp_ratio=o.mlp_ratio,
                qkv_bias=o.qkv_bias,
                proj_drop=o.drop_rate,
                attn_drop=o.attn_drop_rate,
                drop_path=dpr[i],
            )
            for i in range(o.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(o.decoder_dim, eps=1e-6)
        self.decoder_head = nn.Linear(o.decoder_dim, o.patch_size * o.patch_size * o.in_chans)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {f"encoder.{n}" for n in self.encoder.no_weight_decay()} | {"decoder_pos_embed"}

    # --- classifier contract ----------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder features ``[B, C, H, W] -> [B, 1 + N, D]`` (CLS first) after the final LayerNorm."""
        return self.encoder.forward_features(x)

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | Sequence[int] | None = None, **kwargs: Any
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """The encoder's :meth:`~vitlab.models.vit.VisionTransformer.forward_intermediates` (same options)."""
        return self.encoder.forward_intermediates(x, indices, **kwargs)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """timm's ``features_only``: the encoder pruned after the last tap of ``indices`` (its
        :meth:`~vitlab.models.vit.VisionTransformer.prune_intermediate_layers`), and with ``prune_head`` every part
        the features do not pass through (posteriors, prior, estimator, head, decoder) removed, so each parameter
        left gets a gradient (DDP needs no ``find_unused_parameters``). The pruned model is a feature extractor:
        ``forward_features`` and ``forward_intermediates`` work, ``forward`` (the autoencoder) does not."""
        take = self.encoder.prune_intermediate_layers(indices, prune_norm=prune_norm, prune_head=True)
        if prune_head:
            for name, _ in list(self.named_children()):
                if name != "encoder":
                    setattr(self, name, None)
            self.decoder_pos_embed = None
            self.num_classes = 0
        return take

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """The encoder's blocks, named in this model (``encoder.blocks.{i}``)."""
        return [{**info, "module": f"encoder.{info['module']}"} for info in self.encoder.feature_info]

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return dict(stem=r"^encoder\.(?:cls_token|pos_embed|patch_embed)", blocks=[(r"^encoder\.blocks\.(\d+)", None)])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        self.encoder.set_grad_checkpointing(enable)

    def attention_blocks(self) -> list[tuple[str, nn.Module]]:
        """The encoder's blocks, then the decoder's (``AttentionBlocks``: what ``trainer.compile`` compiles)."""
        encoder = [(f"encoder.blocks.{i}", block) for i, block in enumerate(self.encoder.blocks)]
        return encoder + [(f"decoder_blocks.{i}", block) for i, block in enumerate(self.decoder_blocks)]

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new classifier on ``mu_cls`` for ``num_classes`` (0: none, the logits are ``mu_cls``). The pooling is
        the CLS token's posterior, so ``global_pool`` must be None or ``token``."""
        if global_pool not in (None, "token"):
            raise ValueError(
                f"ViTCAE classifies mu_cls of the CLS token: global_pool must be 'token', got {global_pool!r}"
            )
        self.num_classes = num_classes
        like = dict(device=self.mu_cls.weight.device, dtype=self.mu_cls.weight.dtype)
        self.head = nn.Linear(self.latent_dim, num_classes, **like) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features ``[B, 1 + N, D]`` -> logits ``[B, num_classes]`` from ``mu_cls`` (``mu_cls [B, d_z]`` with
        ``pre_logits``)."""
        mu_cls = self.mu_cls(x[:, 0])
        return mu_cls if pre_logits else self.head(mu_cls)

    # --- the autoencoder --------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> ViTCAEPosterior:
        """``x: [B, C, H, W]`` -> posterior parameters of ``z_cls`` (``[B, d_z]``) and ``z_pt`` (``[B, N, d_p]``)."""
        h = self.forward_features(x)
        h_cls, h_pt = h[:, 0], h[:, 1:]
        return ViTCAEPosterior(self.mu_cls(h_cls), self.logvar_cls(h_cls), self.mu_pt(h_pt), self.logvar_pt(h_pt))

    def prior(self, z_cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Conditional prior ``p(z_pt | z_cls) = N(mu_hat, diag exp(logvar_hat))`` from the MLP ``f``.

        ``z_cls: [B, d_z]`` -> ``(mu_hat_pt, logvar_hat_pt)``, each ``[B, N, d_p]``.
        """
        params = self.prior_net(z_cls).view(-1, self.num_patches, 2, self.patch_latent_dim)
        return params[:, :, 0], params[:, :, 1]

    def estimate_patches(self, z_cls: torch.Tensor) -> torch.Tensor:
        """Deterministic patch estimate ``Z_tilde_pt = g(z_cls)``: ``[B, d_z] -> [B, N, d_p]`` (eq. 23, L_PT)."""
        return self.estimator_net(z_cls).view(-1, self.num_patches, self.patch_latent_dim)

    def decode(self, z_cls: torch.Tensor, z_pt: torch.Tensor) -> torch.Tensor:
        """``z_cls: [B, d_z]``, ``z_pt: [B, N, d_p]`` -> image ``[B, C, H, W]`` (ViTCAE paper, decoder paragraph)."""
        if z_pt.shape[1:] != (self.num_patches, self.patch_latent_dim):
            raise ValueError(
                f"z_pt must have shape [B, {self.num_patches}, {self.patch_latent_dim}], got {list(z_pt.shape)}"
            )
        cond_tokens = self.cond_embed(z_cls).view(-1, self.num_cond_tokens, self.decoder_dim)
        h = self.decoder_embed(z_pt) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            h = self.checkpointed(block, h, cond_tokens, z_cls)
        pixels = self.decoder_head(self.decoder_norm(h))
        return unpatchify(pixels, self.grid_size, self.patch_size)

    def forward(self, x: torch.Tensor) -> ViTCAEOutput:
        """Encode, sample (training) or take the means (eval), decode and classify. ``x: [B, C, H, W]``."""
        post = self.encode(x)
        if self.training:
            z_cls = reparameterize(post.mu_cls, post.logvar_cls)
            z_pt = reparameterize(post.mu_pt, post.logvar_pt)
        else:
            z_cls, z_pt = post.mu_cls, post.mu_pt
        prior_mu_pt, prior_logvar_pt = self.prior(z_cls)
        return ViTCAEOutput(
            recon=self.decode(z_cls, z_pt),
            logits=self.head(post.mu_cls),
            z_cls=z_cls,
            mu_cls=post.mu_cls,
            logvar_cls=post.logvar_cls,
            z_pt=z_pt,
            mu_pt=post.mu_pt,
            logvar_pt=post.logvar_pt,
            prior_mu_pt=prior_mu_pt,
            prior_logvar_pt=prior_logvar_pt,
            pt_estimate=self.estimate_patches(z_cls),
        )

"""Where pretrained weights come from, read without fitting them to a model: a weights file, a vitlab export or run,
or timm's hub (``timm:NAME[.TAG]``, a timm ViT that vitlab's ViT can express: :func:`timm_vit_kwargs`); and the
normalisation the source was trained with. Fitting the weights to a model and loading them is
:mod:`vitlab.models.pretrained`'s."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.config.model import TIMM_PREFIX
from vitlab.errors import CheckpointError

#: file suffixes read with ``torch.load(weights_only=True)``
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


class PretrainedWeightsError(CheckpointError):
    """Pretrained weights that cannot be read or do not fit the model."""


def read_weights(source: str | Path) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict that ``source`` names (see the module docstring) and a short description of where it came from.

    Only tensors: pickled files are read with ``torch.load(weights_only=True)``.
    """
    text = str(source)
    if text.startswith(TIMM_PREFIX):
        return timm_weights(text[len(TIMM_PREFIX) :]), text
    path = Path(text).expanduser()
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise PretrainedWeightsError(
            f"model.pretrained={text!r}: no such file or folder; pass a .safetensors/.pth/.bin file, a vitlab export "
            "or run directory, or timm:NAME (e.g. timm:vit_tiny_patch16_224.augreg_in21k)"
        )
    return _read_file(path), str(path)


def _read_folder(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    for candidate in (path / "model.safetensors", path / "export" / "model.safetensors", path / "pytorch_model.bin"):
        if candidate.is_file():
            config = candidate.parent / "config.json"
            if config.is_file():
                _check_export_config(config)
            return _read_file(candidate), str(candidate)
    for candidate in (path / "checkpoints" / "best.ckpt", path / "checkpoints" / "last.ckpt"):
        if candidate.is_file():
            return _read_file(candidate), str(candidate)
    raise PretrainedWeightsError(
        f"model.pretrained={str(path)!r} is a folder with no model.safetensors, export/ or checkpoints/best.ckpt; "
        "pass a vitlab export, a run directory or a weights file"
    )


def check_timm_folder(source: str | Path, arch: str) -> None:
    """A folder in the Hugging Face hub's layout of timm weights (``config.json`` with timm's ``architecture`` and
    ``pretrained_cfg``, beside ``model.safetensors`` or ``pytorch_model.bin``, as timm's ``push_to_hf_hub`` writes
    it) holds weights of timm's ``arch``; raises :class:`PretrainedWeightsError` naming the architecture it holds."""
    config = Path(str(source)).expanduser() / "config.json"
    try:
        meta = json.loads(config.read_text()) if config.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # reading the weights says what is wrong with the folder
    found = meta.get("architecture") if isinstance(meta, dict) and "pretrained_cfg" in meta else None
    if found and found != arch:
        raise PretrainedWeightsError(
            f"model.pretrained={str(source)!r} holds timm's {found} (its config.json), not {arch}; set "
            f"model.name={TIMM_PREFIX}{found}, or pass {arch}'s weights"
        )


def _check_export_config(config: Path) -> None:
    try:
        json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise PretrainedWeightsError(f"{config} is not valid JSON ({e}); export the model again") from e


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise several types for truncated or foreign files
        first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise PretrainedWeightsError(
            f"model.pretrained={str(path)!r} cannot be read ({type(e).__name__}: {first}); the file is truncated, "
            f"corrupt or not a weights file: download or export it again (readable: .safetensors, "
            f"{', '.join(TORCH_SUFFIXES)} state dicts)"
        ) from e
    if isinstance(state, dict):
        for wrapper in ("state_dict", "model", "module"):
            if isinstance(state.get(wrapper), dict):
                state = state[wrapper]
                break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PretrainedWeightsError(
            f"model.pretrained={str(path)!r} holds no state dict (a mapping of names to tensors, possibly under "
            "'state_dict' or 'model'); save one with torch.save(model.state_dict(), path) or safetensors"
        )
    return state


def _timm_pretrained_cfg(name: str) -> Any:
    """timm's ``PretrainedCfg`` of ``NAME[.TAG]`` (no download), or None for a name timm does not know."""
    import timm

    try:
        return timm.models.get_pretrained_cfg(name)
    except Exception:  # timm raises RuntimeError or KeyError for unknown names
        return None


def timm_hub_file(name: str) -> str:
    """Where timm downloads ``NAME[.TAG]``'s weights from, to tell an offline user which file to fetch."""
    cfg = _timm_pretrained_cfg(name)
    if cfg is None:
        return "the weights file"
    if cfg.hf_hub_id:
        return f"https://huggingface.co/{cfg.hf_hub_id}/resolve/main/{cfg.hf_hub_filename or 'model.safetensors'}"
    return cfg.url or "the weights file"


def hub_offline() -> bool:
    """True when the Hugging Face hub is switched off (``HF_HUB_OFFLINE=1``, read now or at huggingface_hub's
    import)."""
    import os

    import huggingface_hub

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE) or offline


def _hub_folder(name: str) -> str:
    """The other way to put ``NAME[.TAG]``'s weights on this machine, for the messages: its hub folder copied whole."""
    cfg = _timm_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id:
        return ""
    return (
        f", or copy the folder https://huggingface.co/{cfg.hf_hub_id} (config.json and the weights) and pass its path"
    )


def timm_weights_cached(name: str) -> bool:
    """True when ``NAME[.TAG]``'s weights file is in the local Hugging Face cache (timm then loads it offline)."""
    import huggingface_hub

    cfg = _timm_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id:
        return False
    files = {cfg.hf_hub_filename, "model.safetensors", "pytorch_model.bin"} - {None}
    return any(isinstance(huggingface_hub.try_to_load_from_cache(cfg.hf_hub_id, f), str) for f in files)


def timm_weights(name: str) -> dict[str, torch.Tensor]:
    """``timm.create_model(name, pretrained=True)``'s state dict, checked with :func:`timm_vit_kwargs` (so a timm
    model of another family or with features vitlab's ViT lacks is refused by name)."""
    import timm

    arch = name.split(".")[0]
    if arch not in timm.list_models():
        raise PretrainedWeightsError(
            f"model.pretrained=timm:{name}: timm has no model {arch!r}; `timm.list_models('vit_*', pretrained=True)` "
            "lists the ViTs with weights"
        )
    if hub_offline() and not timm_weights_cached(name):
        raise PretrainedWeightsError(
            f"model.pretrained=timm:{name}: HF_HUB_OFFLINE is set and the weights are not in the Hugging Face cache; "
            f"fetch {timm_hub_file(name)} on a machine with the internet and pass "
            f"model.pretrained=/path/to/model.safetensors{_hub_folder(name)} (or unset HF_HUB_OFFLINE where the "
            "internet is reachable)"
        )
    try:
        model = timm.create_model(name, pretrained=True)
    except Exception as e:  # huggingface_hub / urllib errors when offline, RuntimeError for an unknown tag
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise PretrainedWeightsError(
            f"model.pretrained=timm:{name}: timm could not download the weights ({type(e).__name__}: {first}); on a "
            f"machine without the internet, fetch {timm_hub_file(name)} elsewhere and pass "
            f"model.pretrained=/path/to/model.safetensors{_hub_folder(name)} (HF_HUB_OFFLINE=1 makes this error "
            "immediate, without the download's retries)"
        ) from e
    timm_vit_kwargs(model)  # refuses what vitlab's ViT cannot express
    return model.state_dict()


def source_pretrained_cfg(source: str | Path) -> dict[str, Any]:
    """The ``pretrained_cfg`` that the weights ``source`` (see the module docstring) come with, as far as it says:
    timm's own for ``timm:NAME[.TAG]`` (``timm.models.get_pretrained_cfg``, no download); for a vitlab export, run
    directory or Lightning checkpoint the ``mean``, ``std`` and ``input_size`` of the data it was trained on (the
    export's ``config.json`` or the checkpoint's ``data_info``); ``{}`` for a bare weights file."""
    text = str(source)
    if text.startswith(TIMM_PREFIX):
        cfg = _timm_pretrained_cfg(text[len(TIMM_PREFIX) :])
        return {} if cfg is None else cfg.to_dict()
    path = Path(text).expanduser()
    candidates = [path / "config.json", path / "export" / "config.json", path / "checkpoints" / "best.ckpt"]
    for candidate in [path] if path.is_file() else candidates:
        if candidate.suffix == ".json" and candidate.is_file():
            return _data_cfg(json.loads(candidate.read_text()).get("data") or {})
        if candidate.suffix == ".ckpt" and candidate.is_file():
            ckpt = torch.load(candidate, map_location="cpu", weights_only=True)
            return _data_cfg(ckpt.get("hyper_parameters", {}).get("data_info") or {})
    return {}


def _data_cfg(info: dict[str, Any]) -> dict[str, Any]:
    """``pretrained_cfg`` keys from a run's data description (``vitlab.training.preflight.data_info``)."""
    if not info.get("mean"):
        return {}
    return {
        "mean": tuple(info["mean"]),
        "std": tuple(info["std"]),
        "input_size": (info["in_chans"], info["img_size"], info["img_size"]),
    }


# -------------------------------------------------------------------------------------------------------------------
# Fitting weights to a backbone.


def timm_vit_kwargs(model: nn.Module) -> dict[str, Any]:
    """vitlab ``VisionTransformer`` constructor arguments equivalent to a timm ``VisionTransformer``.

    Raises :class:`PretrainedWeightsError` naming the first feature vitlab's ViT cannot express (registers,
    qk-norm, LayerScale, pre-norm, another block or attention class...): such a model is refused, never mapped
    with a part dropped.
    """
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    name = type(model).__name__
    if not isinstance(model, TimmViT):
        raise PretrainedWeightsError(
            f"from_timm needs a timm.models.vision_transformer.VisionTransformer, got {name}; other families "
            "(DeiT distilled, Swin, EVA, ConvNeXt...) have no vitlab equivalent"
        )
    feature = next(itertools.chain(_embedding_features(model), _block_features(model), _head_features(model)), None)
    if feature is not None:
        raise PretrainedWeightsError(
            f"from_timm: this timm {name} uses {feature}, which vitlab's ViT does not have; only plain ViTs "
            "(class token, learned position embedding, pre-norm blocks, LayerNorm eps 1e-6, GELU MLP) map without "
            "losing part of the model"
        )
    pe, first = model.patch_embed, model.blocks[0]
    return dict(
        img_size=pe.img_size[0],
        patch_size=pe.patch_size[0],
        in_chans=pe.proj.in_channels,
        num_classes=model.head.out_features if isinstance(model.head, nn.Linear) else 0,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=first.attn.num_heads,
        mlp_ratio=first.mlp.fc1.out_features / model.embed_dim,
        qkv_bias=first.attn.qkv.bias is not None,
        global_pool=model.global_pool,
    )


def _embedding_features(model: nn.Module) -> Iterator[str]:
    """The features of a timm ViT's tokens, pooling, norms and patch embedding that vitlab's ViT lacks."""
    from timm.layers import PatchEmbed as TimmPatchEmbed

    identity = nn.Identity
    if getattr(model, "num_reg_tokens", 0):
        yield f"{model.num_reg_tokens} register tokens"
    if model.cls_token is None or model.num_prefix_tokens != 1:
        yield "no class token" if model.cls_token is None else f"{model.num_prefix_tokens} prefix tokens"
    if model.pos_embed is None:
        yield "no learned position embedding"
    if getattr(model, "no_embed_class", False):
        yield "no position embedding on the class token (no_embed_class)"
    if getattr(model, "dynamic_img_size", False):
        yield "dynamic image sizes"
    if not isinstance(getattr(model, "norm_pre", identity()), identity):
        yield "a norm before the blocks (pre_norm=True, CLIP style)"
    if not isinstance(getattr(model, "fc_norm", identity()), identity):
        yield "a norm after pooling (fc_norm)"
    if getattr(model, "attn_pool", None) is not None or model.global_pool not in ("token", "avg"):
        yield f"global_pool={model.global_pool!r}"
    if not isinstance(model.norm, nn.LayerNorm) or model.norm.eps != 1e-6:
        yield "a final norm other than LayerNorm(eps=1e-6)"
    pe = model.patch_embed
    if type(pe) is not TimmPatchEmbed or not isinstance(pe.norm, identity) or pe.proj.bias is None:
        yield "another patch embedding"
    if pe.img_size[0] != pe.img_size[1] or pe.patch_size[0] != pe.patch_size[1]:
        yield f"non-square images or patches ({pe.img_size}, {pe.patch_size})"
    if getattr(model, "patch_drop", None) is not None and not isinstance(model.patch_drop, identity):
        yield "patch dropout"


def _block_features(model: nn.Module) -> Iterator[str]:
    """The features of a timm ViT's blocks that vitlab's ViT lacks, each naming its block."""
    from timm.layers import Mlp
    from timm.models.vision_transformer import Attention as TimmAttention
    from timm.models.vision_transformer import Block as TimmBlock

    identity, embed_dim, first = nn.Identity, model.embed_dim, model.blocks[0]
    for i, block in enumerate(model.blocks):
        if type(block) is not TimmBlock:
            yield f"{type(block).__name__} blocks"
        attn = block.attn
        if type(attn) is not TimmAttention:
            yield f"{type(attn).__name__} attention in block {i}"
        for part, feature in (
            (attn.q_norm, "qk-norm"),
            (attn.k_norm, "qk-norm"),
            (getattr(attn, "norm", identity()), "a norm inside attention"),
            (block.ls1, "LayerScale (init_values)"),
            (block.ls2, "LayerScale (init_values)"),
            (getattr(block.mlp, "norm", identity()), "a norm inside the MLP"),
        ):
            if not isinstance(part, identity):
                yield f"{feature} (block {i})"
        if getattr(attn, "gate", None) is not None:
            yield f"gated attention (block {i})"
        if attn.proj.bias is None or attn.qkv.weight.shape != (3 * embed_dim, embed_dim):
            yield f"another attention projection shape (block {i})"
        if any(not isinstance(norm, nn.LayerNorm) or norm.eps != 1e-6 for norm in (block.norm1, block.norm2)):
            yield f"a block norm other than LayerNorm(eps=1e-6) (block {i})"
        if type(block.mlp) is not Mlp or type(block.mlp.act) is not nn.GELU or block.mlp.act.approximate != "none":
            yield f"an MLP other than Linear-GELU-Linear (block {i})"
        if (
            attn.num_heads != first.attn.num_heads
            or (attn.qkv.bias is None) != (first.attn.qkv.bias is None)
            or block.mlp.fc1.out_features != first.mlp.fc1.out_features
        ):
            yield f"blocks of different shapes (block {i})"


def _head_features(model: nn.Module) -> Iterator[str]:
    if not isinstance(model.head, nn.Linear | nn.Identity):
        yield f"a {type(model.head).__name__} head"

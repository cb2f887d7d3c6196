"""Pretrained weights for vitlab's ViTs: read them, fit them to the model, load them without a silent partial load.

``model.pretrained`` in a run config (or ``vitlab.create_model(..., pretrained=...)``) names one of:

- a local weights file: timm's or vitlab's ``.safetensors``, a ``.pth`` / ``.bin`` / ``.pt`` state dict (also one
  wrapped as ``{"state_dict": ...}``, ``{"model": ...}``, or a Lightning ``.ckpt``);
- a vitlab export folder (``model.safetensors`` + ``config.json``) or a run directory (its ``export/``, else
  ``checkpoints/best.ckpt``);
- ``timm:NAME[.TAG]``: the weights timm's own download gives ``timm.create_model(NAME, pretrained=True)``.

The weights go into the model's ViT backbone: the :class:`~vitlab.models.vit.VisionTransformer` itself, or the
``encoder`` of a :class:`~vitlab.models.vitcae.ViTCAE`. Before loading they are fitted to the backbone the way
timm fits them (Dosovitskiy et al. 2021, sec. 3.2, "Fine-tuning and higher resolution"):

- position embeddings resampled to the new patch grid (``timm.layers.resample_abs_pos_embed``, bicubic);
- the patch embedding resampled to a new patch size (``timm.layers.resample_patch_embed``, FlexiViT's
  pseudo-inverse resize) and adapted to a new number of input channels (``timm.models.adapt_input_conv``);
- the classifier head left at its fresh initialisation when ``num_classes`` differs.

vitlab's own extra that a plain ViT's weights lack keeps its initial value, which leaves the network's function
unchanged: the per-head temperature ``log_tau`` (0, i.e. tau = 1). Weights of a vitlab run whose heads were frozen
(ViTCAE eq. 26) have their heads put back in original order and their ``frozen_heads`` and ``head_order`` buffers
dropped (:func:`vitlab.layers.heads.state_in_original_order`). Any other key the backbone lacks or the file has in
excess, and any shape that no rule above fits, is a :class:`PretrainedWeightsError` that lists them; nothing is
loaded partially.

A model without a ViT backbone (CET-ViT, Swin) takes weights of its own architecture, a vitlab export or run of the
same preset and shape (:func:`load_whole_model`): its ``pretrained_cfg`` names the first convolution (where the
weights start) and the classifier (reset when the number of classes differs).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import CheckpointError
from vitlab.layers.heads import state_in_original_order
from vitlab.models.protocols import PretrainedConfigured
from vitlab.models.registry import constructor_args, get_preset, list_models
from vitlab.models.vit import VisionTransformer

log = logging.getLogger(__name__)

TIMM_PREFIX = "timm:"
#: file suffixes read with ``torch.load(weights_only=True)``
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
#: backbone keys that may be absent from pretrained weights: their initial values leave the function unchanged
OPTIONAL_KEYS = ("log_tau",)
#: prefixes under which checkpoints commonly keep a ViT (Lightning task, ViTCAE encoder, DDP, MAE/DINO style)
_ANCHOR = "patch_embed.proj.weight"
#: what an unexpected key says about the model it came from, for the error message
_FEATURE_HINTS = {
    "reg_token": "register tokens (Darcet et al. 2024)",
    "q_norm": "qk-norm",
    "k_norm": "qk-norm",
    ".ls1.": "LayerScale (init_values)",
    ".ls2.": "LayerScale (init_values)",
    "norm_pre": "a norm before the blocks (pre_norm, CLIP style)",
    "fc_norm": "a norm after pooling (fc_norm)",
    "attn_pool": "attention pooling (global_pool='map')",
    "attn.norm": "a norm inside attention (scale_attn_norm)",
    "mlp.norm": "a norm inside the MLP (scale_mlp_norm)",
}


class PretrainedWeightsError(CheckpointError):
    """Pretrained weights that cannot be read or do not fit the model."""


@dataclass
class LoadReport:
    """What :func:`load_pretrained` did. ``adapted``: one line per change (resampled, reset, kept at init)."""

    source: str
    prefix: str = ""
    adapted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = f"loaded pretrained weights from {self.source}"
        if self.prefix:
            text += f" (the tensors under {self.prefix!r})"
        notes = list(self.adapted)
        if self.ignored:
            notes.append(f"ignored {len(self.ignored)} tensors outside the ViT ({compress_keys(self.ignored)})")
        return "; ".join([text, *notes])


# -------------------------------------------------------------------------------------------------------------------
def compress_keys(keys: list[str], limit: int = 6) -> str:
    """``blocks.0.attn.qkv.weight, blocks.1.attn.qkv.weight`` -> ``blocks.{0,1}.attn.qkv.weight``; at most ``limit``
    patterns, then ``... (+n more)``: key lists that fit in a line of an error message."""
    groups: dict[str, list[str]] = {}
    for key in sorted(keys, key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)]):
        pattern = re.sub(r"\.(\d+)\.", ".#.", key, count=1)
        match = re.search(r"\.(\d+)\.", key)
        groups.setdefault(pattern, []).append(match.group(1) if match else "")
    out = []
    for pattern, indices in groups.items():
        if "#" in pattern and len(indices) == 1:
            out.append(pattern.replace("#", indices[0]))
        elif "#" in pattern:
            idx = indices if len(indices) <= 4 else [indices[0], "...", indices[-1]]
            out.append(pattern.replace("#", "{" + ",".join(idx) + "}"))
        else:
            out.append(pattern)
    more = f" ... (+{len(out) - limit} more)" if len(out) > limit else ""
    return ", ".join(out[:limit]) + more


def backbone_of(model: nn.Module) -> tuple[nn.Module, str]:
    """The ViT that pretrained weights initialise and its name in ``model``: the model itself for the ViT families
    (``vit_*``, ``tome_*``, the ``vit_matched_*`` baselines), ``encoder`` for ViTCAE."""
    if isinstance(model, VisionTransformer):
        return model, ""
    encoder = getattr(model, "encoder", None)
    if isinstance(encoder, VisionTransformer):
        return encoder, "encoder"
    raise PretrainedWeightsError(
        f"{type(model).__name__} has no ViT backbone that pretrained ViT weights fit; model.pretrained works for the "
        "ViT presets (vit_*, tome_*, vit_matched_*, tome_matched_*) and ViTCAE (its encoder)"
    )


# -------------------------------------------------------------------------------------------------------------------
# Reading weights.


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
    for candidate in (path / "model.safetensors", path / "export" / "model.safetensors"):
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


def timm_hub_file(name: str) -> str:
    """Where timm downloads ``NAME[.TAG]``'s weights from, to tell an offline user which file to fetch."""
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # timm raises RuntimeError or KeyError for unknown names
        cfg = None
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

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in (
        "1",
        "true",
        "yes",
        "on",
    )


def timm_weights_cached(name: str) -> bool:
    """True when ``NAME[.TAG]``'s weights file is in the local Hugging Face cache (timm then loads it offline)."""
    import huggingface_hub
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # timm raises RuntimeError or KeyError for unknown names
        return False
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
            "model.pretrained=/path/to/model.safetensors (or unset HF_HUB_OFFLINE where the internet is reachable)"
        )
    try:
        model = timm.create_model(name, pretrained=True)
    except Exception as e:  # huggingface_hub / urllib errors when offline, RuntimeError for an unknown tag
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise PretrainedWeightsError(
            f"model.pretrained=timm:{name}: timm could not download the weights ({type(e).__name__}: {first}); on a "
            f"machine without the internet, fetch {timm_hub_file(name)} elsewhere and pass "
            "model.pretrained=/path/to/model.safetensors (HF_HUB_OFFLINE=1 makes this error immediate, without "
            "the download's retries)"
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
        import timm

        try:
            cfg = timm.models.get_pretrained_cfg(text[len(TIMM_PREFIX) :])
        except Exception:  # timm raises RuntimeError or KeyError for unknown names
            cfg = None
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
    """``pretrained_cfg`` keys from a run's data description (``vitlab.training.run.data_info``)."""
    if not info.get("mean"):
        return {}
    return {
        "mean": tuple(info["mean"]),
        "std": tuple(info["std"]),
        "input_size": (info["in_chans"], info["img_size"], info["img_size"]),
    }


# -------------------------------------------------------------------------------------------------------------------
# Fitting weights to a backbone.


def _strip_to_backbone(state: dict[str, torch.Tensor], report: LoadReport) -> dict[str, torch.Tensor]:
    """The tensors of the one ViT in ``state`` with its prefix removed (``model.``, ``encoder.``, ``module.``...)."""
    anchors = [k for k in state if k == _ANCHOR or k.endswith("." + _ANCHOR)]
    if not anchors:
        raise PretrainedWeightsError(
            f"{report.source} holds no ViT weights (no {_ANCHOR}; its keys: {compress_keys(list(state), 4)}); pass "
            "the weights of a ViT (timm VisionTransformer or a vitlab ViT/ViTCAE)"
        )
    if len(anchors) > 1:
        raise PretrainedWeightsError(
            f"{report.source} holds several ViTs ({', '.join(a[: -len(_ANCHOR)] or '<top>' for a in anchors)}); "
            "save the one to load on its own"
        )
    prefix = anchors[0][: -len(_ANCHOR)]
    report.prefix = prefix
    if not prefix:
        return dict(state)
    report.ignored = [k for k in state if not k.startswith(prefix)]
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _grid(num_tokens: int, prefix: int, source: str) -> list[int]:
    side = round((num_tokens - prefix) ** 0.5)
    if side * side != num_tokens - prefix:
        raise PretrainedWeightsError(
            f"{source}: pos_embed has {num_tokens} tokens, which is not a CLS token plus a square patch grid; "
            "vitlab's ViT has one CLS token and square grids (timm models with no_embed_class or registers do not fit)"
        )
    return [side, side]


def fit_to_backbone(
    state: dict[str, torch.Tensor], backbone: VisionTransformer, report: LoadReport
) -> dict[str, torch.Tensor]:
    """Resample the position and patch embeddings and drop a head of another size, in a copy of ``state``."""
    from timm.layers import resample_abs_pos_embed, resample_patch_embed
    from timm.models import adapt_input_conv

    state = state_in_original_order(backbone, state)  # a copy; heads a frozen run reordered back in order
    target = backbone.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and pos.ndim == 3 and pos.shape != target["pos_embed"].shape:
        old = _grid(pos.shape[1], backbone.num_prefix_tokens, report.source)
        if pos.shape[2] == target["pos_embed"].shape[2]:
            state["pos_embed"] = resample_abs_pos_embed(
                pos, new_size=list(backbone.grid_size), old_size=old, num_prefix_tokens=backbone.num_prefix_tokens
            )
            report.adapted.append(
                f"pos_embed resampled from a {old[0]}x{old[1]} to a {backbone.grid_size[0]}x"
                f"{backbone.grid_size[1]} patch grid"
            )
    weight = state.get(_ANCHOR)
    want = target[_ANCHOR].shape  # [D, C, P, P]
    if weight is not None and weight.ndim == 4 and weight.shape[0] == want[0]:
        if weight.shape[2:] != want[2:]:
            state[_ANCHOR] = resample_patch_embed(weight, new_size=list(want[2:]))
            report.adapted.append(
                f"patch embedding resampled from {weight.shape[2]}x{weight.shape[3]} to {want[2]}x{want[3]} patches"
            )
        if state[_ANCHOR].shape[1] != want[1]:
            old_chans = state[_ANCHOR].shape[1]
            state[_ANCHOR] = adapt_input_conv(want[1], state[_ANCHOR].float(), base_chans=old_chans).to(weight.dtype)
            report.adapted.append(f"patch embedding adapted from {old_chans} to {want[1]} input channels")
    target_head = [k for k in target if k.startswith("head.")]
    if target_head and not any(k.startswith("head.") for k in state):  # e.g. a ViTCAE encoder or a timm backbone
        state.update({k: target[k] for k in target_head})
        report.adapted.append(f"head initialised for {backbone.num_classes} classes (the weights have none)")
    head_keys = [k for k in state if k.startswith("head.")]
    if head_keys and any(k not in target or state[k].shape != target[k].shape for k in head_keys):
        for k in head_keys:
            del state[k]
        state.update({k: v for k, v in target.items() if k.startswith("head.")})  # the fresh initialisation
        new = backbone.num_classes
        report.adapted.append("no classifier head (num_classes=0)" if new == 0 else f"head reset for {new} classes")
    filled = [k for k in target if k not in state and k.split(".")[-1] in OPTIONAL_KEYS]
    state.update({k: target[k] for k in filled})
    if any(k.endswith("log_tau") for k in filled):
        report.adapted.append("per-head temperatures start at tau = 1")
    return state


def key_problems(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> list[str]:
    """What keeps ``state`` from loading strictly into a module of state dict ``target``: missing, unexpected and
    mis-shaped keys, one phrase each; empty when it fits."""
    missing = [k for k in target if k not in state]
    unexpected = [k for k in state if k not in target]
    shapes = [k for k in target if k in state and state[k].shape != target[k].shape]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({compress_keys(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({compress_keys(unexpected)})")
    if shapes:
        first = shapes[0]
        problems.append(
            f"{len(shapes)} of another shape (e.g. {first}: file {list(state[first].shape)}, model "
            f"{list(target[first].shape)})"
        )
    return problems


def check_keys(state: dict[str, torch.Tensor], backbone: nn.Module, source: str, arch: str) -> None:
    """Raise :class:`PretrainedWeightsError` listing missing, unexpected and mis-shaped keys, if there are any."""
    target = backbone.state_dict()
    problems = key_problems(state, target)
    if not problems:
        return
    unexpected = [k for k in state if k not in target]
    if unexpected and all(k.endswith(".log_tau") for k in unexpected) and len(problems) == 1:
        raise PretrainedWeightsError(
            f"pretrained weights {source} have per-head temperatures (log_tau, e.g. from a ViTCAE encoder) that "
            f"{arch} has no place for; set model.temperature=true to load them"
        )
    features = sorted({hint for k in unexpected for key, hint in _FEATURE_HINTS.items() if key in k})
    why = f" The file's ViT has {', '.join(features)}, which vitlab's ViT does not." if features else ""
    matching = matching_presets(state, type(backbone))
    fix = (
        f"They have the shapes of {matching[0]}: set model.name={matching[0]}"
        if matching
        else "Pass weights of a ViT of the same width, depth and MLP ratio (image size, patch size, channels and "
        "classes may differ)"
    )
    raise PretrainedWeightsError(f"pretrained weights {source} do not fit {arch}: {'; '.join(problems)}.{why} {fix}")


def matching_presets(state: dict[str, torch.Tensor], cls: type[nn.Module]) -> list[str]:
    """The registered presets of ``cls`` whose width, depth and MLP width are those of the ViT weights ``state``
    (read from ``cls_token: [1, 1, C]``, the ``blocks.<i>.`` keys and ``blocks.0.mlp.fc1.weight: [C_mlp, C]``),
    the plain ``vit_*`` presets first."""
    token, fc1 = state.get("cls_token"), state.get("blocks.0.mlp.fc1.weight")
    if token is None or fc1 is None:
        return []
    width, hidden = int(token.shape[-1]), int(fc1.shape[0])
    depth = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
    found = []
    for name in list_models():
        preset = get_preset(name)
        if preset.cls is not cls:
            continue
        defaults = {k: p.default for k, p in constructor_args(cls).items() if p.default is not p.empty}
        kwargs = {**defaults, **preset.kwargs}
        if (kwargs.get("embed_dim"), kwargs.get("depth")) == (width, depth) and round(
            width * kwargs.get("mlp_ratio", 4.0)
        ) == hidden:
            found.append(name)
    plain = [name for name in found if name.startswith("vit_") and "matched" not in name]
    return plain + [name for name in found if name not in plain]


def load_pretrained(model: nn.Module, source: str | Path, arch: str | None = None) -> LoadReport:
    """Load the pretrained weights ``source`` (see the module docstring) into ``model``'s ViT backbone, strictly;
    a model without one takes the weights of its own architecture (:func:`load_whole_model`).

    Returns a :class:`LoadReport`; raises :class:`PretrainedWeightsError` when the weights cannot be read or do
    not fit (listing the keys), leaving ``model`` untouched.
    """
    try:
        backbone, where = backbone_of(model)
    except PretrainedWeightsError:  # CET-ViT, Swin: weights of the same architecture
        return load_whole_model(model, source, arch)
    raw, description = read_weights(source)
    report = LoadReport(description)
    state = _strip_to_backbone(raw, report)
    state = fit_to_backbone(state, backbone, report)
    label = (arch or type(model).__name__) + (f".{where}" if where else "")
    check_keys(state, backbone, description, label)
    target = backbone.state_dict()
    state = {k: v.to(dtype=target[k].dtype) for k, v in state.items()}
    backbone.load_state_dict(state, strict=True)
    model.pretrained_summary = report.summary()
    log.info(model.pretrained_summary)
    return report


def load_whole_model(model: nn.Module, source: str | Path, arch: str | None = None) -> LoadReport:
    """Weights of the same architecture into a model without a ViT backbone (CET-ViT, Swin), strictly: a vitlab
    export, run directory, Lightning checkpoint or weights file of a model of the same shape. The model's
    ``pretrained_cfg`` says where its weights start (``first_conv``: a prefix such as a Lightning task's ``model.``
    is removed) and which module is the classifier (``classifier``: left at its fresh initialisation when the
    number of classes differs, as timm does); any other missing, extra or mis-shaped key is a
    :class:`PretrainedWeightsError` that lists them."""
    if not isinstance(model, PretrainedConfigured):
        raise PretrainedWeightsError(
            f"{type(model).__name__} has no ViT backbone and no pretrained_cfg; model.pretrained works for models of "
            "timm's contract"
        )
    cfg = model.pretrained_cfg
    raw, description = read_weights(source)
    anchor = f"{cfg['first_conv']}.weight"
    anchors = [k for k in raw if k == anchor or k.endswith("." + anchor)]
    label = arch or type(model).__name__
    if len(anchors) != 1:
        raise PretrainedWeightsError(
            f"{description} holds {'no' if not anchors else 'several'} {label} ({anchor}; its keys: "
            f"{compress_keys(list(raw), 4)}); pass the weights of one {label} (a vitlab export or run of it)"
        )
    report = LoadReport(description, prefix=anchors[0][: -len(anchor)])
    state = {k[len(report.prefix) :]: v for k, v in raw.items() if k.startswith(report.prefix)}
    report.ignored = [k for k in raw if not k.startswith(report.prefix)]
    target = model.state_dict()
    head = f"{cfg['classifier']}."
    if any(k.startswith(head) and (k not in target or v.shape != target[k].shape) for k, v in state.items()):
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        state.update({k: v for k, v in target.items() if k.startswith(head)})
        report.adapted.append(f"{cfg['classifier']} reset for {model.num_classes} classes")
    problems = key_problems(state, target)
    if problems:
        raise PretrainedWeightsError(
            f"pretrained weights {description} do not fit {label}: {'; '.join(problems)}. {label} has no ViT backbone "
            f"that ViT weights fit, so model.pretrained takes weights of its own architecture: a vitlab export or run "
            f"of {label} with the same options (only the number of classes may differ)"
        )
    model.load_state_dict({k: v.to(dtype=target[k].dtype) for k, v in state.items()}, strict=True)
    model.pretrained_summary = report.summary()
    log.info(model.pretrained_summary)
    return report


# -------------------------------------------------------------------------------------------------------------------
# timm models.


def timm_vit_kwargs(model: nn.Module) -> dict[str, Any]:
    """vitlab ``VisionTransformer`` constructor arguments equivalent to a timm ``VisionTransformer``.

    Raises :class:`PretrainedWeightsError` naming the first feature vitlab's ViT cannot express (registers,
    qk-norm, LayerScale, pre-norm, another block or attention class...): such a model is refused, never mapped
    with a part dropped.
    """
    from timm.layers import Mlp
    from timm.layers import PatchEmbed as TimmPatchEmbed
    from timm.models.vision_transformer import Attention as TimmAttention
    from timm.models.vision_transformer import Block as TimmBlock
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    name = type(model).__name__

    def refuse(feature: str) -> PretrainedWeightsError:
        return PretrainedWeightsError(
            f"from_timm: this timm {name} uses {feature}, which vitlab's ViT does not have; only plain ViTs "
            "(class token, learned position embedding, pre-norm blocks, LayerNorm eps 1e-6, GELU MLP) map without "
            "losing part of the model"
        )

    if not isinstance(model, TimmViT):
        raise PretrainedWeightsError(
            f"from_timm needs a timm.models.vision_transformer.VisionTransformer, got {name}; other families "
            "(DeiT distilled, Swin, EVA, ConvNeXt...) have no vitlab equivalent"
        )
    identity = nn.Identity
    if getattr(model, "num_reg_tokens", 0):
        raise refuse(f"{model.num_reg_tokens} register tokens")
    if model.cls_token is None or model.num_prefix_tokens != 1:
        raise refuse("no class token" if model.cls_token is None else f"{model.num_prefix_tokens} prefix tokens")
    if getattr(model, "no_embed_class", False) or model.pos_embed is None:
        raise refuse(
            "no position embedding on the class token (no_embed_class)"
            if model.pos_embed is not None
            else "no learned position embedding"
        )
    if getattr(model, "dynamic_img_size", False):
        raise refuse("dynamic image sizes")
    for attr, feature in (
        ("norm_pre", "a norm before the blocks (pre_norm=True, CLIP style)"),
        ("fc_norm", "a norm after pooling (fc_norm)"),
    ):
        if not isinstance(getattr(model, attr, identity()), identity):
            raise refuse(feature)
    if getattr(model, "attn_pool", None) is not None or model.global_pool not in ("token", "avg"):
        raise refuse(f"global_pool={model.global_pool!r}")
    if not isinstance(model.norm, nn.LayerNorm) or model.norm.eps != 1e-6:
        raise refuse("a final norm other than LayerNorm(eps=1e-6)")
    pe = model.patch_embed
    if type(pe) is not TimmPatchEmbed or not isinstance(pe.norm, identity) or pe.proj.bias is None:
        raise refuse("another patch embedding")
    if pe.img_size[0] != pe.img_size[1] or pe.patch_size[0] != pe.patch_size[1]:
        raise refuse(f"non-square images or patches ({pe.img_size}, {pe.patch_size})")
    if getattr(model, "patch_drop", None) is not None and not isinstance(model.patch_drop, identity):
        raise refuse("patch dropout")
    embed_dim = model.embed_dim
    blocks = list(model.blocks)
    first = blocks[0]
    for i, block in enumerate(blocks):
        if type(block) is not TimmBlock:
            raise refuse(f"{type(block).__name__} blocks")
        attn = block.attn
        if type(attn) is not TimmAttention:
            raise refuse(f"{type(attn).__name__} attention in block {i}")
        for part, feature in (
            (attn.q_norm, "qk-norm"),
            (attn.k_norm, "qk-norm"),
            (getattr(attn, "norm", identity()), "a norm inside attention"),
            (block.ls1, "LayerScale (init_values)"),
            (block.ls2, "LayerScale (init_values)"),
            (getattr(block.mlp, "norm", identity()), "a norm inside the MLP"),
        ):
            if not isinstance(part, identity):
                raise refuse(f"{feature} (block {i})")
        if getattr(attn, "gate", None) is not None:
            raise refuse(f"gated attention (block {i})")
        if attn.proj.bias is None or attn.qkv.weight.shape != (3 * embed_dim, embed_dim):
            raise refuse(f"another attention projection shape (block {i})")
        for norm in (block.norm1, block.norm2):
            if not isinstance(norm, nn.LayerNorm) or norm.eps != 1e-6:
                raise refuse(f"a block norm other than LayerNorm(eps=1e-6) (block {i})")
        if type(block.mlp) is not Mlp or type(block.mlp.act) is not nn.GELU or block.mlp.act.approximate != "none":
            raise refuse(f"an MLP other than Linear-GELU-Linear (block {i})")
        same = (
            attn.num_heads == first.attn.num_heads
            and (attn.qkv.bias is None) == (first.attn.qkv.bias is None)
            and block.mlp.fc1.out_features == first.mlp.fc1.out_features
        )
        if not same:
            raise refuse(f"blocks of different shapes (block {i})")
    head = model.head
    if not isinstance(head, nn.Linear | identity):
        raise refuse(f"a {type(head).__name__} head")
    return dict(
        img_size=pe.img_size[0],
        patch_size=pe.patch_size[0],
        in_chans=pe.proj.in_channels,
        num_classes=head.out_features if isinstance(head, nn.Linear) else 0,
        embed_dim=embed_dim,
        depth=len(blocks),
        num_heads=first.attn.num_heads,
        mlp_ratio=first.mlp.fc1.out_features / embed_dim,
        qkv_bias=first.attn.qkv.bias is not None,
        global_pool=model.global_pool,
    )

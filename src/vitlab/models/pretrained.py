"""Pretrained weights for vitlab's ViTs: read them, fit them to the model, load them without a silent partial load.

``model.pretrained`` (or ``vitlab.create_model(..., pretrained=...)``) names a weights file, a vitlab export folder
or run directory, or ``timm:NAME[.TAG]`` (:func:`vitlab.models.weight_sources.read_weights`). The weights go into the
model's ViT backbone (the ViT itself, or a ViTCAE's ``encoder``), fitted to it the way timm fits them (Dosovitskiy et
al. 2021, sec. 3.2): position embeddings resampled to the new grid, the patch embedding resampled to a new patch
size and adapted to a new channel count, the head left fresh when ``num_classes`` differs; vitlab's ``log_tau``
keeps its initial 0 (tau = 1), and frozen heads (ViTCAE eq. 26) come back in original order
(:func:`vitlab.layers.heads.state_in_original_order`). Any other mismatch is a :class:`PretrainedWeightsError`
that lists the keys; nothing is loaded partially. A model without a ViT backbone (CET-ViT, Swin) takes weights of
its own preset and shape (:func:`load_whole_model`). The rules and their messages: docs/pretrained.md.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from vitlab.layers.heads import state_in_original_order
from vitlab.models.protocols import EncoderBacked, PretrainedConfigured
from vitlab.models.registry import constructor_args, get_preset, list_models
from vitlab.models.timm_models import checkpoint_filter
from vitlab.models.vit import VisionTransformer
from vitlab.models.weight_sources import TIMM_PREFIX, PretrainedWeightsError, check_timm_folder, read_weights

log = logging.getLogger(__name__)

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
    """The ViT that pretrained weights initialise and its name in ``model``: the model itself for a
    :class:`VisionTransformer` (the ViT and ToMe presets), the ``encoder`` of an :class:`EncoderBacked` model
    (ViTCAE)."""
    backbone, where = (model.encoder, "encoder") if isinstance(model, EncoderBacked) else (model, "")
    if isinstance(backbone, VisionTransformer):
        return backbone, where
    raise PretrainedWeightsError(
        f"{type(model).__name__} has no ViT backbone that pretrained ViT weights fit; model.pretrained works for the "
        "ViT and ToMe presets and the generative models whose encoder is a ViT"
    )


# -------------------------------------------------------------------------------------------------------------------
# Reading weights.


def _strip_to_backbone(state: dict[str, torch.Tensor], report: LoadReport) -> dict[str, torch.Tensor]:
    """The tensors of the one ViT in ``state`` with its prefix removed (``model.``, ``encoder.``, ``module.``...)."""
    anchors = [k for k in state if k == _ANCHOR or k.endswith("." + _ANCHOR)]
    if not anchors:
        raise PretrainedWeightsError(
            f"{report.source} holds no ViT weights (no {_ANCHOR}; its keys: {compress_keys(list(state), 4)}); pass "
            "the weights of a ViT (timm VisionTransformer or a vitlab model built on one)"
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
            f"pretrained weights {source} have per-head temperatures (log_tau, from an encoder with temperatures) that "
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
    if arch and arch.startswith(TIMM_PREFIX):
        check_timm_folder(source, arch.removeprefix(TIMM_PREFIX))
    raw, description = read_weights(source)
    anchor = f"{cfg['first_conv']}.weight"
    anchors = [k for k in raw if k == anchor or k.endswith("." + anchor)]
    label = arch or type(model).__name__
    if len(anchors) != 1:
        raise PretrainedWeightsError(
            f"{description} holds {'no' if not anchors else 'several'} {label} ({anchor}; its keys: "
            f"{compress_keys(list(raw), 4)}); pass the weights of one {label} (a vitlab export or run of it, or the "
            "state dict its library saved)"
        )
    report = LoadReport(description, prefix=anchors[0][: -len(anchor)])
    state = {k[len(report.prefix) :]: v for k, v in raw.items() if k.startswith(report.prefix)}
    state = state_in_original_order(model, state)  # heads a frozen run reordered (a timm ViT's taken-over Attention)
    report.ignored = [k for k in raw if not k.startswith(report.prefix)]
    state = _fit_whole_model(state, model, arch, report)
    target = model.state_dict()
    problems = key_problems(state, target)
    if problems:
        raise PretrainedWeightsError(
            f"pretrained weights {description} do not fit {label}: {'; '.join(problems)}. {label} has no ViT backbone "
            f"that ViT weights fit, so model.pretrained takes weights of its own architecture: a vitlab export or run "
            f"of {label}, or the state dict its library saved, with the same options (the number of classes and input "
            "channels may differ)"
        )
    model.load_state_dict({k: v.to(dtype=target[k].dtype) for k, v in state.items()}, strict=True)
    model.pretrained_summary = report.summary()
    log.info(model.pretrained_summary)
    return report


def _fit_whole_model(
    state: dict[str, torch.Tensor], model: nn.Module, arch: str | None, report: LoadReport
) -> dict[str, torch.Tensor]:
    """``state`` fitted to ``model`` as timm's ``load_pretrained`` fits a checkpoint: a ``timm:NAME`` model's own
    ``checkpoint_filter_fn`` (position and patch embeddings resampled), the first convolution adapted to the model's
    input channels (``adapt_input_conv``), the classifier left at its fresh initialisation for another number of
    classes, vitlab's ``log_tau`` at its initial 0 (tau = 1) where the file has none."""
    from timm.models import adapt_input_conv

    cfg, target = model.pretrained_cfg, model.state_dict()
    fit = checkpoint_filter(arch) if arch and arch.startswith(TIMM_PREFIX) else None
    if fit is not None:
        fitted = fit(state, model)
        resampled = [k for k, v in fitted.items() if k in state and v.shape != state[k].shape]
        if resampled:
            report.adapted.append(f"{compress_keys(resampled)} resampled to the model's by timm's checkpoint filter")
        state = fitted
    conv = f"{cfg['first_conv']}.weight"
    weight, want = state.get(conv), target.get(conv)
    if weight is not None and want is not None and weight.ndim == 4 and weight.shape[1] != want.shape[1]:
        state[conv] = adapt_input_conv(want.shape[1], weight.float(), base_chans=weight.shape[1]).to(weight.dtype)
        report.adapted.append(f"{cfg['first_conv']} adapted from {weight.shape[1]} to {want.shape[1]} input channels")
    head = f"{cfg['classifier']}."
    if any(k.startswith(head) and (k not in target or v.shape != target[k].shape) for k, v in state.items()):
        state = {k: v for k, v in state.items() if not k.startswith(head)}
        state.update({k: v for k, v in target.items() if k.startswith(head)})
        report.adapted.append(f"{cfg['classifier']} reset for {model.num_classes} classes")
    filled = [k for k in target if k not in state and k.split(".")[-1] in OPTIONAL_KEYS]
    state.update({k: target[k] for k in filled})
    return state

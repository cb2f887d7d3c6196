"""What the controller measures its heads on and how: the probe images, the controlled modules, the probe pass
(CLS-to-patch distributions and consensus clusters, ViTCAE eq. 19 and section "Consensus clusters") and its
record."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from vitlab.config.dynamics import TAU_MODES, TEMPERATURE_FIX, DynamicsConfig
from vitlab.diagnostics.capture import attention_recording, unread_attention
from vitlab.diagnostics.dynamics import attention_to_cls_distribution, consensus_clusters
from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention
from vitlab.layers.capture import attention_capture, attention_modules, is_attention
from vitlab.layers.head_steering import SteeredHeads, steer, steerable
from vitlab.models.contract import module_mode
from vitlab.models.protocols import DynamicsTarget


@dataclass
class ProbeMeasurement:
    """What one probe pass measures for ``L`` controlled layers of ``H`` heads on ``P`` probe images.

    Attributes:
        distributions: CLS-to-patch attention renormalised over the ``N`` patches, ``[L, H, P, N]`` float32 (CPU).
        kappa: consensus clusters, mean over the first ``kappa_images`` probe images, ``[L, H]`` float64; ``None``
            when the pass did not count them (``kappa_every``, or the adaptive probe's extension).
    """

    distributions: torch.Tensor
    kappa: torch.Tensor | None


@contextlib.contextmanager
def unit_temperature(modules: list[Attention]) -> Iterator[None]:
    """Inside: tau = 1 in every module that has a temperature. After: the exact previous ``log_tau`` again."""
    with_tau = [m for m in modules if m.log_tau is not None]
    saved = [m.log_tau.detach().clone() for m in with_tau]
    try:
        with torch.no_grad():
            for module in with_tau:
                module.log_tau.zero_()
        yield
    finally:
        with torch.no_grad():
            for module, log_tau in zip(with_tau, saved, strict=True):
                module.log_tau.copy_(log_tau)


def head_temperatures(modules: list[Attention | ObservedAttention]) -> torch.Tensor:
    """``tau: [L, H]`` float64 of ``modules``' heads, by original head (1 where a module has no temperature)."""
    return torch.stack(
        [
            torch.ones(m.num_heads, dtype=torch.float64) if m.tau is None else m.tau.detach().double().cpu()
            for m in modules
        ]
    )


@torch.no_grad()
def set_head_temperatures(modules: list[Attention], tau: torch.Tensor, heads: torch.Tensor) -> None:
    """Write ``tau: [L, H]`` into the heads of ``modules`` marked in ``heads: [L, H]`` bool, by original head (as
    ``log_tau``)."""
    for module, values, mask in zip(modules, tau, heads, strict=True):
        if mask.any():
            slots = module.head_slots[mask.cpu()].to(module.log_tau.device)  # parameters are in slot order
            module.log_tau[slots] = values[mask].log().to(module.log_tau)


def controlled_modules(model: nn.Module, target: str | None) -> list[tuple[str, Attention]]:
    """The shared ``Attention`` modules the controller acts on, in forward order (see ``DynamicsConfig.target``)."""
    modules = attention_modules(model)
    if not modules:
        raise ConfigError(
            f"{type(model).__name__} has no vitlab.layers.Attention module; the dynamics controller needs a model "
            "built from vitlab's shared layers"
        )
    if target is None and isinstance(model, DynamicsTarget):
        target = model.dynamics_target
    if target is None:
        with_temperature = [(n, m) for n, m in modules if m.log_tau is not None]
        return with_temperature or modules
    chosen = [(n, m) for n, m in modules if n.startswith(target)]
    if not chosen:
        raise ConfigError(
            f"dynamics.target={target!r} matches no attention module; available: {[n for n, _ in modules]}"
        )
    return chosen


@dataclass(frozen=True)
class ObservedAttention:
    """An attention operation that the controller reads (:mod:`vitlab.diagnostics.capture`) but cannot steer: not
    vitlab's ``Attention``, so no temperature and no head to freeze."""

    num_heads: int
    log_tau: None = None
    tau: None = None


def attention_classes(model: nn.Module) -> list[str]:
    """The class names of the model's attention modules (``["EvaAttention"]``; none in a CNN), for messages."""
    return sorted({type(m).__name__ for m in model.modules() if is_attention(m)})


def attention_kinds(model: nn.Module) -> str:
    """``"Eva attends with EvaAttention"``: the model's class and the classes of its attention modules, for messages."""
    kinds = ", ".join(attention_classes(model)) or "operations of no attention module"
    return f"{type(model).__name__} attends with {kinds}"


def has_class_token(model: nn.Module) -> bool:
    """Whether the tokens of the model built start with a CLS token: its ``cls_token`` (timm's and vitlab's ViTs; None
    without one, whatever their register tokens), else a ``num_prefix_tokens`` above 0; a model with neither is
    taken to have one."""
    holder = next((m for m in model.modules() if hasattr(m, "cls_token")), None)
    if holder is not None:
        return holder.cls_token is not None
    return _model_attribute(model, "num_prefix_tokens") != 0


def no_class_token(model: nn.Module) -> str:
    return (
        f"{type(model).__name__} has no CLS token, and the drift reads the CLS row of attention; choose a model "
        "with a class token (e.g. model.class_token=true for timm's ViT)"
    )


def observed_modules(
    model: nn.Module, config: DynamicsConfig, example: torch.Tensor | None, tokens: int
) -> list[tuple[str, ObservedAttention | SteeredHeads]]:
    """The attention of a model without vitlab's ``Attention`` that the controller observes: every attention over
    all ``tokens`` (prefix and patches) that ``model.forward_features(example)`` computes (under ``config.target``),
    each as its :class:`~vitlab.layers.head_steering.SteeredHeads` where vitlab reaches every head's query and key
    (HF's ``q_proj``/``k_proj``, timm's ``q_norm``/``k_norm``, ``nn.MultiheadAttention``), else read only. Refused,
    every reason in one message: a model whose attention has no CLS row over the image (no class token, windows
    only), and the temperature modes and freezing where a head cannot be reached (:func:`unsteerable`)."""
    problems, chosen = [], []
    if not has_class_token(model):
        problems.append(no_class_token(model))
    else:
        chosen, found = _attention_over(model, config, example, tokens)
        if not chosen:
            problems.append(
                f"{attention_kinds(model)}, and none of its attention covers the {tokens} tokens of the image "
                f"({found or 'none captured'}): the drift needs a CLS row over every patch, among all the tokens, "
                "which windowed attention (Swin) and class attention (CaiT) have not; check dynamics.target"
            )
    modules = {name: model.get_submodule(name) for name, _ in chosen if "#" not in name}
    refused = unsteerable(model, [modules.get(name) for name, _ in chosen])
    if config.mode in TAU_MODES and refused:
        problems.append(
            f"dynamics.mode={config.mode} sets a per-head temperature, but {refused}, whose heads vitlab cannot "
            f"scale ({STEERABLE}); use dynamics.mode=fixed"
        )
    if config.freezes_heads and refused:
        problems.append(
            f"dynamics.freeze=true freezes heads whose parameters vitlab knows ({STEERABLE}), but {refused}; "
            "set dynamics.freeze=false to observe its heads"
        )
    if config.freezes_heads and not refused and chosen:
        shared = {n: steer(m).pattern_parameters() for n, m in modules.items() if steer(m).pattern_parameters()}
        if shared:
            name, parameters = next(iter(shared.items()))
            problems.append(
                f"dynamics.freeze=true freezes heads, but {name} ({type(modules[name]).__name__}) holds "
                f"{', '.join(parameters)}, shared by all its heads, which would move a frozen head's pattern; "
                "set dynamics.freeze=false"
            )
    if problems:
        raise ConfigError(". Also, ".join(problems))
    if chosen and not refused:
        return [(name, steer(modules[name])) for name, _ in chosen]
    return chosen


#: what vitlab can steer, for messages
STEERABLE = "vitlab's, timm's with q_norm/k_norm, HF's with q_proj/k_proj, nn.MultiheadAttention"


def unsteerable(model: nn.Module, modules: list[nn.Module | None]) -> str:
    """``"Swin attends with WindowAttention"`` when some of ``modules`` (all the model's attention when empty; None:
    a second matrix in one module) is attention whose heads vitlab cannot reach
    (:func:`~vitlab.layers.head_steering.steerable`), else ``""``."""
    modules = modules or [m for m in model.modules() if is_attention(m)]
    kinds = sorted({type(m).__name__ for m in modules if m is not None and not steerable(m)})
    if None in modules and not kinds:
        kinds = ["attention computed twice in one module"]
    return f"{type(model).__name__} attends with {', '.join(kinds)}" if kinds else ""


def _attention_over(
    model: nn.Module, config: DynamicsConfig, example: torch.Tensor | None, tokens: int
) -> tuple[list[tuple[str, ObservedAttention]], str]:
    """The attention over all ``tokens`` that ``model.forward_features(example)`` computes (under ``config.target``),
    and what it computed: ``"blocks.0.attn (4 windows of 4), ..."``."""
    if example is None:
        raise ConfigError(
            "the controller reads the attention of a model without vitlab's Attention on an example: "
            "pass example=[1, C, H, W] to check()"
        )
    return _observable(model, example, config.target, tokens)


def _observable(
    model: nn.Module, example: torch.Tensor, target: str | None, tokens: int
) -> tuple[list[tuple[str, ObservedAttention]], str]:
    """The attention among all ``tokens`` (each a query and a key) that ``model.forward_features(example)``
    computes under ``target``, and what it computed: ``"blocks.0.attn (4 windows of 4), ..."``. Refused when some
    attention there is attention the capture cannot read (a learned mix across heads: CaiT's talking heads): never
    observed in part."""
    with torch.no_grad(), module_mode(model, training=False), attention_recording(model) as record:
        getattr(model, "forward_features", model)(example.to(next(model.parameters()).device))
    chosen = [
        (name, ObservedAttention(probs.shape[1]))
        for name, probs in record.maps.items()
        if name not in record.windows
        and probs.shape[-2:] == (tokens, tokens)
        and (target is None or name.startswith(target))
    ]
    if any(target is None or name.startswith(target) for name in record.unread):
        readable = ", ".join(name for name, _ in chosen)
        fix = f"set dynamics.target to a prefix of {readable}" if chosen else "choose another model"
        raise ConfigError(f"{type(model).__name__} {unread_attention(record)}; {fix}")
    found = ", ".join(
        f"{n} ({record.windows[n]} windows of {p.shape[-1]})" if n in record.windows else f"{n} {list(p.shape)}"
        for n, p in record.maps.items()
    )
    return chosen, found


def modules_to_control(
    model: nn.Module, config: DynamicsConfig, example: torch.Tensor | None
) -> tuple[list[tuple[str, Attention | ObservedAttention]], Any]:
    """The attention the controller acts on (vitlab's ``Attention``: :func:`controlled_modules`) or observes (any
    other: :func:`observed_modules`, found by running ``example``), and the model's patch grid; a model without a CLS
    token (:func:`has_class_token`) or a patch grid (a CNN), modules of several head counts, and a mode that changes
    tau for modules without a temperature are refused."""
    grid = patch_grid(model)
    if grid is None:
        what = "no attention module and no patch grid" if not attention_classes(model) else "no patch grid (grid_size)"
        raise ConfigError(
            f"{type(model).__name__} has {what}, and the dynamics controller measures how each attention head's CLS "
            "row moves over the patches; train it without the controller (dynamics=null)"
        )
    if attention_modules(model):
        if not has_class_token(model):
            raise ConfigError(no_class_token(model))
        named = controlled_modules(model, config.target)
    else:
        tokens = (_model_attribute(model, "num_prefix_tokens") or 1) + int(grid[0]) * int(grid[1])
        named = observed_modules(model, config, example, tokens)
    heads = {m.num_heads for _, m in named}
    if len(heads) != 1:
        raise ConfigError(
            f"the controlled attention modules have different head counts {sorted(heads)}; choose modules of "
            "one kind with dynamics.target"
        )
    without = [n for n, m in named if m.log_tau is None]
    if config.mode in TAU_MODES and without:
        raise ConfigError(
            f"dynamics.mode={config.mode!r} needs a temperature in every controlled module, but {without} have "
            f"none; {TEMPERATURE_FIX}"
        )
    return named, grid


def captured_attention(
    model: nn.Module, forward: Callable[[torch.Tensor], Any], images: torch.Tensor, names: list[str], observed: bool
) -> dict[str, torch.Tensor]:
    """``forward(images)`` with the attention of ``model`` captured: vitlab's ``Attention`` modules ``names``
    through their switch, or, when the attention is ``observed`` (:func:`observed_modules`), every attention
    through :func:`~vitlab.diagnostics.capture.attention_recording`."""
    if observed:
        with attention_recording(model) as record:
            forward(images)
        return record.maps
    with attention_capture(model, names) as capture:
        forward(images)
        return capture.collect()


@torch.no_grad()
def measure_heads(
    model: nn.Module,
    named: list[tuple[str, Attention | ObservedAttention]],
    probe: torch.Tensor,
    config: DynamicsConfig,
    num_prefix_tokens: int,
    *,
    kappa: bool = True,
    probe_tau: str | None = None,
    timed: Callable[..., Any] = lambda part, fn, *args, **kwargs: fn(*args, **kwargs),
) -> ProbeMeasurement:
    """Push ``probe: [P, C, H, W]`` through ``model`` (eval mode, the ``named`` modules' attention captured, at the
    temperature ``probe_tau`` says, default the config's) and measure the CLS-to-patch distributions of every head
    and (with ``kappa``) its consensus clusters (``timed("kappa", ...)``)."""
    names, modules = [n for n, _ in named], [m for _, m in named]
    forward = getattr(model, "forward_features", model)
    distributions, kappa_sum = [], torch.zeros(len(modules), modules[0].num_heads, dtype=torch.float64)
    kappa_images, kappa_dtype = min(config.kappa_images, len(probe)) if kappa else 0, getattr(torch, config.kappa_dtype)
    grid = patch_grid(model)
    tokens = num_prefix_tokens + int(grid[0]) * int(grid[1])
    probe_tau = config.probe_tau if probe_tau is None else probe_tau
    temperature = unit_temperature(modules) if probe_tau == "unit" else contextlib.nullcontext()
    observed = not isinstance(modules[0], Attention)  # read by operation type, steered or not
    with module_mode(model, training=False), temperature:
        for start in range(0, len(probe), config.probe_batch_size):
            images = probe[start : start + config.probe_batch_size].to(next(model.parameters()).device)
            maps = captured_attention(model, forward, images, names, observed)
            chunk = []
            for layer, name in enumerate(names):
                attn = _checked_map(model, maps, name, tokens, num_prefix_tokens)  # [b, H, T, T]
                chunk.append(attention_to_cls_distribution(attn, num_prefix_tokens).cpu())
                if start < kappa_images:
                    clusters = timed(
                        "kappa", consensus_clusters, attn[: kappa_images - start], config.eps, dtype=kappa_dtype
                    )
                    kappa_sum[layer] += clusters.sum(0).cpu()
            distributions.append(torch.stack(chunk).transpose(1, 2))  # [L, H, b, N]
    return ProbeMeasurement(torch.cat(distributions, dim=2), kappa_sum / kappa_images if kappa else None)


def _checked_map(model: nn.Module, maps: dict[str, torch.Tensor], name: str, tokens: int, prefix: int) -> torch.Tensor:
    """``name``'s captured attention ``[b, H, T, T]`` float32, refused unless over the ``tokens`` of the patch grid
    and its ``prefix`` tokens."""
    if name not in maps:
        raise RuntimeError(
            f"{name} captured no attention in {type(model).__name__}.forward_features; "
            "choose modules on the encoder path with dynamics.target"
        )
    attn = maps[name].float()
    if attn.shape[-1] != tokens:
        raise ConfigError(
            f"{name} attends over {attn.shape[-1]} tokens, but the patch grid has {tokens - prefix} patches and "
            f"{prefix} prefix token(s); control the encoder's attention (dynamics.target)"
        )
    return attn


def patch_grid(model: nn.Module) -> tuple[int, int] | None:
    """The patch grid of ``model``: its ``grid_size`` (timm's, vitlab's), else the image size over the patch size of
    its first module that has both (HF transformers' patch embeddings, torchvision's ``VisionTransformer``)."""
    grid = _model_attribute(model, "grid_size")
    if grid is not None:
        return grid
    for module in model.modules():
        size, patch = getattr(module, "image_size", None), getattr(module, "patch_size", None)
        if size is not None and patch is not None:
            size, patch = (
                (size, size) if isinstance(size, int) else size,
                (patch, patch) if isinstance(patch, int) else patch,
            )
            return int(size[0]) // int(patch[0]), int(size[1]) // int(patch[1])
    return None


def _model_attribute(model: nn.Module, name: str) -> Any:
    """``name`` on the model or, failing that, on its first submodule that has it (e.g. ``model.encoder``)."""
    for module in model.modules():
        if hasattr(module, name):
            return getattr(module, name)
    return None


def select_probe(loader: Any, size: int, seed: int | None) -> torch.Tensor:
    """The probe images ``[P, C, H, W]`` from an ordered (not shuffled) loader of ``(x, y)`` batches.

    ``seed`` picks a random subset of ``min(size, len(dataset))`` images (kept in loader order); ``None`` takes the
    first ones. Only the chosen images are kept while the loader is read. The global RNG is left untouched.
    """
    total = len(loader.dataset)
    if total == 0:
        raise ConfigError("the validation set is empty; the dynamics controller needs validation images to probe")
    if size > total:
        rank_zero_warn(f"dynamics.probe_size={size} but the validation set has {total} images; probing all of them")
        size = total
    if seed is None:
        wanted = torch.arange(size)
    else:
        wanted = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    chosen, position = [], 0
    with torch.random.fork_rng(devices=[]):  # a DataLoader draws its base seed from the global RNG
        for batch in loader:
            images = batch[0] if isinstance(batch, list | tuple) else batch
            in_batch = wanted[(wanted >= position) & (wanted < position + len(images))] - position
            chosen.append(images[in_batch])
            position += len(images)
            if position > wanted[-1]:
                break
    return torch.cat(chosen)

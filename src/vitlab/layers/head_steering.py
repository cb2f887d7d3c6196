"""Steering the heads of attention vitlab did not build: the per-head temperature (ViTCAE eq. 19) and the freezing of
heads (eq. 26) on HF transformers', torchvision's and timm's attention modules, found by their parameter layout, never
by replacing their class.

A head is reachable where vitlab can find its query and its key and the rows of the parameters that make them:

- ``projections``: separate ``q_proj``, ``k_proj``, ``v_proj`` linear maps and ``num_attention_heads`` (HF
  transformers' ViT family: ``ViTAttention``, ``DeiTAttention``, ``Dinov2Attention``, ``SwinAttention``, ...): forward
  hooks on the ``q_proj`` and ``k_proj`` outputs ``[B, N, H d]``;
- ``qk_norm``: ``q_norm`` and ``k_norm`` modules applied to ``[B, H, N, d]`` (timm's ``Attention`` with or without
  qk-norm, EVA's ``EvaAttention``, fused ``qkv`` or separate projections): forward hooks on their outputs, so the
  temperature scales q after its normalisation and before the rotary embedding (a rotation, which keeps the scale);
- ``in_proj``: ``nn.MultiheadAttention`` with one ``in_proj_weight`` (torchvision's ViT): q rows ``0..C``, k rows
  ``C..2C``, ``d`` rows per head; for the call, a forward pre-hook hands ``F.multi_head_attention_forward`` the
  steered weight (q rows scaled by tau, a frozen head's q and k rows detached) and a forward hook puts the parameter
  back, as ``torch.func.functional_call`` does.

The temperature is ``log_tau: [H]``, a parameter registered on the attention module (tau = 1 at first), used as in
:class:`~vitlab.layers.attention.Attention`: ``inverse`` multiplies the logits by tau, ``divide`` divides them.
With tau = 1 and no head frozen the hooks return nothing, so the module computes what it computed before, bit for
bit. A frozen head's q and k are detached (its pattern a constant of the backward pass, no gradient to its q and k
rows or its tau); on the ``in_proj`` layout its rows are, so the input gradient through its q and k is kept. Keeping
its rows bit-identical through an optimizer step (weight decay, moments) is :class:`vitlab.dynamics.SteeredHeadGuard`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import Attention

#: what follows the heads' attention (the output projection, an inner norm): never part of a head's pattern
OUTPUT_PROJECTIONS = ("o_proj", "proj", "out_proj", "norm")


@dataclass(frozen=True)
class HeadRows:
    """The rows of one of q, k, v of a head: ``parameter[offset + h d : offset + (h + 1) d]`` for head ``h``."""

    name: str
    parameter: nn.Parameter
    offset: int


def _fused_rows(params: list[tuple[str, nn.Parameter | None]], width: int) -> dict[str, list[HeadRows]]:
    """The rows of q, k, v in fused parameters (``qkv``, ``in_proj``): q rows ``0..C``, k ``C..2C``, v ``2C..3C``."""
    return {part: [HeadRows(n, p, i * width) for n, p in params if p is not None] for i, part in enumerate("qkv")}


def _layout(module: nn.Module) -> tuple[str, int, int, dict[str, list[HeadRows]]] | None:
    """``(kind, heads, head width, rows of q, k, v)`` of an attention module vitlab can steer, else None."""
    if isinstance(module, nn.MultiheadAttention):
        if not module._qkv_same_embed_dim or module.in_proj_weight is None:
            return None
        params = [("in_proj_weight", module.in_proj_weight), ("in_proj_bias", module.in_proj_bias)]
        return "in_proj", module.num_heads, module.head_dim, _fused_rows(params, module.embed_dim)
    separate = all(isinstance(getattr(module, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj"))
    normed = all(isinstance(getattr(module, n, None), nn.Module) for n in ("q_norm", "k_norm"))
    if separate and isinstance(getattr(module, "num_attention_heads", None), int):
        kind, heads = "projections", module.num_attention_heads
    elif normed and not isinstance(module, Attention) and isinstance(getattr(module, "num_heads", None), int):
        kind, heads = "qk_norm", module.num_heads
    else:
        return None
    if kind == "qk_norm" and isinstance(getattr(module, "qkv", None), nn.Linear):
        width = module.qkv.out_features // 3
        rows = _fused_rows([("qkv.weight", module.qkv.weight), ("qkv.bias", module.qkv.bias)], width)
        for part in "qkv":  # EVA's separate q_bias, k_bias, v_bias beside a bias-free qkv
            bias = getattr(module, f"{part}_bias", None)
            if isinstance(bias, nn.Parameter):
                rows[part].append(HeadRows(f"{part}_bias", bias, 0))
        return kind, heads, width // heads, rows
    if not separate:
        return None
    linears = {part: getattr(module, f"{part}_proj") for part in "qkv"}  # weight and bias, where it has one
    rows = {part: [HeadRows(f"{part}_proj.{n}", p, 0) for n, p in m.named_parameters()] for part, m in linears.items()}
    return kind, heads, module.q_proj.out_features // heads, rows


def steerable(module: nn.Module) -> bool:
    """Whether vitlab can reach each head's query and key in ``module`` (module docstring), vitlab's own
    ``Attention`` aside (it has its temperature and frozen heads built in)."""
    return _layout(module) is not None


class SteeredHeads:
    """The per-head temperature and frozen heads of one foreign attention module (module docstring), reached through
    hooks: make one with :func:`steer` (which installs it once per module). ``tau``, ``log_tau``, ``num_heads`` and
    ``head_slots`` read as on vitlab's ``Attention`` (the heads never move: slot = head)."""

    def __init__(self, module: nn.Module) -> None:
        layout = _layout(module)
        if layout is None:
            raise TypeError(f"vitlab cannot reach the heads' query and key of {type(module).__name__}")
        self.module = module
        self.kind, self.num_heads, self.head_dim, self.rows = layout
        self.frozen = torch.zeros(self.num_heads, dtype=torch.bool)
        self.num_frozen = 0
        self.temperature_form = "inverse"
        self._saved: dict[str, nn.Parameter] = {}
        if self.kind == "in_proj":
            module.register_forward_pre_hook(self._swap_in)
            module.register_forward_hook(self._swap_out, always_call=True)
        else:
            sources = ("q_proj", "k_proj") if self.kind == "projections" else ("q_norm", "k_norm")
            # bound methods, not closures: a deepcopy of the model then steers the copy's heads
            getattr(module, sources[0]).register_forward_hook(self._steer_query)
            getattr(module, sources[1]).register_forward_hook(self._steer_key)

    @property
    def log_tau(self) -> nn.Parameter | None:
        return getattr(self.module, "log_tau", None)

    @property
    def tau(self) -> torch.Tensor | None:
        """Per-head temperature ``[H]`` (``None`` without one)."""
        return None if self.log_tau is None else self.log_tau.exp()

    @property
    def head_slots(self) -> torch.Tensor:
        return torch.arange(self.num_heads)

    def add_temperature(self, temperature_form: str = "inverse") -> None:
        """Register ``log_tau: [H]`` (zeros: tau = 1) on the module, once; ``temperature_form`` as on ``Attention``."""
        if temperature_form not in ("inverse", "divide"):
            raise ValueError(f"temperature_form must be 'inverse' or 'divide', got {temperature_form!r}")
        self.temperature_form = temperature_form
        if self.log_tau is None:
            device = self.rows["q"][0].parameter.device
            self.module.register_parameter("log_tau", nn.Parameter(torch.zeros(self.num_heads, device=device)))

    def set_frozen_heads(self, frozen: torch.Tensor) -> None:
        """Freeze the heads marked in ``frozen: [H]`` bool (their q and k detached from now on); heads never move."""
        frozen = torch.as_tensor(frozen, dtype=torch.bool).detach().cpu()
        if frozen.shape != (self.num_heads,):
            raise ValueError(f"frozen mask must have shape [{self.num_heads}], got {list(frozen.shape)}")
        self.frozen = frozen.clone()
        self.num_frozen = int(frozen.sum())

    def query_scale(self) -> torch.Tensor | None:
        """``[H]``: what each head's q is multiplied by (tau, or 1 / tau in the ``divide`` form), None without tau."""
        if self.log_tau is None:
            return None
        return (self.log_tau if self.temperature_form == "inverse" else -self.log_tau).exp()

    def _steer_query(self, source: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        return self._steer(out, query=True)

    def _steer_key(self, source: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        return self._steer(out, query=False)

    def _steer(self, out: torch.Tensor, query: bool) -> torch.Tensor | None:
        """The hooked q or k output, ``[B, N, H d]`` (projections) or ``[B, H, N, d]`` (qk_norm), with q scaled per
        head and the frozen heads detached; None (unchanged) when there is nothing to do."""
        scale = self.query_scale() if query else None
        frozen = self.num_frozen and torch.is_grad_enabled()
        if scale is None and not frozen:
            return None
        heads = out.unflatten(-1, (self.num_heads, self.head_dim)) if self.kind == "projections" else out
        shape = (self.num_heads, 1) if self.kind == "projections" else (self.num_heads, 1, 1)
        if scale is not None:
            heads = heads * scale.to(heads.dtype).view(shape)
        if frozen:
            heads = torch.where(self.frozen.to(heads.device).view(shape), heads.detach(), heads)
        return heads.flatten(-2) if self.kind == "projections" else heads

    def _swap_in(self, module: nn.Module, args: tuple) -> None:
        """``nn.MultiheadAttention``: the steered ``in_proj`` parameters for this call (module docstring)."""
        scale = self.query_scale()
        frozen = self.num_frozen and torch.is_grad_enabled()
        if scale is None and not frozen:
            return
        width = module.embed_dim
        for name in ("in_proj_weight", "in_proj_bias"):
            parameter = module._parameters[name] = self._saved.get(name, module._parameters[name])
            if parameter is None:
                continue
            self._saved[name] = parameter
            steered = parameter.unflatten(0, (3, self.num_heads, self.head_dim))  # [3, H, d, ...]
            shape = (self.num_heads,) + (1,) * (steered.dim() - 2)
            if scale is not None:
                factors = torch.stack([scale, torch.ones_like(scale), torch.ones_like(scale)]).to(parameter.dtype)
                steered = steered * factors.view(3, *shape)
            if frozen:
                mask = torch.zeros(3, self.num_heads, dtype=torch.bool)
                mask[:2] = self.frozen
                steered = torch.where(mask.to(parameter.device).view(3, *shape), steered.detach(), steered)
            module._parameters[name] = steered.reshape(3 * width, *parameter.shape[1:])

    def _swap_out(self, module: nn.Module, args: tuple, output: object) -> None:
        for name, parameter in self._saved.items():
            module._parameters[name] = parameter
        self._saved = {}

    def pattern_parameters(self) -> list[str]:
        """The module's parameters that shape every head's pattern at once and so cannot freeze one head (a shared
        qk-norm weight, a relative position bias table): what is neither a head's rows, nor the output projection,
        nor ``log_tau``."""
        owned = {id(r.parameter) for rows in self.rows.values() for r in rows}
        for name in OUTPUT_PROJECTIONS:
            projection = getattr(self.module, name, None)
            if isinstance(projection, nn.Module):
                owned |= {id(p) for p in projection.parameters()}
        owned |= {id(p) for name, p in self.module.named_parameters() if name == "log_tau"}
        return [name for name, p in self.module.named_parameters() if id(p) not in owned]


def steer(module: nn.Module) -> SteeredHeads:
    """The :class:`SteeredHeads` of ``module``, installed on first use (its hooks registered once)."""
    handle = module.__dict__.get("_vitlab_steered_heads")
    if handle is None:
        handle = SteeredHeads(module)
        module.__dict__["_vitlab_steered_heads"] = handle
    return handle


def steer_temperature(model: nn.Module, temperature_form: str = "inverse") -> list[str]:
    """Give every attention module of ``model`` that :func:`steerable` accepts a per-head temperature (tau = 1, so
    the logits stay the model's own); returns their module paths (``model.temperature=true`` for foreign models)."""
    names = []
    for name, module in model.named_modules():
        if steerable(module):
            steer(module).add_temperature(temperature_form)
            names.append(name)
    return names


#: the ``model.*`` keys vitlab reads for itself on a foreign model (not its library's constructor's)
TEMPERATURE_OPTIONS = ("temperature", "temperature_form")


def take_temperature(model: nn.Module, options: dict, source: str) -> None:
    """``model.temperature=true`` on a model built by its own library (HF's, torchvision's): every head that
    :func:`steerable` reaches gets its temperature; refused in one line where none is reached. ``options``: the
    :data:`TEMPERATURE_OPTIONS` taken out of the constructor's keys."""
    if options.get("temperature") and not steer_temperature(model, options.get("temperature_form", "inverse")):
        kinds = sorted({type(m).__name__ for m in model.modules() if "Attention" in type(m).__name__})
        raise ConfigError(
            f"model.temperature=true, but {source} attends with {', '.join(kinds) or 'no attention module'}, whose "
            "heads' query and key vitlab cannot reach; unset model.temperature"
        )

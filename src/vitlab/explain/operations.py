"""The names HiLRP (:mod:`vitlab.explain.hilrp`) gives the operations it intercepts, and the operation sets that
take no rule of their own: those whose gradient passes unchanged (:data:`PASS`), those held constant as gains
(:data:`CONSTANT`), new tensors that are constants (:data:`CONSTRUCTORS`) and the element-wise non-linearities of
the identity rule (:data:`ELEMENTWISE`). docs/explain.md, "HiLRP: relevance rules by operation type", has the table.
"""

from __future__ import annotations

from typing import Any

_BINARY = {"add", "sub", "mul", "truediv", "div", "matmul", "and", "or", "xor", "pow", "floordiv", "mod"}
_ALIASES = {"truediv": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "concat": "cat"}
_ALIASES |= {"concatenate": "cat", "swapaxes": "transpose", "swapdims": "transpose", "rsub": "rsub"}
_ALIASES |= {"linalg_vector_norm": "vector_norm", "linalg_norm": "norm"}


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


#: gradient passes unchanged: the values move, or the map is linear without a constant
PASS = _names(
    "view view_as reshape reshape_as permute transpose t T mT flatten unflatten contiguous getitem unsqueeze squeeze "
    "expand expand_as repeat tile repeat_interleave broadcast_to roll flip narrow select index_select gather "
    "take_along_dim split split_with_sizes chunk tensor_split unbind iter clone to float double half bfloat16 type "
    "type_as movedim moveaxis diagonal unfold fold pixel_shuffle pixel_unshuffle dropout dropout1d dropout2d "
    "dropout3d alpha_dropout feature_alpha_dropout max_pool1d max_pool2d max_pool3d adaptive_max_pool1d "
    "adaptive_max_pool2d max amax min amin topk sort tril triu sum mean nansum cumsum avg_pool1d avg_pool2d "
    "avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d interpolate neg positive "
    "masked_select"
)
#: the output is a gain or a statistic: computed, then held constant (normalisers, masks, signs). It may only enter
#: as a factor: entering a sum (or being the logit itself) would book its share as absorbed, and is refused by name
CONSTANT = _names("sqrt rsqrt norm vector_norm var std var_mean std_mean reciprocal sign floor ceil round trunc frac")
#: new tensors of a tensor's shape, type or device, whose values do not depend on it: constants, not cuts
CONSTRUCTORS = _names(
    "new_ones new_zeros new_full new_empty new_tensor zeros_like ones_like full_like empty_like rand_like randn_like "
    "randint_like size dim numel"
)
#: element-wise non-linearities: the identity rule ``x * stopgrad((f(x) - f(0)) / x) + f(0)``
ELEMENTWISE = _names(
    "gelu silu relu relu6 hardswish hardsigmoid sigmoid tanh elu selu celu leaky_relu softplus mish hardtanh erf "
    "exp clamp clamp_min clamp_max clip abs"
)


def op_name(func: Any) -> tuple[str, bool, bool]:
    """``(name, in_place, reversed)`` of an intercepted callable (``Tensor.__radd__`` -> ``("add", False, True)``)."""
    raw = getattr(func, "__name__", repr(func))
    if raw == "__get__":  # a property (``x.mT``)
        raw = getattr(getattr(func, "__self__", None), "__name__", raw)
    in_place = reverse = False
    if raw.startswith("__") and raw.endswith("__"):
        name = raw[2:-2]
        if name[:1] == "i" and name[1:] in _BINARY:
            name, in_place = name[1:], True
        elif name[:1] == "r" and name[1:] in _BINARY:
            name, reverse = name[1:], True
    else:
        in_place, name = raw.endswith("_"), raw.rstrip("_")
    if name == "rsub":
        name, reverse = "sub", True
    return _ALIASES.get(name, name), in_place, reverse

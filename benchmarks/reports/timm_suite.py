"""A pytest plug-in that runs timm's own ``tests/test_models.py``, unmodified, on vitlab's presets.

timm's test file picks the models of each test from timm's registry by name patterns and model modules: its
``NON_STD_FILTERS`` (``vit_*``, ``crossvit_*``, ...) name the models whose features are tokens, not a spatial map,
and its ``FEAT_INTER_FILTERS`` the modules whose models have ``forward_intermediates``. A ``vitlab_*`` name matches
neither, so this plug-in lists each vitlab preset where timm lists a model of its kind: a Swin preset as timm's
``swin_transformer`` models, every other preset (ViT, ToMe, CET-ViT, ViTCAE's encoder) as a ``vit_*`` model of
``vision_transformer``. TorchScript is not supported (docs/timm.md), so its tests are deselected. timm's file
comes with the source distribution of the installed version (counts: docs/timm.md, "timm's own tests"):

    pip download timm==1.0.31 --no-deps --no-binary :all: -d /tmp/timm
    tar xzf /tmp/timm/timm-1.0.31.tar.gz -C /tmp/timm
    OMP_NUM_THREADS=1 python -m pytest -p benchmarks.reports.timm_suite /tmp/timm/timm-1.0.31/tests/test_models.py \\
        -k "vitlab_cet_vit and not torchscript"
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import timm

import vitlab  # noqa: F401  (registers the vitlab_* models with timm)
from vitlab.models.registry import get_preset
from vitlab.models.swin import SwinTransformer
from vitlab.timm_registry import PREFIX

_timm_list_models = timm.list_models


def _as_timm_lists_it(name: str) -> tuple[str, str]:
    """The (name, module) under which timm lists a model of the preset's kind: ``swin_P`` in ``swin_transformer``,
    ``vit_P`` in ``vision_transformer``."""
    preset = name.removeprefix(PREFIX).partition(".")[0]
    if issubclass(get_preset(preset).cls, SwinTransformer):
        return f"swin_{preset.removeprefix('swin_')}", "swin_transformer"
    return f"vit_{preset}", "vision_transformer"


def _patterns(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _listed(name: str, filter: str | Iterable[str], module: str | Iterable[str], exclude: str | Iterable[str]) -> bool:
    alias, alias_module = _as_timm_lists_it(name)
    include, modules, exclude = _patterns(filter), _patterns(module), _patterns(exclude)
    return (
        (not any(include) or any(fnmatch.fnmatch(alias, p) for p in include if p))
        and (not any(modules) or alias_module in modules)
        and not any(fnmatch.fnmatch(alias, p) for p in exclude if p)
    )


def list_models(
    filter: str | Iterable[str] = "",
    module: str | Iterable[str] = "",
    pretrained: bool = False,
    exclude_filters: str | Iterable[str] = "",
    name_matches_cfg: bool = False,
    include_tags: bool | None = None,
) -> list[str]:
    """``timm.list_models`` with each vitlab preset listed as the timm model of its kind (no hub weights: none with
    ``pretrained=True``)."""
    theirs = _timm_list_models(filter, module, pretrained, exclude_filters, name_matches_cfg, include_tags)
    theirs = [n for n in theirs if not n.startswith(PREFIX)]
    if pretrained:
        return theirs
    ours = _timm_list_models(f"{PREFIX}*", name_matches_cfg=name_matches_cfg, include_tags=include_tags)
    if not ours:
        raise RuntimeError("no vitlab_* model in timm's registry: vitlab did not register its presets")
    return theirs + [n for n in ours if _listed(n, filter, module, exclude_filters)]


def pytest_configure(config) -> None:
    """Before timm's test module is collected (it calls ``list_models`` at import to parametrize its tests)."""
    timm.list_models = list_models

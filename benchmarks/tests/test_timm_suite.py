"""The smoke test of ``benchmarks.reports.timm_suite``, the pytest plug-in that runs timm's unmodified
``tests/test_models.py`` on vitlab's presets (docs/timm.md, "timm's own tests")."""

import timm  # noqa: F401  (registers timm's models before the plug-in lists them)

import vitlab
from benchmarks.reports import timm_suite as suite
from vitlab.timm_registry import PREFIX


def test_timms_own_test_file_lists_each_preset_where_timm_lists_a_model_of_its_kind():
    """``benchmarks.reports.timm_suite`` (timm's unmodified ``tests/test_models.py`` on vitlab's presets): the token
    models with timm's ``vit_*`` (``NON_STD_FILTERS``), every preset with ``forward_intermediates``, Swin with
    timm's spatial models, and timm's own models as timm lists them."""
    non_std = suite.list_models(filter=["vit_*", "crossvit_*"], exclude_filters=["*_7b_*"], include_tags=True)
    inter = suite.list_models(module=["vision_transformer", "swin_transformer", "resnet"])
    spatial = suite.list_models(exclude_filters=["vit_*", "crossvit_*"], include_tags=True)
    ours = [PREFIX + name for name in vitlab.list_models()]
    assert {n for n in non_std if n.startswith(PREFIX)} == {n for n in ours if "swin" not in n}
    assert {n for n in spatial if n.startswith(PREFIX)} == {n for n in ours if n.startswith(PREFIX + "swin")}
    assert set(ours) <= set(inter) and "resnet18" in inter and "vit_tiny_patch16_224.augreg_in21k" in non_std
    assert "vit_tiny_patch16_224" not in suite.list_models(exclude_filters="vit_*")

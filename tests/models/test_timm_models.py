"""vitlab's presets as timm models: ``timm.create_model("vitlab_<preset>")`` through timm's registry and builder, and
the checks of timm's ``tests/test_models.py`` (timm 1.0.31: forward, backward, default cfgs, features_only,
forward_intermediates, fx forward and backward) restated over one small preset per family, plus the input size
(``dynamic_img_size``, ``set_input_size``) and a local weights file through ``pretrained_cfg_overlay``."""

import math
import subprocess
import sys

import pytest
import timm
import timm.data
import torch
from safetensors.torch import save_file
from timm.layers import get_channel_dim, get_notrace_functions, get_notrace_modules, get_spatial_dim
from timm.models import FeatureInfo
from timm.models._manipulate import group_parameters
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

import vitlab
from vitlab.models.contract import feature_extractor
from vitlab.models.registry import constructor_args, get_preset
from vitlab.timm_registry import PREFIX

#: one small preset per family: ViT, ToMe, Swin, CET-ViT hierarchical and global, ViTCAE's encoder
FAMILIES = ["vit_pico", "tome_pico", "swin_pico", "cet_vit_pico", "cet_vit_nano_global", "vitcae_pico"]
NAMES = [PREFIX + name for name in FAMILIES]
RESIZABLE = [PREFIX + name for name in FAMILIES if not name.startswith("vitcae")]


def _input(model: torch.nn.Module, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, *model.pretrained_cfg["input_size"], generator=torch.Generator().manual_seed(0))


def test_every_preset_is_in_timms_registry_under_a_vitlab_name():
    assert timm.list_models(f"{PREFIX}*") == sorted(PREFIX + name for name in vitlab.list_models())
    assert timm.is_model(f"{PREFIX}cet_vit_nano_global") and timm.get_pretrained_cfg(f"{PREFIX}swin_pico")


@pytest.mark.slow  # a fresh interpreter imports torch and timm: about 10 s on a busy 2-core CPU
def test_import_vitlab_registers_with_timm_imported_after_it_and_loads_no_torch():
    code = (
        "import sys, vitlab; assert 'torch' not in sys.modules and 'timm' not in sys.modules; "
        "import timm; print(len(timm.list_models('vitlab_*')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == len(vitlab.list_models())


def test_the_timm_checks_take_a_preset_of_every_family():
    """``FAMILIES`` holds a preset of every model class of the catalogue, so a new family joins the checks."""
    assert {get_preset(p).cls for p in vitlab.list_models()} == {get_preset(p).cls for p in FAMILIES}


def test_the_registered_cfg_gives_each_presets_input_size_and_classes():
    """timm's tests size their inputs by the registered cfg (``get_pretrained_cfg_value``) before building; it is
    the cfg of the model built (vitcae_pico: one 8x8 channel)."""
    for name in timm.list_models(f"{PREFIX}*"):
        built = timm.create_model(name, device="meta").default_cfg
        for key in ("input_size", "num_classes", "mean"):
            assert timm.get_pretrained_cfg_value(name, key) == built[key], (name, key)


@pytest.mark.parametrize("name", NAMES)
def test_model_forward(name):
    model = timm.create_model(name, pretrained=False).eval()
    x = _input(model)
    out = model(x)
    assert out.shape[0] == 1 and not out.isnan().any()
    model.set_grad_checkpointing()
    assert torch.allclose(out, model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_model_backward(name):
    model = timm.create_model(name, pretrained=False, num_classes=42).train()
    out = model(_input(model, batch=2))
    out.mean().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert out.shape[-1] == 42 and not out.isnan().any()


def _check_cfg_names(name: str) -> None:
    model = timm.create_model(name, pretrained=False)
    state, cfg = model.state_dict(), model.default_cfg
    assert cfg["num_classes"] and f"{cfg['classifier']}.weight" in state and f"{cfg['first_conv']}.weight" in state


def test_model_default_cfgs_swin():
    """timm's check for models with a spatial ``forward_features`` (NHWC for Swin, as timm's): ``pool_size``."""
    name = f"{PREFIX}swin_pico"
    model = timm.create_model(name, pretrained=False).eval()
    x, pool_size = _input(model), model.default_cfg["pool_size"]
    assert model.output_fmt == "NHWC" and model.num_classes > 0 and model.head_hidden_size > 0
    features = model.forward_features(x)
    pre = model.forward_head(features, pre_logits=True)
    assert features.shape[1:] == (*pool_size, model.num_features) and pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre.shape
    model.reset_classifier(0, "")
    assert model(x).shape[1:3] == pool_size
    model = timm.create_model(name, pretrained=False, num_classes=0, global_pool="").eval()
    assert model(x).shape[1:3] == pool_size
    _check_cfg_names(name)


@pytest.mark.parametrize("name", [n for n in NAMES if "swin" not in n])
def test_model_default_cfgs_non_std(name):
    """timm's test of the same name, its checks as timm makes them: every family's ``forward_features`` is one
    tensor (CET-ViT's two streams each in its half of the ``2D`` channels), so its width is ``num_features``."""
    model = timm.create_model(name, pretrained=False).eval()
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    x = _input(model)
    features = model.forward_features(x)
    pre = model.forward_head(features, pre_logits=True)
    feat_dim = getattr(model, "feature_dim", None) or (-1 if features.ndim == 3 else 1)
    assert features.shape[feat_dim] == model.num_features and pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    out = model(x)
    assert model.num_classes == 0 and out.shape[feat_dim] == model.head_hidden_size and out.shape == pre.shape
    assert timm.create_model(name, pretrained=False, num_classes=0).eval()(x).shape[feat_dim] == model.num_features
    _check_cfg_names(name)


@pytest.mark.parametrize("name", NAMES)
def test_timms_factory_arguments_and_frozen_parameters(name):
    """timm 1.0.31's additions to its cfg tests: ``device`` and ``dtype`` (the meta device too), ``in_chans``, an
    unknown option a TypeError, layer groups, and frozen parameters kept frozen by ``reset_classifier`` and
    ``set_input_size``; a classifier reset on a float64 model is float64, on its device."""
    model = timm.create_model(name, pretrained=False, device="meta", dtype=torch.float64)
    assert {p.device.type for p in model.parameters()} == {"meta"} and {p.dtype for p in model.parameters()} == {
        torch.float64
    }
    assert model.in_chans == model.default_cfg["input_size"][0]
    assert len(set(group_parameters(model, model.group_matcher(), reverse=True).values())) > 1
    with pytest.raises(TypeError):
        timm.create_model(name, pretrained=False, device="meta", not_a_model_arg=1)
    model.reset_classifier(2)
    assert {(p.device.type, p.dtype) for p in model.get_classifier().parameters()} == {("meta", torch.float64)}
    model.requires_grad_(False)
    model.reset_classifier(0)
    model.set_input_size(img_size=tuple(2 * s for s in model.default_cfg["input_size"][-2:]))
    assert [n for n, p in model.named_parameters() if p.requires_grad] == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("feature_cls", [None, "getter"])
def test_model_forward_features(name, feature_cls):
    """``features_only`` (and timm's ``forward_intermediates_features``: ``feature_cls="getter"``): the maps that
    ``feature_info`` describes, and the wrapper's ``pretrained_cfg`` the model's input."""
    extra = {} if feature_cls is None else {"feature_cls": feature_cls}
    model = timm.create_model(name, pretrained=False, features_only=True, **extra).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    output_fmt = getattr(model, "output_fmt", "NCHW")  # timm's Swin (and so vitlab's): NHWC unless "getter"
    feat_axis, spatial_axes = get_channel_dim(output_fmt), get_spatial_dim(output_fmt)
    x = _input(model)
    outputs = model(x)
    assert len(outputs) == len(channels) >= 3
    for c, r, o in zip(channels, reductions, outputs, strict=True):
        assert o.shape[0] == 1 and o.shape[feat_axis] == c and not o.isnan().any()
        assert all(o.shape[a] <= math.ceil(x.shape[2 + i] / r) + 1 for i, a in enumerate(spatial_axes))
    data = timm.data.resolve_data_config(model=model)
    assert data["input_size"] == x.shape[1:] and data["mean"] == (0.5,) * x.shape[1]


def test_vitlabs_feature_extractor_has_the_models_pretrained_cfg():
    model = vitlab.create_model("vitcae_pico").encoder
    data = timm.data.resolve_data_config(model=feature_extractor(model, out_indices=2))
    assert data["input_size"] == (1, 8, 8) and data["mean"] == (0.5,)


@pytest.mark.parametrize("name", NAMES)
def test_features_only_takes_out_indices(name):
    model = timm.create_model(name, pretrained=False, features_only=True, out_indices=(0, -1)).eval()
    feat_axis = get_channel_dim(getattr(model, "output_fmt", "NCHW"))
    assert [o.shape[feat_axis] for o in model(_input(model))] == model.feature_info.channels()


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_intermediates(name):
    """timm's test of the same name, its checks as timm makes them."""
    model = timm.create_model(name, pretrained=False).eval()
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    x = _input(model)
    output, intermediates = model.forward_intermediates(x, output_fmt="NCHW")
    assert len(intermediates) == len(info.channels()) >= 3
    for c, r, o in zip(info.channels(), info.reduction(), intermediates, strict=True):
        assert o.shape[1] == c and o.shape[2] <= math.ceil(x.shape[2] / r) + 1 and not o.isnan().any()
    assert torch.allclose(output, model.forward_features(x))  # timm's comparison: one tensor
    model.set_grad_checkpointing()
    assert torch.allclose(output, model.forward_intermediates(x)[0], rtol=1e-4, atol=1e-5)


def _fx_model(model: torch.nn.Module, train: bool = False) -> torch.nn.Module:
    """timm's fx feature extractor returning the model's output (the nodes feeding the traced graph's output)."""
    tracer_kwargs = dict(
        leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(), param_shapes_constant=True
    )
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    train_return = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**tracer_kwargs).trace(model)
        output = list(graph.nodes)[-1]
        names = [n.name for n in reversed(graph.nodes)]
        train_return = [train_nodes[-names.index(n.name)] for n in output._input_nodes]
    return create_feature_extractor(
        model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer_kwargs
    )


@pytest.mark.parametrize("name", NAMES)
def test_model_forward_fx(name):
    model = timm.create_model(name, pretrained=False).eval()
    with torch.inference_mode():
        x = _input(model)
        out = model(x)
        fx_out = torch.cat(tuple(_fx_model(model)(x).values()))
    assert torch.equal(fx_out, out) and not out.isnan().any()


@pytest.mark.parametrize("name", NAMES)
def test_model_backward_fx(name):
    model = timm.create_model(name, pretrained=False, num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx_model = _fx_model(model, train=True)
    out = torch.cat(tuple(fx_model(_input(model, batch=2)).values()))
    out.mean().backward()
    assert [n for n, p in fx_model.named_parameters() if p.grad is None] == []
    assert sum(p.grad.numel() for p in fx_model.parameters()) == num_params and out.shape[-1] == 42


@pytest.mark.parametrize("name", RESIZABLE)
def test_dynamic_img_size_runs_other_sizes_and_keeps_the_training_size_logits(name):
    torch.manual_seed(0)
    fixed = timm.create_model(name, pretrained=False).eval()
    dynamic = timm.create_model(name, pretrained=False, dynamic_img_size=True).eval()
    dynamic.load_state_dict(fixed.state_dict())
    x = _input(fixed, batch=2)
    with torch.no_grad():
        assert torch.equal(dynamic(x), fixed(x))
        for size in (48, 64):
            out = dynamic(torch.randn(2, 3, size, size))
            assert out.shape == (2, fixed.num_classes) and not out.isnan().any()
        maps = dynamic.forward_intermediates(torch.randn(1, 3, 48, 64), indices=1, intermediates_only=True)[0]
    assert maps.shape[2:] == tuple(s // fixed.feature_info[-1]["reduction"] for s in (48, 64))
    assert not fixed.default_cfg["fixed_input_size"] or not dynamic.default_cfg["fixed_input_size"]


@pytest.mark.parametrize("name", RESIZABLE)
def test_set_input_size_resamples_the_position_embedding_and_windows(name):
    model = timm.create_model(name, pretrained=False).eval()
    model.set_input_size((64, 64))
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, model.num_classes) and model.default_cfg["input_size"] == (3, 64, 64)
    with pytest.raises(AssertionError):  # timm's PatchEmbed: the fixed size is now 64x64
        model(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("suffix", ["safetensors", "pth"])
def test_pretrained_weights_load_from_a_local_file(name, suffix, tmp_path):
    source = timm.create_model(name, pretrained=False).eval()
    path = tmp_path / f"weights.{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, path) if suffix == "safetensors" else torch.save(state, path)
    overlay = dict(file=str(path))
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay).eval()
    x = _input(source)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))
        features = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, features_only=True)
        assert all(torch.isfinite(f).all() for f in features.eval()(x))
    # timm's test_model_load_pretrained: another class count and one input channel (the first conv summed)
    other = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, in_chans=1, num_classes=5)
    assert other(x[:, :1]).shape == (1, 5)


# cet_vit_nano_global's slot count follows the grid it is built for (slot_ratio): its weights go to another size by
# set_input_size or dynamic_img_size (tested above), not by building it there
@pytest.mark.parametrize("name", [n for n in RESIZABLE if not n.endswith("_global")])
def test_weights_of_another_input_size_load_resampled(name, tmp_path):
    """Weights trained at 32x32 into the model built for 64x64 equal that model after ``set_input_size(64)`` (Swin
    with its windows as built; timm's ``set_input_size`` otherwise keeps the window-to-grid ratio)."""
    source = timm.create_model(name, pretrained=False).eval()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, tmp_path / "weights.safetensors")
    overlay = dict(file=str(tmp_path / "weights.safetensors"))
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, img_size=64).eval()
    source.set_input_size(
        (64, 64), **({"window_size": source.init_kwargs.get("window_size", 4)} if "swin" in name else {})
    )
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(loaded(x), source(x), atol=1e-5)


def test_vitlab_swin_swaps_with_timms_swin():
    """The same weights in timm's ``SwinTransformer`` give the same NHWC features, pooled features and logits."""
    ours = timm.create_model(f"{PREFIX}swin_pico", pretrained=False).eval()
    options = {**{k: p.default for k, p in constructor_args(type(ours)).items()}, **ours.init_kwargs}
    kwargs = {k: v for k, v in options.items() if k != "drop_rate"}  # all 0 here; vitlab's also sets proj_drop_rate
    theirs = timm.models.swin_transformer.SwinTransformer(**kwargs).eval()
    theirs.load_state_dict(ours.state_dict())
    x = _input(ours, batch=2)
    with torch.no_grad():
        assert torch.allclose(ours.forward_features(x), theirs.forward_features(x), atol=1e-5)
        assert torch.allclose(ours(x), theirs(x), atol=1e-5)
        ours.reset_classifier(0, "")
        theirs.reset_classifier(0, "")
        assert ours(x).shape == theirs(x).shape == (2, *ours.default_cfg["pool_size"], ours.num_features)
    assert ours.output_fmt == theirs.output_fmt == "NHWC"


def test_a_find_spec_of_timm_before_its_import_does_not_use_up_the_registration():
    """``importlib.util.find_spec("timm")`` (how packages ask whether timm is installed) loads nothing; the import
    after it still registers vitlab's presets."""
    code = (
        "import importlib.util, vitlab; importlib.util.find_spec('timm'); import timm; "
        "print(len(timm.list_models('vitlab_*')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) > 0, out.stderr


def test_a_failing_after_import_hook_warns_and_the_import_goes_on():
    code = (
        "import warnings, sys; from vitlab.lazy import after_import\n"
        "assert 'colorsys' not in sys.modules\n"
        "after_import('colorsys', lambda: 1 / 0)\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import colorsys\n"
        "print(colorsys.rgb_to_hsv(1, 0, 0), [str(w.message) for w in seen])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "(0.0, 1.0, 1)" in out.stdout and "hook after importing colorsys failed" in out.stdout, out.stdout


def test_a_gray_export_loads_into_an_rgb_timm_model_with_its_logits(tmp_path):
    """The first convolution is adapted from the file's own channel count, which the overlay does not give."""
    torch.manual_seed(0)
    gray = vitlab.create_model("vit_pico", in_chans=1, img_size=16, patch_size=4, num_classes=5).eval()
    vitlab.export_model(gray, tmp_path / "export")
    rgb = timm.create_model(
        PREFIX + "vit_pico",
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(tmp_path / "export" / "model.safetensors"), num_classes=5),
        num_classes=5,
        img_size=16,
        patch_size=4,
    ).eval()
    x = torch.randn(2, 1, 16, 16)
    assert rgb.patch_embed.proj.weight.shape[1] == 3
    torch.testing.assert_close(rgb(x.expand(-1, 3, -1, -1)), gray(x), atol=1e-5, rtol=1e-5)

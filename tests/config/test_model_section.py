"""The ``model`` and ``loss`` sections are typed by the preset's class: every type agrees with its constructor (or
its task), values of the wrong type and unknown keys are refused with the key and the closest valid names."""

import dataclasses
import typing

import pytest

from vitlab.config import ClassificationLossConfig, ConfigError, RunConfig, build_config
from vitlab.config.loss import build_loss
from vitlab.config.model import MODEL_KEYS, catalogue, model_options_type, model_section
from vitlab.errors import ModelOptionError
from vitlab.families.cet_vit.ei import EI_SCHEDULES
from vitlab.family import family_of_class
from vitlab.models.builder import create_model
from vitlab.models.registry import constructor_args, get_preset
from vitlab.testing import builtin_presets


@pytest.mark.parametrize("class_name", sorted({catalogue()[name][0] for name in builtin_presets()}))
def test_each_model_class_takes_the_fields_of_its_options_dataclass(class_name):
    """One definition: the constructor's keywords and defaults are the options dataclass's fields."""
    options = model_options_type(class_name)
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    cls = next(get_preset(name).cls for name, (c, _) in catalogue().items() if c == class_name)
    assert cls.options_type is options
    defaults = {name: p.default for name, p in constructor_args(cls).items()}
    assert defaults == {f.name: f.default for f in dataclasses.fields(options)}
    assert not set(defaults) & set(MODEL_KEYS)


@pytest.mark.parametrize("preset", builtin_presets())
def test_every_preset_fits_its_options_and_the_section_check(preset):
    entry = get_preset(preset)
    options = entry.cls.options_type(**entry.kwargs)  # the options' own check
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in entry.kwargs.items()}  # as YAML gives them
    section = model_section({"name": preset, **values})
    assert section == {"name": preset, **{k: getattr(options, k) for k in values}}


def test_a_model_built_in_python_is_checked_as_the_config_is():
    with pytest.raises(ValueError, match="temperature_form must be one of inverse, divide, got 'inverted'"):
        create_model("vit_pico", temperature_form="inverted")
    with pytest.raises(ValueError, match="Token Merging \\(tome_r > 0\\) needs global_pool='token'"):
        create_model("tome_pico", global_pool="avg")


def test_the_section_keeps_only_the_keys_the_config_sets():
    cfg = build_config("vitcae/digits", ["model.decoder_depth=1", "model.mlp_ratio=2"])
    assert cfg.model == {"name": "vitcae_pico", "patch_size": 2, "decoder_depth": 1, "mlp_ratio": 2.0}
    assert isinstance(cfg.model["mlp_ratio"], float)


@pytest.mark.parametrize(
    ("config", "override", "message"),
    [
        ("vit/digits", "model.depth=two", "model.depth must be of type int, got 'two'"),
        ("vit/digits", "model.temperature_form=inverted", "model.temperature_form must be one of inverse, divide"),
        ("cet_vit/digits", "model.depths=3", "model.depths must be a list"),
        ("cet_vit/digits", "model.depth=2", "has no option 'depth'. Did you mean depths"),
        ("cet_vit/digits", "model.grouping=cardd", "model.grouping must be one of card, none, got 'cardd'"),
        ("vitcae/digits", "model.qkv_bias=maybe", "model.qkv_bias must be true or false"),
        ("compare/cifar10_cpu_swin", "model.window=2", "has no option 'window'. Did you mean window_size"),
    ],
)
def test_a_wrong_model_value_or_key_is_refused(config, override, message):
    with pytest.raises(ConfigError if "no option" not in message else ModelOptionError, match=message):
        build_config(config, [override])


@pytest.mark.parametrize(
    ("config", "override"),
    [
        ("vit/digits", "model.depth=0"),
        ("vit/digits", "model.embed_dim=-64"),
        ("vit/digits", "model.num_heads=0"),
        ("vit/digits", "model.patch_size=0"),
        ("cet_vit/digits", "model.depths=[2,0]"),
        ("compare/cifar10_cpu_swin", "model.num_heads=[2,-1]"),
    ],
)
def test_a_zero_or_negative_model_size_is_refused(config, override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} must be at least 1, got .*; set {key} to a positive size"):
        build_config(config, [override])


@pytest.mark.parametrize(
    ("config", "loss_type"),
    [
        ("vit/digits", "ClassificationLossConfig"),
        ("vitcae/digits", "ViTCAELossConfig"),
        ("cet_vit/digits", "CETLossConfig"),
    ],
)
def test_the_loss_section_is_checked_by_the_tasks_dataclass(config, loss_type):
    cfg = build_config(config)
    model_class = get_preset(cfg.model["name"]).cls
    family = family_of_class(model_class)
    own = family.config_type("loss") if family else ClassificationLossConfig
    assert own.__name__ == loss_type
    assert set(cfg.loss) <= set(typing.get_type_hints(own))
    assert type(build_loss(own, cfg.loss)) is own


def test_a_protocol_shared_by_several_tasks_keeps_its_loss_with_the_model_that_reads_it():
    vit = build_config("compare/cifar10_p4_vit")
    cet = build_config("compare/cifar10_p4")
    assert vit.loss == {} and cet.loss["ei_start"] == 1.33
    assert build_config("compare/cifar10_p4_global").loss == cet.loss
    message = r"loss.ei_start is not used by the task of VisionTransformer \(the key belongs to the loss of the 'cet"
    with pytest.raises(ConfigError, match=message):
        build_config("compare/cifar10_p4_vit", ["loss.ei_start=2"])


@pytest.mark.parametrize(
    ("config", "override", "message"),
    [
        ("vit/digits", "loss.foo=1", "unknown config key 'loss.foo': section 'loss' takes no keys here"),
        ("cet_vit/digits", "loss.lambda_eii=0.1", "unknown config key 'loss.lambda_eii'. Did you mean 'lambda_ei'"),
        ("cet_vit/digits", "loss.ei_schedule=rampp", "loss.ei_schedule must be one of ramp, constant"),
        ("vitcae/digits", "loss.mmd_mixx=0.5", "Did you mean 'mmd_mix'"),
        ("vitcae/digits", "loss.mmd_mix=2", r"loss.mmd_mix must lie in \[0, 1\]"),
    ],
)
def test_a_wrong_loss_key_or_value_is_refused(config, override, message):
    with pytest.raises(ConfigError, match=message):
        build_config(config, [override])


def test_the_cet_vit_schedules_are_the_ei_weights():
    from vitlab.families.cet_vit.config import CETLossConfig

    assert typing.get_args(typing.get_type_hints(CETLossConfig)["ei_schedule"]) == EI_SCHEDULES


def test_cet_vits_option_values_are_the_cores():
    from vitlab.families.cet_vit import config
    from vitlab.families.cet_vit.ei import DEGEN_SLOTS, EI_SVD_WAYS, EI_VARIANTS
    from vitlab.families.cet_vit.slots import POOLS

    assert typing.get_args(config.Pool) == POOLS
    assert typing.get_args(config.EIVariant) == EI_VARIANTS
    assert typing.get_args(config.DegenSlots) == DEGEN_SLOTS
    assert typing.get_args(config.EISvd) == EI_SVD_WAYS


def test_a_run_config_built_in_python_is_checked_too():
    cfg = RunConfig(model={"name": "vitcae_pico", "depth": 2}, loss={"warmup_epochs": 0})
    assert cfg.loss == {"warmup_epochs": 0} and cfg.model == {"name": "vitcae_pico", "depth": 2}
    with pytest.raises(ModelOptionError, match="has no option 'depthh'"):
        RunConfig(model={"name": "vit_pico", "depthh": 2})
    with pytest.raises(ConfigError, match="unknown config key 'loss.warmup'. Did you mean 'warmup_epochs'"):
        RunConfig(model={"name": "vitcae_pico"}, loss={"warmup": 0})
    with pytest.raises(ConfigError, match="needs a 'name'"):
        build_config(None, ["model.depth=2"])


@pytest.mark.parametrize(
    ("option", "value"),
    [("depth", 0), ("depth", -1), ("embed_dim", 0), ("patch_size", 0), ("mlp_ratio", -1.0), ("drop_path_rate", 1.5)],
)
def test_the_python_api_refuses_what_the_config_refuses_in_the_same_words(tmp_path, option, value):
    """``create_model``, timm's builder and ``load_model`` check the options where the config check does."""
    import json

    import timm

    import vitlab

    with pytest.raises(ConfigError) as from_config:
        build_config("vit/digits", [f"model.{option}={value}"])
    message = str(from_config.value)
    assert message.startswith(f"model.{option} must be ")
    with pytest.raises(ConfigError) as from_api:
        vitlab.create_model("vit_pico", **{option: value})
    with pytest.raises(ConfigError) as from_timm:
        timm.create_model("vitlab_vit_pico", **{option: value})
    export = vitlab.export_model(vitlab.create_model("vit_pico"), tmp_path / "export")
    meta = json.loads((export / "config.json").read_text())
    meta["kwargs"][option] = value
    (export / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError) as from_export:
        vitlab.load_model(export)
    assert str(from_api.value) == str(from_timm.value) == str(from_export.value) == message


def test_a_model_without_a_classifier_is_built_but_a_run_needs_classes():
    import vitlab

    assert vitlab.create_model("vit_pico", num_classes=0).num_classes == 0  # timm's pooled-features model
    with pytest.raises(ConfigError, match="model.num_classes must be at least 1, got 0"):
        build_config("vit/digits", ["model.num_classes=0"])

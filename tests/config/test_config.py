"""Typed configs: YAML, dotted overrides, clear errors for unknown keys and bad types."""

import warnings

import pytest

from vitlab.config import ConfigError, build_config, dump_yaml, parse_overrides, read_yaml


def test_overrides_parse_both_styles_and_yaml_types():
    out = parse_overrides(["optim.lr=1e-3", "--trainer.devices", "2", "--data.name=mnist", "run.test=false"])
    assert out == {"optim": {"lr": 1e-3}, "trainer": {"devices": 2}, "data": {"name": "mnist"}, "run": {"test": False}}


def test_packaged_config_with_overrides():
    cfg = build_config("vit/digits", ["optim.lr=0.01", "trainer.max_epochs=3", "model.depth=2"])
    assert cfg.optim.lr == 0.01 and cfg.trainer.max_epochs == 3
    assert cfg.model == {"name": "vit_nano", "patch_size": 2, "depth": 2}
    assert cfg.data.augment.random_crop is True
    assert "max_epochs: 3" in dump_yaml(cfg)


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr'.*Did you mean 'lr'"):
        build_config("vit/digits", ["optim.lrr=0.1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trainr'.*Did you mean 'trainer'"):
        build_config(None, ["trainr.max_epochs=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'data.augment.flip'"):
        build_config(None, ["data.augment.flip=true"])


def test_bad_types_are_errors():
    with pytest.raises(ConfigError, match="trainer.max_epochs must be of type int"):
        build_config(None, ["trainer.max_epochs=ten"])
    with pytest.raises(ConfigError, match="must be true or false"):
        build_config(None, ["trainer.deterministic=maybe"])


def test_missing_config_file_lists_packaged_configs():
    with pytest.raises(ConfigError, match=r"not found.*vit/digits"):
        build_config("no/such/config")


def test_yaml_defaults_are_merged(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("optim:\n  lr: 0.5\ntrainer:\n  max_epochs: 7\n")
    child = tmp_path / "child.yaml"
    child.write_text("defaults: [base.yaml]\noptim:\n  weight_decay: 0.0\n")
    cfg = build_config(child)
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.trainer.max_epochs) == (0.5, 0.0, 7)


def test_malformed_override():
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["lonely"])


def test_union_fields_keep_the_exact_type():
    cfg = build_config(None, ["trainer.limit_train_batches=1", "trainer.limit_val_batches=0.5", "trainer.devices=auto"])
    assert cfg.trainer.limit_train_batches == 1 and isinstance(cfg.trainer.limit_train_batches, int)
    assert cfg.trainer.limit_val_batches == 0.5
    assert cfg.trainer.devices == "auto"


def test_a_new_preset_on_the_command_line_warns_which_model_keys_of_the_config_it_drops():
    """compare/cifar10_p4 sets the protocol's patch size and dropout in its model section; a model.name override
    starts that section afresh (the documented merge), which once silently trained a run at patch 2."""
    with pytest.warns(UserWarning, match="replaces the config's preset 'cet_vit_nano'") as caught:
        cfg = build_config("compare/cifar10_p4", ["model.name=vit_matched_cet_vit_nano"])
    message = str(caught[0].message)
    assert "model.patch_size=4" in message and "model.drop_path_rate=0.1" in message
    assert "patch_size" not in cfg.model and len(caught) == 1
    with pytest.warns(UserWarning) as caught:  # repeated keys are kept and not named
        build_config("compare/cifar10_p4", ["model.name=vit_matched_cet_vit_nano", "model.patch_size=4"])
    assert "patch_size" not in str(caught[0].message) and "drop_rate" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config(
            "compare/cifar10_p4", ["model.name=cet_vit_nano", "model.drop_rate=0.0"]
        )  # the same preset: merged


def test_the_dynamics_section_is_typed_and_round_trips_through_yaml():
    import yaml

    from vitlab.config import DynamicsConfig
    from vitlab.rundir import config_with_overrides

    cfg = build_config("vitcae/digits", ["dynamics.mode=schedule", "dynamics.alpha=2", "loss.mmd_scales=[0.5,1,2]"])
    assert isinstance(cfg.dynamics, DynamicsConfig) and cfg.dynamics.alpha == 2.0 and cfg.dynamics.mode == "schedule"
    again = config_with_overrides(yaml.safe_load(dump_yaml(cfg)))  # what a run's config.yaml reads back as
    assert again == cfg and again.dynamics == cfg.dynamics
    assert build_config("vit/digits").dynamics is None  # no controller


def test_a_list_of_any_length_fits_a_variadic_tuple_field():
    """``loss.mmd_scales`` (ViTCAE's IMQ kernel scales, ``tuple[float, ...]``) takes a list of any length."""
    for scales in ("[1.0]", "[0.5,1,2]"):
        build_config("vitcae/digits", [f"loss.mmd_scales={scales}"])
    with pytest.raises(ConfigError, match=r"loss.mmd_scales\[1\]"):
        build_config("vitcae/digits", ["loss.mmd_scales=[1.0,abc]"])


def test_a_key_given_twice_in_a_yaml_file_is_refused_naming_the_key_and_file(tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text("optim:\n  lr: 0.1\n  weight_decay: 0.0\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"twice.yaml, line 4, column 3 is not valid YAML: duplicate key 'lr'"):
        build_config(config)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text("base: &base {lr: 0.1, weight_decay: 0.2}\noptim:\n  <<: *base\n  lr: 0.5\n")
    assert read_yaml(config)["optim"] == {"lr": 0.5, "weight_decay": 0.2}


@pytest.mark.parametrize("name", ["../../x", "a/b", "a\\b", ".", "..", ""])
def test_a_run_name_must_be_one_folder_name(name):
    with pytest.raises(ConfigError, match=r"must be one folder name .*set run.root="):
        build_config(None, [f"run.name={name}"])


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_numpy_and_torch_cannot_take_is_refused_at_config_check(seed):
    with pytest.raises(ConfigError, match=r"run.seed must be a whole number in 0..4294967295 \(2\*\*32-1\), got"):
        build_config("vit/digits", [f"run.seed={seed}"])
    assert build_config("vit/digits", [f"run.seed={2**32 - 1}"]).run.seed == 2**32 - 1


def test_a_config_file_that_is_not_yaml_text_or_whose_section_is_not_a_mapping_is_refused(tmp_path):
    (tmp_path / "binary.yaml").write_bytes(b"model:\xff\xfe\x00 name")
    with pytest.raises(ConfigError, match="is not a UTF-8 text file"):
        build_config(tmp_path / "binary.yaml")
    (tmp_path / "list.yaml").write_text("defaults: [vit/digits]\ntrainer: [1, 2]\n")
    with pytest.raises(ConfigError, match="section 'trainer' must be a mapping"):
        build_config(tmp_path / "list.yaml", ["trainer.max_epochs=1"])  # the override replaced the list unseen

"""Pretrained weights: timm files through model.pretrained, resampling, clear errors, from_timm, fine-tuning options."""

import huggingface_hub.constants
import pytest
import timm
import torch
from safetensors.torch import save_file

import vitlab
from vitlab.config import FinetuneConfig, build_config
from vitlab.errors import ConfigError, VitlabError
from vitlab.export import export_model
from vitlab.models.pretrained import PretrainedWeightsError, compress_keys, load_pretrained
from vitlab.training.finetune import early_stopping, freeze_backbone, layer_decay_groups
from vitlab.training.tasks import param_groups

PICO = dict(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0)


def timm_vit(**kw):
    torch.manual_seed(0)
    args = dict(img_size=16, patch_size=4, in_chans=3, num_classes=7, **PICO)
    return timm.models.VisionTransformer(**{**args, **kw}).eval()


@pytest.fixture
def timm_file(tmp_path):
    ref = timm_vit()
    path = tmp_path / "timm_vit.safetensors"
    save_file(ref.state_dict(), str(path))
    return ref, path


def test_timm_safetensors_through_model_pretrained_gives_timms_logits(timm_file, tmp_path):
    ref, path = timm_file
    cfg = build_config(None, ["model.name=vit_pico", f"model.pretrained={path}"])
    kwargs = {k: v for k, v in cfg.model.items() if k not in ("name", "pretrained")}
    ours = vitlab.create_model(
        cfg.model["name"], pretrained=cfg.model["pretrained"], img_size=16, patch_size=4, num_classes=7, **kwargs
    ).eval()
    x = torch.randn(4, 3, 16, 16)
    assert (ours(x) - ref(x)).abs().max() <= 1e-6
    assert ours.pretrained == str(path) and "pretrained" not in ours.init_kwargs
    # the same weights as a .pth state dict wrapped the way many checkpoints are
    torch.save({"model": ref.state_dict()}, tmp_path / "wrapped.pth")
    again = vitlab.create_model(
        "vit_pico", img_size=16, patch_size=4, num_classes=7, pretrained=tmp_path / "wrapped.pth"
    )
    assert (again.eval()(x) - ref(x)).abs().max() <= 1e-6


def test_another_image_size_resamples_the_position_embedding_and_runs(timm_file):
    ref, path = timm_file
    model = vitlab.create_model("vit_pico", img_size=32, patch_size=4, num_classes=7, pretrained=str(path)).eval()
    assert model.pos_embed.shape == (1, 1 + 8 * 8, 64)
    assert "pos_embed resampled from a 4x4 to a 8x8 patch grid" in model.pretrained_summary
    torch.testing.assert_close(model.cls_token, ref.cls_token)  # everything else is loaded as it is
    torch.testing.assert_close(model.blocks[2].attn.qkv.weight, ref.blocks[2].attn.qkv.weight)
    # the CLS position is kept, the 4x4 grid is interpolated onto 8x8 (bicubic, as timm does)
    torch.testing.assert_close(model.pos_embed[:, :1], ref.pos_embed[:, :1])
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_new_classes_channels_patch_size_and_temperature(timm_file):
    _, path = timm_file
    model = vitlab.create_model(
        "vit_pico", img_size=16, patch_size=2, in_chans=1, num_classes=2, temperature=True, pretrained=str(path)
    )
    summary = model.pretrained_summary
    for part in ("head reset for 2 classes", "3 to 1 input channels", "4x4 to 2x2 patches", "tau = 1"):
        assert part in summary
    assert model.patch_embed.proj.weight.shape == (64, 1, 2, 2)
    assert all(not block.attn.log_tau.detach().any() for block in model.blocks)
    assert model(torch.randn(2, 1, 16, 16)).shape == (2, 2)


def test_vitcae_encoder_and_vit_baseline_from_a_pretrained_vit(timm_file):
    ref, path = timm_file
    cae = vitlab.create_model("vitcae_pico", img_size=16, patch_size=4, in_chans=3, num_classes=3, pretrained=path)
    torch.testing.assert_close(cae.encoder.blocks[0].mlp.fc1.weight, ref.blocks[0].mlp.fc1.weight)
    # a ViTCAE run's weights initialise a ViT: the tensors under 'encoder.' are taken, the rest is named as ignored
    cae_file = _saved(cae, path.parent / "cae.safetensors")
    with pytest.raises(PretrainedWeightsError, match="per-head temperatures .*set model.temperature=true"):
        vitlab.create_model("vit_pico", img_size=16, patch_size=4, pretrained=cae_file)
    vit = vitlab.create_model("vit_pico", img_size=16, patch_size=4, num_classes=3, temperature=True)
    report = load_pretrained(vit, cae_file)
    assert "head initialised for 3 classes (the weights have none)" in report.summary()
    assert report.prefix == "encoder." and report.ignored
    torch.testing.assert_close(vit.blocks[3].attn.proj.weight, cae.encoder.blocks[3].attn.proj.weight)
    with pytest.raises(PretrainedWeightsError, match="no ViT backbone"):
        vitlab.create_model("cet_vit_pico", img_size=16, patch_size=4, pretrained=path)


def _saved(model, path):
    save_file(model.state_dict(), str(path))
    return path


def test_truncated_and_foreign_files_are_one_line_errors(timm_file, tmp_path):
    _, path = timm_file
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:3000])
    foreign = _saved(timm.create_model("resnet10t", num_classes=3), tmp_path / "resnet.safetensors")
    partial = {k: v for k, v in timm_vit().state_dict().items() if not k.startswith("blocks.3.")}
    torch.save(partial, tmp_path / "partial.pth")
    wider = _saved(timm_vit(embed_dim=128), tmp_path / "wider.safetensors")
    qk_norm = _saved(timm_vit(qk_norm=True), tmp_path / "qk_norm.safetensors")
    cases = {
        truncated: "cannot be read .*truncated",
        foreign: "holds no ViT weights",
        tmp_path / "partial.pth": r"12 missing \(blocks\.3\.attn\.proj\.bias",
        wider: r"of another shape \(e\.g\. cls_token: file \[1, 1, 128\], model \[1, 1, 64\]\)",
        qk_norm: r"16 unexpected .*qk-norm, which vitlab's ViT does not",
        tmp_path / "nothing.pth": "no such file",
    }
    for bad, pattern in cases.items():
        with pytest.raises(PretrainedWeightsError, match=pattern) as err:
            vitlab.create_model("vit_pico", img_size=16, patch_size=4, pretrained=str(bad))
        assert "\n" not in str(err.value) and len(str(err.value)) < 500


def test_timm_name_offline_names_the_file_to_pass(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PretrainedWeightsError) as err:
        vitlab.create_model(
            "vit_tiny", img_size=224, patch_size=16, pretrained="timm:vit_tiny_patch16_224.augreg_in21k"
        )
    message = str(err.value)
    assert "\n" not in message
    assert "huggingface.co/timm/vit_tiny_patch16_224.augreg_in21k/resolve/main/model.safetensors" in message
    assert "model.pretrained=/path/to/model.safetensors" in message
    with pytest.raises(PretrainedWeightsError, match="timm has no model 'vit_nonexistent'"):
        vitlab.create_model("vit_tiny", pretrained="timm:vit_nonexistent")


def test_timm_name_goes_through_timms_own_download(monkeypatch):
    """Online, timm:NAME is timm.create_model(NAME, pretrained=True); here a local timm model stands in for it."""
    ref = timm_vit()
    calls = []

    def fake_create_model(name, pretrained=False, **kw):
        calls.append((name, pretrained))
        return ref

    monkeypatch.setattr(timm, "create_model", fake_create_model)
    model = vitlab.create_model(
        "vit_pico", img_size=16, patch_size=4, num_classes=7, pretrained="timm:vit_tiny_patch16_224"
    )
    assert calls == [("vit_tiny_patch16_224", True)]
    x = torch.randn(2, 3, 16, 16)
    assert (model.eval()(x) - ref(x)).abs().max() <= 1e-6
    monkeypatch.setattr(timm, "create_model", lambda name, pretrained=False, **kw: timm_vit(qk_norm=True))
    with pytest.raises(PretrainedWeightsError, match="uses qk-norm"):
        vitlab.create_model("vit_pico", img_size=16, patch_size=4, pretrained="timm:vit_tiny_patch16_224")


def test_from_timm_gives_timms_logits_and_row_stochastic_maps_for_every_block():
    ref = timm_vit()
    ours = vitlab.from_timm(ref)
    x = torch.randn(3, 3, 16, 16)
    assert (ours(x) - ref(x)).abs().max() <= 1e-6
    maps = vitlab.capture_attention(ours, x)
    assert sorted(maps) == [f"blocks.{i}.attn" for i in range(4)]
    for attn in maps.values():
        assert attn.shape == (3, 4, 17, 17)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4, 17), atol=1e-5, rtol=0)
    # with a temperature for the controller: still timm's function (tau = 1)
    controlled = vitlab.from_timm(ref, temperature=True)
    assert (controlled(x) - ref(x)).abs().max() <= 1e-6
    assert ours.preset == "vit_pico" and ours.init_kwargs["num_classes"] == 7


@pytest.mark.parametrize(
    ("kw", "feature"),
    [
        (dict(reg_tokens=2), "2 register tokens"),
        (dict(qk_norm=True), "qk-norm"),
        (dict(init_values=1e-5), "LayerScale"),
        (dict(class_token=False, global_pool="avg"), "no class token"),
        (dict(pre_norm=True), "a norm before the blocks"),
        (dict(global_pool="avg", fc_norm=True), r"a norm after pooling \(fc_norm\)"),
        (dict(no_embed_class=True), r".*\(no_embed_class\)"),
    ],
)
def test_from_timm_refuses_what_it_cannot_map(kw, feature):
    with pytest.raises(PretrainedWeightsError, match=f"uses {feature}"):
        vitlab.from_timm(timm_vit(**kw))


def test_compress_keys_fits_a_line():
    keys = [f"blocks.{i}.attn.qkv.weight" for i in range(12)] + ["head.weight"]
    assert compress_keys(keys) == "blocks.{0,...,11}.attn.qkv.weight, head.weight"


# -------------------------------------------------------------------------------------------------------------------
def test_layer_decay_scales_each_block_and_keeps_weight_decay():
    model = vitlab.create_model("vit_pico", img_size=8, patch_size=2, num_classes=3)
    groups = layer_decay_groups(model, param_groups(model, 0.05), lr=1.0, decay=0.5)
    by_name = {id(p): n for n, p in model.named_parameters()}
    lr_of = {by_name[id(p)]: (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    assert lr_of["head.weight"] == (1.0, 0.05) and lr_of["norm.weight"] == (1.0, 0.0)
    assert lr_of["blocks.3.attn.qkv.weight"] == (0.5, 0.05)
    assert lr_of["blocks.0.mlp.fc1.weight"] == (0.5**4, 0.05)
    assert lr_of["pos_embed"] == (0.5**5, 0.0) and lr_of["patch_embed.proj.weight"][0] == 0.5**5
    assert len(lr_of) == len(list(model.parameters()))
    # through the config: the task's optimiser groups
    from vitlab.training.tasks import ClassificationTask

    cfg = build_config(None, ["finetune.layer_decay=0.5", "optim.lr=0.1"])
    task = ClassificationTask(model, cfg=cfg, hparams={"data_info": {"num_classes": 3}})
    assert sorted({g["lr"] for g in task.param_groups()}) == [0.1 * 0.5**k for k in range(5, -1, -1)]
    plain = ClassificationTask(model, cfg=build_config(), hparams={"data_info": {"num_classes": 3}}).param_groups()
    assert len(plain) == 2 and all("lr" not in g for g in plain)


def test_freeze_backbone_is_a_linear_probe():
    model = vitlab.create_model("vit_pico", img_size=8, patch_size=2, num_classes=3)
    freeze_backbone(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}
    cae = vitlab.create_model("vitcae_pico", num_classes=3)
    freeze_backbone(cae)
    trainable = {n.split(".")[0] for n, p in cae.named_parameters() if p.requires_grad}
    assert "encoder" not in trainable and {"decoder_blocks", "head", "mu_cls"} <= trainable


def test_finetune_config_errors_and_early_stopping():
    with pytest.raises(ConfigError, match="finetune.freeze must be none or backbone"):
        build_config(None, ["finetune.freeze=encoder"])
    with pytest.raises(ConfigError, match=r"finetune.layer_decay must be in \(0, 1\]"):
        build_config(None, ["finetune.layer_decay=1.5"])
    assert early_stopping(FinetuneConfig(), ("val/acc", "max")) is None
    stop = early_stopping(FinetuneConfig(early_stopping_patience=2), ("val/acc", "max"))
    assert (stop.monitor, stop.mode, stop.patience) == ("val/acc", "max", 2)
    assert (
        early_stopping(
            FinetuneConfig(early_stopping_patience=1, early_stopping_monitor="val/loss"), ("val/acc", "max")
        ).mode
        == "min"
    )


def test_fit_with_pretrained_weights_frozen_backbone_and_early_stopping(tmp_path):
    """One tiny run through the config: weights from a previous run's export, linear probe, early stopping."""
    from vitlab.training.run import fit

    common = ["model.name=vit_pico", "model.patch_size=2", "data.limit_train=64", "trainer.enable_progress_bar=false"]
    common += ["run.report=false", "run.test=false"]
    first = fit(build_config(None, [*common, "trainer.max_epochs=1", f"run.dir={tmp_path / 'a'}"]))
    cfg = build_config(
        None,
        [
            *common,
            "trainer.max_epochs=6",
            f"run.dir={tmp_path / 'b'}",
            f"model.pretrained={first}",
            "finetune.freeze=backbone",
            "finetune.early_stopping_patience=1",
            "finetune.early_stopping_min_delta=0.5",  # no epoch improves val/acc by 50 points: stops after epoch 2
        ],
    )
    second = fit(cfg)
    before = vitlab.load_model(first)
    after = vitlab.load_model(second)
    torch.testing.assert_close(after.blocks[1].attn.qkv.weight, before.blocks[1].attn.qkv.weight)
    assert not torch.equal(after.head.weight, before.head.weight)
    epochs = [line for line in (second / "metrics.jsonl").read_text().splitlines() if '"val/acc"' in line]
    assert len(epochs) == 2  # early stopping, not the 6 epochs asked for
    with pytest.raises(VitlabError, match="no such file"):
        fit(build_config(None, [*common, f"run.dir={tmp_path / 'c'}", f"model.pretrained={tmp_path / 'missing'}"]))


@pytest.mark.parametrize("name", ["tome_pico", "vit_matched_cet_vit_nano"])
def test_the_vit_baselines_take_pretrained_weights(name, tmp_path):
    source = vitlab.create_model(name, img_size=16, patch_size=4, num_classes=10)
    path = _saved(source, tmp_path / "source.safetensors")
    model = vitlab.create_model(name, img_size=32, patch_size=4, num_classes=10, pretrained=path)
    torch.testing.assert_close(model.blocks[-1].mlp.fc2.weight, source.blocks[-1].mlp.fc2.weight)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize(("name", "patch"), [("cet_vit_pico", 2), ("swin_pico", 1)])
def test_models_without_a_vit_backbone_take_weights_of_their_own_architecture(tmp_path, name, patch):
    shape = dict(img_size=16, patch_size=patch)
    source = vitlab.create_model(name, num_classes=5, **shape)
    export_model(source, tmp_path / "export")
    model = vitlab.create_model(name, num_classes=3, pretrained=str(tmp_path / "export"), **shape)
    head = model.pretrained_cfg["classifier"]
    assert f"{head} reset for 3 classes" in model.pretrained_summary
    loaded, original = model.state_dict(), source.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in original.items() if not k.startswith(f"{head}."))
    with pytest.raises(PretrainedWeightsError, match="do not fit"):
        vitlab.create_model(name, num_classes=3, pretrained=str(tmp_path / "export"), **shape, mlp_ratio=1.0)

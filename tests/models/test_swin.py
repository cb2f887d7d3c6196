"""The Swin baseline: timm's SwinTransformer behind vitlab's constructor, registry, training task and export."""

import pytest
import timm
import torch
from timm.models.swin_transformer import WindowAttention

import vitlab
from vitlab.config import RunConfig
from vitlab.export import export_model, load_model
from vitlab.models import SwinTransformer
from vitlab.training.run import build_task
from vitlab.training.tasks import ClassificationTask, param_groups


def _pico(**overrides) -> SwinTransformer:
    return vitlab.create_model("swin_pico", img_size=16, patch_size=1, num_classes=5, **overrides)


def test_same_network_as_timm_with_the_same_configuration():
    torch.manual_seed(0)
    ours = _pico().eval()
    ref = timm.models.SwinTransformer(
        img_size=16, patch_size=1, num_classes=5, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8),
        window_size=4, mlp_ratio=2.0, drop_path_rate=0.0,
    ).eval()  # fmt: skip
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(ours(x), ref(x))


def test_model_contract():
    model = _pico().eval()
    x = torch.randn(2, 3, 16, 16)
    feats = model.forward_features(x)
    assert feats.shape == (2, 2, 2, 128)  # NHWC after three patch mergings of a 16x16 grid, width 16 * 2**3
    torch.testing.assert_close(model.forward_head(feats), model(x))
    assert model.forward_head(feats, pre_logits=True).shape == (2, 128)
    final, inter = model.forward_intermediates(x)
    assert len(inter) == 4 and inter[0].shape == (2, 16, 16, 16)
    torch.testing.assert_close(final, feats)
    tables = {n for n, _ in model.named_parameters() if n.endswith("relative_position_bias_table")}
    assert tables and tables <= model.no_weight_decay()


def test_constructor_is_keyword_only_and_checks_its_options():
    with pytest.raises(TypeError):
        SwinTransformer(32)
    with pytest.raises(ValueError, match=r"stage 1 has width 48 .* not divisible by its 5 heads"):
        SwinTransformer(embed_dim=24, depths=(1, 1), num_heads=(2, 5))
    with pytest.raises(ValueError, match="same length"):
        SwinTransformer(depths=(1, 1, 1), num_heads=(2, 4))
    with pytest.raises(ValueError, match="image size 30 is not divisible by the patch size 4"):
        SwinTransformer(img_size=30, patch_size=4)


def test_fused_attention_equals_eager_attention():
    """timm runs Swin's window attention eagerly unless TIMM_FUSED_ATTN asks for SDPA; both give the same logits."""
    torch.manual_seed(0)
    model = _pico().eval()
    x = torch.randn(2, 3, 16, 16)
    attns = [m for m in model.modules() if isinstance(m, WindowAttention)]
    assert len(attns) == 4

    def logits(fused: bool) -> torch.Tensor:
        for m in attns:
            m.fused_attn = fused
        return model(x)

    torch.testing.assert_close(logits(True), logits(False), atol=2e-5, rtol=1e-4)


def test_trains_through_the_classification_task():
    torch.manual_seed(0)
    model = _pico()
    cfg = RunConfig(model={"name": "swin_pico"})
    task = build_task(cfg, model, {"config": {}, "model_kwargs": model.init_kwargs, "data_info": {"num_classes": 5}})
    assert type(task) is ClassificationTask
    groups = param_groups(model, weight_decay=0.05)
    no_decay = {id(p) for p in groups[1]["params"]}
    assert all(id(p) in no_decay for n, p in model.named_parameters() if n.endswith("relative_position_bias_table"))
    optimizer = torch.optim.AdamW(groups, lr=3e-3)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 5
    losses = []
    for _ in range(6):
        loss = task.compute_losses((x, y), "train")["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_export_and_load_give_the_same_logits(tmp_path):
    torch.manual_seed(0)
    model = _pico(drop_path_rate=0.1).eval()
    with torch.no_grad():  # move the weights off their initial values
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    export_model(model, tmp_path / "export", {"data": {"num_classes": 5}})
    loaded = load_model(tmp_path / "export")
    assert isinstance(loaded, SwinTransformer) and loaded.preset == "swin_pico"
    assert loaded.init_kwargs["drop_path_rate"] == 0.1 and list(loaded.init_kwargs["depths"]) == [1, 1, 1, 1]
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded(x), model(x))
    assert not loaded.training

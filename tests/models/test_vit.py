"""The plain ViT: parity with timm, the model contract, clear errors."""

import pytest
import timm
import torch

import vitlab
from vitlab.errors import ModelOptionError, UnknownModelError
from vitlab.models.vit import VisionTransformer


def test_weights_map_into_timm_and_give_the_same_logits():
    torch.manual_seed(0)
    ours = vitlab.create_model("vit_pico", img_size=16, patch_size=4, in_chans=3, num_classes=7).eval()
    ref = timm.models.VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0
    ).eval()
    state = {k: v for k, v in ours.state_dict().items() if not k.endswith(("frozen_heads", "head_order"))}
    ref.load_state_dict(state, strict=True)
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


def test_model_contract():
    model = vitlab.create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=10).eval()
    x = torch.randn(2, 1, 8, 8)
    feats = model.forward_features(x)
    assert feats.shape == (2, 17, 64)
    torch.testing.assert_close(model.forward_head(feats), model(x))
    assert model.forward_head(feats, pre_logits=True).shape == (2, 64)
    final, inter = model.forward_intermediates(x, indices=[0, -1])
    assert len(inter) == 2 and inter[0].shape == (2, 64, 4, 4)  # feature maps of the 4x4 patch grid
    torch.testing.assert_close(final, feats)
    assert {"pos_embed", "cls_token"} <= model.no_weight_decay()


def test_create_model_records_its_arguments():
    model = vitlab.create_model("vit_nano", img_size=8, patch_size=2, num_classes=3)
    assert model.preset == "vit_nano"
    assert model.init_kwargs["embed_dim"] == 128 and model.init_kwargs["num_classes"] == 3


def test_list_models_pattern():
    names = vitlab.list_models("vit_*")
    assert {"vit_tiny", "vit_small", "vit_base"} <= set(names)
    assert all(n.startswith("vit_") for n in names)


def test_image_size_not_divisible_by_patch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"image size 30 is not divisible by the patch size 4.*data.img_size"):
        VisionTransformer(img_size=30, patch_size=4)


def test_unknown_model_and_unknown_option_are_clear_errors():
    with pytest.raises(UnknownModelError, match="Did you mean vit_tiny"):
        vitlab.create_model("vit_tinyy")
    with pytest.raises(ModelOptionError, match="has no option 'embed_dims'.*Did you mean embed_dim"):
        vitlab.create_model("vit_tiny", embed_dims=3)

"""ViTCAE model (spec vitcae.md sections 1-3): shapes, sampling, temperature, decoder conditioning, presets."""

import math

import pytest
import torch

from vitlab.diagnostics.capture import capture_attention
from vitlab.families.vitcae.model import FiLM, ViTCAE, ViTCAEOutput, unpatchify
from vitlab.layers import CrossAttention
from vitlab.models import create_model, list_models

B, IMG, PATCH, CHANS, CLASSES = 3, 8, 2, 1, 5
N = (IMG // PATCH) ** 2


def tiny_vitcae(**overrides) -> ViTCAE:
    kwargs = dict(
        img_size=IMG,
        patch_size=PATCH,
        in_chans=CHANS,
        num_classes=CLASSES,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_ratio=2.0,
        latent_dim=6,
        patch_latent_dim=4,
        decoder_dim=16,
        decoder_depth=1,
        decoder_heads=2,
        num_cond_tokens=3,
    )
    return ViTCAE(**{**kwargs, **overrides})


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(B, CHANS, IMG, IMG, generator=torch.Generator().manual_seed(0))


def test_presets_are_registered():
    assert list_models("vitcae_*") == ["vitcae_base", "vitcae_nano", "vitcae_pico", "vitcae_small", "vitcae_tiny"]


def test_pico_preset_runs_on_digit_sized_images():
    model = create_model("vitcae_pico", num_classes=10)
    out = model(torch.randn(2, 1, 8, 8))
    assert out.recon.shape == (2, 1, 8, 8)
    assert out.logits.shape == (2, 10)


def test_output_shapes(x):
    out = tiny_vitcae()(x)
    assert isinstance(out, ViTCAEOutput)
    assert out.recon.shape == x.shape
    assert out.logits.shape == (B, CLASSES)
    for name in ("z_cls", "mu_cls", "logvar_cls"):
        assert getattr(out, name).shape == (B, 6), name
    for name in ("z_pt", "mu_pt", "logvar_pt", "prior_mu_pt", "prior_logvar_pt", "pt_estimate"):
        assert getattr(out, name).shape == (B, N, 4), name


def test_training_samples_and_eval_uses_the_means(x):
    model = tiny_vitcae()
    out = model.train()(x)
    assert not torch.allclose(out.z_cls, out.mu_cls)
    assert not torch.allclose(out.z_pt, out.mu_pt)
    model.eval()
    first, second = model(x), model(x)
    assert torch.equal(first.z_cls, first.mu_cls)
    assert torch.equal(first.z_pt, first.mu_pt)
    assert torch.equal(first.recon, second.recon)
    assert torch.equal(first.logits, second.logits)


def test_generation_helpers_compose_to_forward(x):
    model = tiny_vitcae().eval()
    out = model(x)
    post = model.encode(x)
    prior_mu, prior_logvar = model.prior(post.mu_cls)
    torch.testing.assert_close(post.mu_pt, out.mu_pt)
    torch.testing.assert_close(prior_mu, out.prior_mu_pt)
    torch.testing.assert_close(prior_logvar, out.prior_logvar_pt)
    torch.testing.assert_close(model.estimate_patches(post.mu_cls), out.pt_estimate)
    torch.testing.assert_close(model.decode(post.mu_cls, post.mu_pt), out.recon)


def test_classifier_contract_gives_the_logits_of_mu_cls(x):
    model = tiny_vitcae().eval()
    out = model(x)
    features = model.forward_features(x)
    assert features.shape == (B, 1 + N, 16)
    torch.testing.assert_close(model.forward_head(features), out.logits)
    torch.testing.assert_close(model.forward_head(features, pre_logits=True), out.mu_cls)
    final, intermediates = model.forward_intermediates(x, indices=[-1])
    torch.testing.assert_close(final, features)
    assert len(intermediates) == 1


def test_no_weight_decay_names_real_parameters():
    model = tiny_vitcae()
    names = dict(model.named_parameters())
    skip = model.no_weight_decay()
    assert skip <= names.keys()
    assert {"encoder.pos_embed", "encoder.cls_token", "decoder_pos_embed", "encoder.blocks.1.attn.log_tau"} <= skip


def test_decode_rejects_patch_latents_of_the_wrong_shape():
    model = tiny_vitcae()
    with pytest.raises(ValueError, match=r"z_pt must have shape \[B, 16, 4\]"):
        model.decode(torch.randn(2, 6), torch.randn(2, N + 1, 4))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(num_classes=0), "num_classes >= 1"),
        (dict(num_cond_tokens=0), "num_cond_tokens"),
        (dict(img_size=9), "divisible"),
    ],
)
def test_bad_configuration_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_vitcae(**overrides)


@pytest.mark.parametrize("form", ["inverse", "divide"])
def test_temperature_multiplies_or_divides_the_attention_logits(x, form):
    torch.manual_seed(0)
    model = tiny_vitcae(temperature_form=form).eval()
    attn = model.encoder.blocks[0].attn
    tau = torch.tensor([2.0, 0.5])
    with torch.no_grad():
        attn.log_tau.copy_(tau.log())
        attn.qkv.weight.mul_(50.0)  # init weights give near-uniform attention; make the temperature visible
    captured = capture_attention(model.encoder, x)["blocks.0.attn"]

    with torch.no_grad():
        h = model.encoder.blocks[0].norm1(model.encoder.embed(x))
        q, k, _ = attn.qkv(h).view(B, 1 + N, 3, 2, 8).permute(2, 0, 3, 1, 4)
        logits = q @ k.transpose(-2, -1) / math.sqrt(8)
    tau = tau.view(1, 2, 1, 1)
    expected = (logits * tau if form == "inverse" else logits / tau).softmax(-1)
    torch.testing.assert_close(captured, expected)
    assert (captured - logits.softmax(-1)).abs().max() > 0.05


def test_encoder_attention_is_named_for_the_controller(x):
    maps = capture_attention(tiny_vitcae().eval(), x)
    assert {"encoder.blocks.0.attn", "encoder.blocks.1.attn", "decoder_blocks.0.attn"} <= maps.keys()
    assert maps["encoder.blocks.0.attn"].shape == (B, 2, 1 + N, 1 + N)


def test_film_is_the_identity_at_init():
    film = FiLM(cond_dim=5, dim=8)
    h, cond = torch.randn(2, 7, 8), torch.randn(2, 5)
    torch.testing.assert_close(film(h, cond), h)
    model_film = tiny_vitcae().decoder_blocks[0].film  # the model's weight init must keep the identity start
    h16 = torch.randn(2, 7, 16)
    torch.testing.assert_close(model_film(h16, torch.randn(2, 6)), h16)


def test_film_modulates_once_trained():
    film = FiLM(cond_dim=5, dim=8)
    with torch.no_grad():
        film.gamma.bias.fill_(2.0)
        film.beta.bias.fill_(-1.0)
    h = torch.randn(2, 7, 8)
    torch.testing.assert_close(film(h, torch.randn(2, 5)), 2.0 * h - 1.0)


def test_cross_attention_to_one_token_broadcasts_its_projected_value():
    torch.manual_seed(0)
    cross = CrossAttention(8, num_heads=2).eval()
    queries, context = torch.randn(2, 5, 8), torch.randn(2, 1, 8)
    value = cross.kv(context)[..., 8:]  # the kv projection is [keys | values]
    expected = cross.proj(value).expand(2, 5, 8)
    torch.testing.assert_close(cross(queries, context), expected)


def test_cross_attention_matches_a_manual_softmax():
    torch.manual_seed(0)
    cross = CrossAttention(8, num_heads=2).eval()
    queries, context = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    q = cross.q(queries).view(2, 5, 2, 4).transpose(1, 2)
    k, v = cross.kv(context).view(2, 4, 2, 2, 4).permute(2, 0, 3, 1, 4)
    weights = (q @ k.transpose(-2, -1) / 2.0).softmax(-1)  # head_dim 4 -> scale 1/2
    expected = cross.proj((weights @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(cross(queries, context), expected)


def test_unpatchify_places_each_token_on_its_patch():
    grid, patch, chans = (2, 3), 2, 2
    tokens = torch.arange(6.0).view(1, 6, 1).expand(1, 6, patch * patch * chans)
    image = unpatchify(tokens, grid, patch)
    assert image.shape == (1, chans, 4, 6)
    for row in range(2):
        for col in range(3):
            block = image[0, :, row * patch : (row + 1) * patch, col * patch : (col + 1) * patch]
            assert torch.all(block == row * 3 + col)


def test_unpatchify_rejects_a_wrong_token_count():
    with pytest.raises(ValueError, match="cannot unpatchify"):
        unpatchify(torch.randn(1, 5, 4), (2, 2), 2)

"""ViTCAE's presets, plain data: the family's preset table (``Family.presets``), from which the config check,
``vitlab list-models`` and the model registry read them."""

#: preset name -> constructor arguments
PRESETS: dict[str, dict] = {
    "vitcae_pico": dict(
        img_size=8,
        patch_size=2,
        in_chans=1,
        embed_dim=64,
        depth=4,
        num_heads=4,
        mlp_ratio=2.0,
        latent_dim=16,
        patch_latent_dim=8,
        decoder_dim=64,
        decoder_depth=2,
        decoder_heads=4,
    ),
    "vitcae_nano": dict(
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
        latent_dim=32,
        patch_latent_dim=16,
        decoder_dim=128,
        decoder_depth=3,
        decoder_heads=4,
    ),
    "vitcae_tiny": dict(
        embed_dim=192, depth=12, num_heads=3, latent_dim=64, patch_latent_dim=16, decoder_dim=192, decoder_depth=4
    ),
    "vitcae_small": dict(
        embed_dim=384,
        depth=12,
        num_heads=6,
        latent_dim=128,
        patch_latent_dim=32,
        decoder_dim=256,
        decoder_depth=4,
        decoder_heads=8,
    ),
    "vitcae_base": dict(
        embed_dim=768,
        depth=12,
        num_heads=12,
        latent_dim=256,
        patch_latent_dim=64,
        decoder_dim=512,
        decoder_depth=8,
        decoder_heads=16,
    ),
}


def _description(name: str, kw: dict) -> str:
    shape = f"encoder width {kw['embed_dim']}, depth {kw['depth']}; decoder width {kw['decoder_dim']}"
    return f"ViTCAE, {shape}" + (" (8x8 one-channel images such as digits, patch 2)" if name == "vitcae_pico" else "")


#: preset name -> (model class, description, constructor arguments): the family's table, read without torch
TABLE: dict[str, tuple[str, str, dict]] = {name: ("ViTCAE", _description(name, kw), kw) for name, kw in PRESETS.items()}

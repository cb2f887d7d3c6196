"""The FLOPs of one ViTCAE training step, counted by hand, and what freezing every encoder head removes from them.

Why by hand: on the CPU, SDPA runs PyTorch's flash kernel, whose backward ``torch.utils.flop_counter`` does not
count, and whose backward does more than the math path's (it recomputes ``Q K^T`` from the saved log-sum-exps
instead of keeping the attention matrix). The count here is tested against ``FlopCounterMode`` on the math path,
where every product is counted (``benchmarks/tests/test_freezing_flops.py``).

Conventions (those of ``FlopCounterMode``): a multiply-add is 2 FLOPs; only matrix products count (no norms,
activations, softmax, bias sums, optimizer); a linear map ``[n, i] -> [n, o]`` costs ``2 n i o`` forward and twice
that backward (input and weight gradient), except where its input needs no gradient (the patch embedding); the
attention of ``h`` heads of width ``d`` over ``n`` queries and ``m`` keys costs ``4 n m h d`` forward (``Q K^T`` and
``P V``) and ``8 n m h d`` backward on the math path (``dV``, ``dP``, ``dQ``, ``dK``), plus ``2 n m h d`` on the flash
kernel (the recomputed ``Q K^T``).

What freezing every head of an encoder layer removes (``vitlab.dynamics.frozen_heads``, eq. 26 of the ViTCAE
paper): the QKV weight gradient (all rows), the input gradient through ``q`` and ``k`` (through ``v`` it stays), and
the attention backward, replaced by one more flash call for ``dV = P^T dO`` on ``d + 1`` columns per head (``4 n^2
h (d + 1)``). Everything else (projection, MLP, norms, embedding, latents, decoder, losses) trains as before.
(``benchmarks/micro/freezing.py``'s ``step_flops`` counts a plain ViT classifier the same way, but a frozen head's
``dV`` as one product, ``2 n^2 d``: the math path's, not the flash call's.)

    python -m benchmarks.experiments.freezing_flops RUN_DIR [--out FILE.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _linear(rows: int, fan_in: int, fan_out: int, input_grad: bool = True) -> dict[str, int]:
    forward = 2 * rows * fan_in * fan_out
    return {"forward": forward, "backward": forward * (2 if input_grad else 1), "recompute": 0}


def _attention(batch: int, queries: int, keys: int, width: int) -> dict[str, int]:
    """``width = heads * head_dim``."""
    forward = 4 * batch * queries * keys * width
    return {"forward": forward, "backward": 2 * forward, "recompute": forward // 2}


def _add(*parts: dict[str, int], times: int = 1) -> dict[str, int]:
    return {key: times * sum(p[key] for p in parts) for key in ("forward", "backward", "recompute")}


def vitcae_step_flops(o: Any, batch: int) -> dict[str, dict[str, int]]:
    """FLOPs of one training step of ViTCAE with options ``o`` (:class:`~vitlab.families.vitcae.config.ViTCAEOptions`)
    on ``batch`` images, per part: ``{part: {"forward", "backward", "recompute"}}``, ``backward`` as the math path
    runs it, ``recompute`` what the CPU flash kernel's backward adds. ``T = N + 1`` encoder tokens (CLS), ``N``
    patches, ``M`` conditioning tokens; the losses' own products (a few [B, B] kernels) are not counted."""
    n = o.grid * o.grid
    t, c, hidden = n + 1, o.embed_dim, int(o.embed_dim * o.mlp_ratio)
    d, dec_hidden, m = o.decoder_dim, int(o.decoder_dim * o.mlp_ratio), o.num_cond_tokens
    bt, bn, z, zp = batch * t, batch * n, o.latent_dim, o.patch_latent_dim
    layers, blocks = o.depth, o.decoder_depth
    return {
        "patch_embed": _linear(bn, o.patch_size**2 * o.in_chans, c, input_grad=False),
        "encoder.qkv": _add(_linear(bt, c, 3 * c), times=layers),
        "encoder.attention": _add(_attention(batch, t, t, c), times=layers),
        "encoder.proj": _add(_linear(bt, c, c), times=layers),
        "encoder.mlp": _add(_linear(bt, c, hidden), _linear(bt, hidden, c), times=layers),
        "latents": _add(
            _linear(batch, c, z),
            _linear(batch, c, z),
            _linear(bn, c, zp),
            _linear(bn, c, zp),  # posteriors
            _linear(batch, z, c),
            _linear(batch, c, 2 * n * zp),
            _linear(batch, z, c),
            _linear(batch, c, n * zp),
            _linear(batch, z, o.num_classes),
        ),
        "decoder.embed_head": _add(
            _linear(bn, zp, d), _linear(batch, z, m * d), _linear(bn, d, o.patch_size**2 * o.in_chans)
        ),
        "decoder.self_attention": _add(
            _linear(bn, d, 3 * d), _attention(batch, n, n, d), _linear(bn, d, d), times=blocks
        ),
        "decoder.cross_attention": _add(
            _linear(bn, d, d), _linear(batch * m, d, 2 * d), _attention(batch, n, m, d), _linear(bn, d, d), times=blocks
        ),
        "decoder.mlp_film": _add(
            _linear(bn, d, dec_hidden),
            _linear(bn, dec_hidden, d),
            _linear(batch, z, d),
            _linear(batch, z, d),
            times=blocks,
        ),
    }


def frozen_savings(o: Any, batch: int) -> dict[str, int]:
    """FLOPs that freezing every head of every encoder layer removes from :func:`vitcae_step_flops` (net of the ``dV``
    call it adds): ``qkv_weight_grad``, ``qk_input_grad``, and ``attention_backward`` on the math path (its four
    products less the ``dV`` call) and ``attention_recompute`` on the flash kernel (its recomputed ``Q K^T``)."""
    t, c, layers = o.grid * o.grid + 1, o.embed_dim, o.depth
    bt = batch * t
    dv_call = 4 * batch * t * t * (c + o.num_heads)  # Q K^T and P V on d + 1 columns per head
    return {
        "qkv_weight_grad": layers * 2 * bt * c * 3 * c,
        "qk_input_grad": layers * 2 * bt * 2 * c * c,
        "attention_backward": layers * (_attention(batch, t, t, c)["backward"] - dv_call),
        "attention_recompute": layers * _attention(batch, t, t, c)["recompute"],
    }


def whole_layer_savings(o: Any, batch: int) -> list[int]:
    """FLOPs removed by freezing the first ``k`` encoder layers whole (every parameter, the patch embedding too), for
    ``k = 1 .. depth``: their whole backward (recompute included), the embedding's weight gradient, and the input
    gradient below the first layer still trained (its QKV's; with every layer frozen, the posterior heads')."""
    parts, n = vitcae_step_flops(o, batch), o.grid * o.grid
    layer = sum(p["backward"] + p["recompute"] for name, p in parts.items() if name.startswith("encoder.")) // o.depth
    qkv_input = 2 * batch * (n + 1) * 3 * o.embed_dim * o.embed_dim
    posteriors = 2 * 2 * batch * o.embed_dim * (o.latent_dim + n * o.patch_latent_dim)
    below = [qkv_input] * (o.depth - 1) + [posteriors]
    return [parts["patch_embed"]["backward"] + k * layer + below[k - 1] for k in range(1, o.depth + 1)]


def flops_record(o: Any, batch: int) -> dict[str, Any]:
    """Step and ceiling in FLOPs, on the math path's count and on the flash kernel's (which adds the recompute)."""
    parts = vitcae_step_flops(o, batch)
    saved = frozen_savings(o, batch)
    math_step = sum(p["forward"] + p["backward"] for p in parts.values())
    flash_step = math_step + sum(p["recompute"] for p in parts.values())
    math_saved = saved["qkv_weight_grad"] + saved["qk_input_grad"] + saved["attention_backward"]
    flash_saved = math_saved + saved["attention_recompute"]
    whole = enumerate(whole_layer_savings(o, batch))
    encoder = [p for name, p in parts.items() if name.startswith("encoder.")]
    layer_backward = sum(p["backward"] for p in encoder) // o.depth  # the whole backward of one encoder layer
    layer_recompute = sum(p["recompute"] for p in encoder) // o.depth
    return {
        "batch": batch,
        "one_encoder_layer_backward": {"math_path": layer_backward, "flash_kernel": layer_backward + layer_recompute},
        "convention": "2 FLOPs per multiply-add; matrix products only (FlopCounterMode's)",
        "parts": parts,
        "every_head_frozen_removes": saved,
        "math_path": {"step": math_step, "saved": math_saved, "share": math_saved / math_step},
        "flash_kernel": {"step": flash_step, "saved": flash_saved, "share": flash_saved / flash_step},
        "first_layers_frozen_whole": [{"layers": k + 1, "saved": v, "share": v / flash_step} for k, v in whole],
    }


def run_options(run: Path) -> tuple[Any, int]:
    """The model options and batch size a run trained with (from its checkpoint)."""
    from vitlab.export import checkpoint_hparams, read_checkpoint
    from vitlab.families.vitcae.config import ViTCAEOptions
    from vitlab.models.registry import resolved_kwargs
    from vitlab.rundir import LAST_CHECKPOINT, config_with_overrides, locate_checkpoint

    hp = checkpoint_hparams(read_checkpoint(locate_checkpoint(run, prefer=(LAST_CHECKPOINT,))))
    cfg = config_with_overrides(hp["config"], None)
    return ViTCAEOptions(**resolved_kwargs(cfg.model["name"], **hp["model_kwargs"])), cfg.data.batch_size


def main(argv: list[str] | None = None) -> None:
    import argparse

    from benchmarks.naming import repo_relative
    from vitlab.environment import environment

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder of the recipe (its model options and batch)")
    parser.add_argument("--out", type=Path, help="a results file to write (default: print)")
    args = parser.parse_args(argv)
    record = flops_record(*run_options(args.run))
    if args.out is None:
        print(json.dumps(record, indent=1))
        return
    env = environment()
    env["command"] = repo_relative(env.get("command"))
    command = repo_relative(["python", "-m", "benchmarks.experiments.freezing_flops", *argv])
    record |= {"model_from": repo_relative(str(args.run)), "environment": env, "command": command}
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

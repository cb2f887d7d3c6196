"""Which reading of the card's "MicroEncoder (4-stage Swin-like, 29.8M params)" fits "FLOPs 1.81G" at 256 tokens.

    OMP_NUM_THREADS=1 python -m benchmarks.micro.cet_flops > benchmarks/results/micro/cet_flops_cpu_2026-12-01.json

Forward FLOPs of one 32x32 image, counted by ``torch.utils.flop_counter.FlopCounterMode`` (2 FLOPs per
multiply-add; matmuls, convolutions and SDPA; norms, softmax and GELU are not counted). Readings:

- ``as_built``: ``cet_vit_base`` (patch 2, 256 tokens, four Swin stages at full resolution, no patch merging),
  per part;
- ``swin_merging_<depths>``: a Swin-T-like stack with patch merging at 32x32 / patch 2 (timm ``SwinTransformer``,
  widths 96-768, window 4, grids 16 -> 8 -> 4 -> 2), the usual meaning of "4-stage Swin-like";
- ``as_built["gmacs"]``: the as-built model's multiply-adds (one FLOP per MAC, the other convention);
- ``as_built_64_tokens``: the same model at patch 4 (64 tokens), to see whether 1.81G was counted at another input;
- ``merging_plus_rest``: the merging stack plus the as-built parts after the MicroEncoder at 256 tokens (what the
  model would cost if the grouping kept 256 tokens while the stack merged patches; not a runnable model).
"""

from __future__ import annotations

import json

import torch
from timm.models.swin_transformer import SwinTransformer
from torch.utils.flop_counter import FlopCounterMode

from vitlab.families.cet_vit.model import param_breakdown
from vitlab.models import create_model


def flops(module: torch.nn.Module, x: torch.Tensor) -> tuple[int, dict[str, int]]:
    counter = FlopCounterMode(display=False, depth=1)
    with torch.no_grad(), counter:
        module(x)
    counts = counter.get_flop_counts()  # keys: "Global", "<Class>", "<Class>.<child>", ...
    per_part: dict[str, tuple[int, int]] = {}  # part -> (depth of the entry, FLOPs): the shallowest entry wins
    for name, v in counts.items():  # a ModuleList child (deep_encoder.0) is counted per element, so sum those
        if "." in name:
            part, depth = name.split(".")[1], name.count(".")
            best = per_part.get(part)
            if best is None or depth < best[0]:
                per_part[part] = (depth, sum(v.values()))
            elif depth == best[0]:
                per_part[part] = (depth, best[1] + sum(v.values()))
    return counter.get_total_flops(), {part: f for part, (_, f) in per_part.items()}


def params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(1, 3, 32, 32)
    base = create_model("cet_vit_base").eval()
    total, per_part = flops(base, x)
    out: dict = {
        "card": {"params_total": 33.12e6, "params_micro_encoder": 29.8e6, "flops": 1.81e9, "tokens": 256},
        "as_built": {
            "params": params(base),
            "params_per_part": param_breakdown(base),
            "gflops": total / 1e9,
            "gflops_per_part": {k: v / 1e9 for k, v in per_part.items()},
            "gmacs": total / 2e9,
        },
    }
    parts = out["as_built"]["gflops_per_part"]
    rest = out["as_built"]["gflops"] - parts["micro_encoder"] - parts["patch_embed"]
    p4 = create_model("cet_vit_base", patch_size=4).eval()
    out["as_built_64_tokens"] = {"params": params(p4), "gflops": flops(p4, x)[0] / 1e9}
    out["as_built_64_tokens"]["gmacs"] = out["as_built_64_tokens"]["gflops"] / 2
    for depths, window in (((2, 2, 6, 2), 4), ((2, 2, 6, 2), 7), ((2, 2, 8, 2), 4), ((2, 2, 18, 2), 4)):
        swin = SwinTransformer(
            img_size=32,
            patch_size=2,
            embed_dim=96,
            depths=depths,
            num_heads=(3, 6, 12, 24),
            window_size=window,
            num_classes=0,
        ).eval()
        total, _ = flops(swin, x)
        key = f"swin_merging_{'-'.join(map(str, depths))}_window{window}"
        out[key] = {"params": params(swin), "gflops": total / 1e9, "gmacs": total / 2e9}
    merging = out["swin_merging_2-2-8-2_window4"]
    out["merging_plus_rest"] = {
        "params": merging["params"]
        + sum(v for k, v in out["as_built"]["params_per_part"].items() if k != "micro_encoder"),
        "gflops": merging["gflops"] + rest,
        "gmacs": (merging["gflops"] + rest) / 2,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

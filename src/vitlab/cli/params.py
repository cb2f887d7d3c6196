"""``vitlab params``: parameters per part and forward FLOPs per image of a model preset.

Examples::

    vitlab params cet_vit_nano num_classes=10
    vitlab params swin_matched_cet_vit_base
    vitlab params vit_nano img_size=32 patch_size=2 num_classes=100
"""

from __future__ import annotations

import argparse

from vitlab.cli.registry import Runner, command


@command("params", "parameter count per part and forward FLOPs per image of a model preset")
def _params(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("model", help="preset name (see `vitlab list-models`)")
    p.epilog = "Constructor overrides follow the name as key=value, e.g. img_size=32 num_classes=100."

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        from vitlab.config import parse_overrides
        from vitlab.models import count_params, create_model, flops_per_image
        from vitlab.models.sizing import input_shape_of

        model = create_model(args.model, **parse_overrides(overrides))
        counts = count_params(model)
        total = counts.pop("total")
        shape = input_shape_of(model)
        width = max(len(name) for name in counts)
        lines = [f"{args.model} ({type(model).__name__}), input {'x'.join(str(s) for s in shape)}"]
        lines += [f"  {name:<{width}}  {n:>12,}  {n / total:6.1%}" for name, n in counts.items()]
        lines.append(f"  {'total':<{width}}  {total:>12,}  ({total / 1e6:.2f}M)")
        flops = flops_per_image(model, shape)
        lines.append(f"FLOPs per image: {flops:,} ({flops / 1e9:.3f} GFLOPs; a multiply-add counts as 2)")
        print("\n".join(lines))
        return 0

    return run

"""Consensus-cluster counts (ViTCAE's kappa) in float32 against float64 eigenvalues, and their time.

Pushes the first ``--images`` images of an npz file through three freshly initialised ViTCAE-pico encoders whose
``W_qkv`` is scaled 1x, 4x and 7x (sharper attention, as training makes it), counts the clusters of every encoder
head and image with ``consensus_clusters`` in both precisions, and prints how many counts agree and the seconds
each precision took. Run (single-threaded, seconds)::

    python -m benchmarks.micro.kappa_precision ../shared/datasets/celeba32_subset.npz
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vitlab.diagnostics.capture import capture_attention
from vitlab.diagnostics.dynamics import consensus_clusters
from vitlab.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("npz", help="an npz with x_train [N, H, W, 3] uint8 (e.g. the 32x32 CelebA subset)")
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--eps", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.from_numpy(np.load(args.npz)["x_train"][: args.images]).float().permute(0, 3, 1, 2) / 255
    agree = total = 0
    seconds = {torch.float64: 0.0, torch.float32: 0.0}
    for seed, sharpen in enumerate((1.0, 4.0, 7.0)):
        torch.manual_seed(seed)
        model = create_model("vitcae_pico", img_size=x.shape[-1], patch_size=4, in_chans=3, num_classes=2).eval()
        with torch.no_grad():
            for block in model.encoder.blocks:
                block.attn.qkv.weight.mul_(sharpen)
            maps = capture_attention(model, x)
        for name, attn in maps.items():
            if not name.startswith("encoder"):
                continue
            counts = {}
            for dtype in seconds:
                start = time.perf_counter()
                counts[dtype] = consensus_clusters(attn, args.eps, dtype=dtype)
                seconds[dtype] += time.perf_counter() - start
            agree += int((counts[torch.float64] == counts[torch.float32]).sum())
            total += counts[torch.float64].numel()
    print(
        f"float32 counts equal float64 on {agree}/{total} (image, head) pairs; "
        f"float64 {seconds[torch.float64]:.2f} s, float32 {seconds[torch.float32]:.2f} s"
    )


if __name__ == "__main__":
    main()

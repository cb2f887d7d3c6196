"""The faithfulness measures worked by hand: the deletion masks, patch sums, the rank correlation, randomisation."""

from __future__ import annotations

import numpy as np
import torch

from vitlab.explain.evaluate import _masks, deletion_insertion, patch_relevance, randomised_copy, rank_correlation
from vitlab.models import create_model


def test_masks_take_the_patches_in_order() -> None:
    masks = _masks(torch.tensor([2, 0, 1, 3]), grid=(2, 2), patch=2, steps=2)
    assert masks.shape == (3, 1, 4, 4)
    assert masks[0].sum() == 0 and masks[2].sum() == 16
    # step 1: the first two patches of the order, 2 (bottom left) and 0 (top left)
    torch.testing.assert_close(masks[1, 0], torch.tensor([[1.0, 1, 0, 0]] * 2 + [[1.0, 1, 0, 0]] * 2))


def test_patch_relevance_averages_each_patch() -> None:
    maps = torch.arange(16.0).view(1, 4, 4)
    torch.testing.assert_close(patch_relevance(maps, 2), torch.tensor([[2.5, 4.5, 10.5, 12.5]], dtype=torch.float64))


def test_rank_correlation_of_a_map_with_itself_and_its_reverse() -> None:
    a = torch.arange(1.0, 17.0).view(1, 4, 4)
    np.testing.assert_allclose(rank_correlation(a, a), [1.0])
    np.testing.assert_allclose(rank_correlation(a, 17 - a), [-1.0])
    assert np.isnan(rank_correlation(a, torch.ones_like(a))[0])


def test_deletion_of_everything_ends_at_the_blank_image_and_randomisation_changes_every_weight() -> None:
    torch.manual_seed(0)
    model = create_model("vit_pico", num_classes=3, img_size=8, patch_size=2, depth=1).eval()
    x = torch.randn(1, 3, 8, 8)
    target = model(x).argmax(-1)
    order = torch.arange(16)[None]
    deletion, insertion = deletion_insertion(model, x, target, order, patch=2, steps=1)
    with torch.no_grad():
        full = model(x).softmax(-1)[0, target[0]]
        blank = model(torch.zeros_like(x)).softmax(-1)[0, target[0]]
    np.testing.assert_allclose(deletion, [(full + blank) / 2], rtol=1e-5)  # two points: all kept, all removed
    np.testing.assert_allclose(insertion, deletion, rtol=1e-5)  # with one step the two curves share their ends
    fresh = randomised_copy(model)
    trained, fresh_params = dict(model.named_parameters()), dict(fresh.named_parameters())
    assert all(not torch.equal(p, fresh_params[n]) for n, p in trained.items() if "norm" not in n)

"""Token Merging (Bolya et al. 2023): the matching against a loop reference and a hand-worked case, the invariants of
size-weighted merging, proportional attention, and the ToMe option of the ViT."""

import pytest
import torch
import torch.nn.functional as F

import vitlab
from vitlab.layers import Attention, Block
from vitlab.layers.tome import bipartite_soft_matching, merge_wavg


def reference_merge(metric, x, size, r, class_token):
    """ToMe sec. 3 spelled out with Python loops, one image at a time: A = even positions, B = odd positions, each
    A token's most similar B token by cosine similarity, the r best edges merged by size-weighted average."""
    outs, sizes = [], []
    for m, xb, sb in zip(metric, x, size, strict=True):
        n = len(m)
        r_b = min(r, (n - int(class_token)) // 2)
        set_a, set_b = list(range(0, n, 2)), list(range(1, n, 2))
        edges = []
        for i in set_a:
            if class_token and i == 0:
                continue
            sims = [F.cosine_similarity(m[i], m[j], dim=0).item() for j in set_b]
            best = max(range(len(set_b)), key=lambda k: sims[k])
            edges.append((sims[best], i, set_b[best]))
        merged = sorted(edges, reverse=True)[:r_b]
        groups = {j: [j] for j in set_b}
        for _, i, j in merged:
            groups[j].append(i)
        gone = {i for _, i, _ in merged}
        rows = [groups.get(p, [p]) for p in range(n) if p not in gone]  # the tokens left, in their order
        outs.append(torch.stack([(xb[g] * sb[g]).sum(0) / sb[g].sum() for g in rows]))
        sizes.append(torch.stack([sb[g].sum(0) for g in rows]))
    return torch.stack(outs), torch.stack(sizes)


@pytest.mark.parametrize(("n", "r", "class_token"), [(9, 3, True), (10, 4, False), (7, 8, True), (6, 0, True)])
def test_merge_matches_the_loop_reference(n, r, class_token):
    g = torch.Generator().manual_seed(n + r)
    metric = torch.randn(3, n, 5, generator=g)
    x = torch.randn(3, n, 4, generator=g)
    size = torch.rand(3, n, 1, generator=g) + 0.5
    got_x, got_size = merge_wavg(bipartite_soft_matching(metric, r, class_token), x, size)
    want_x, want_size = reference_merge(metric, x, size, r, class_token)
    torch.testing.assert_close(got_x, want_x)
    torch.testing.assert_close(got_size, want_size)


def test_hand_worked_case():
    # positions:   0 (CLS)   1        2        3        4
    # set:          A        B        A        B        A
    metric = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.2]]])
    x = torch.tensor([[[10.0], [1.0], [2.0], [3.0], [4.0]]])
    size = torch.tensor([[[1.0], [1.0], [1.0], [3.0], [1.0]]])
    # CLS -> 1 would score 1.0 but is protected; 2 -> 3 scores 1.0; 4 -> 1 scores cos = 0.98. With r = 1 only 2 -> 3.
    matching = bipartite_soft_matching(metric, 1, class_token=True)
    merged, merged_size = merge_wavg(matching, x, size)
    # tokens 0, 1, 3 (now 3 + 2), 4 in their order; the merged token is (3 * 3 + 2 * 1) / 4
    torch.testing.assert_close(merged, torch.tensor([[[10.0], [1.0], [11.0 / 4], [4.0]]]))
    torch.testing.assert_close(merged_size, torch.tensor([[[1.0], [1.0], [4.0], [1.0]]]))
    # r = 2 also merges 4 into 1
    merged, merged_size = merge_wavg(bipartite_soft_matching(metric, 2, class_token=True), x, size)
    torch.testing.assert_close(merged, torch.tensor([[[10.0], [2.5], [11.0 / 4]]]))
    torch.testing.assert_close(merged_size, torch.tensor([[[1.0], [2.0], [4.0]]]))


@pytest.mark.parametrize("r", [1, 3, 5])
def test_merging_preserves_total_size_and_size_weighted_mean(r):
    g = torch.Generator().manual_seed(r)
    metric, x = torch.randn(2, 11, 6, generator=g), torch.randn(2, 11, 4, generator=g)
    size = torch.randint(1, 5, (2, 11, 1), generator=g).float()
    merged, merged_size = merge_wavg(bipartite_soft_matching(metric, r), x, size)
    assert merged.shape == (2, 11 - r, 4) and merged_size.shape == (2, 11 - r, 1)
    torch.testing.assert_close(merged_size.sum(1), size.sum(1))
    torch.testing.assert_close((merged * merged_size).sum(1) / merged_size.sum(1), (x * size).sum(1) / size.sum(1))


def test_class_token_is_never_merged_even_when_it_is_the_best_match():
    g = torch.Generator().manual_seed(0)
    metric = torch.randn(4, 9, 3, generator=g)
    metric[:, 0] = metric[:, 1]  # CLS identical to a B token: the most similar pair of all
    x = torch.randn(4, 9, 2, generator=g)
    size = torch.ones(4, 9, 1)
    matching = bipartite_soft_matching(metric, 4, class_token=True)
    assert (matching.kept_pos[:, 0] == 0).all() and not (matching.src_pos == 0).any()
    merged, merged_size = merge_wavg(matching, x, size)
    torch.testing.assert_close(merged[:, 0], x[:, 0])
    assert (merged_size[:, 0] == 1).all()
    # without protection the CLS token is the first to go
    assert (bipartite_soft_matching(metric, 1, class_token=False).src_pos == 0).all()


def test_r_is_capped_by_the_tokens_set_a_can_give():
    metric = torch.randn(1, 6, 3)
    assert bipartite_soft_matching(metric, 10, class_token=True).r == 2  # A = {0 (CLS), 2, 4}
    assert bipartite_soft_matching(metric, 10, class_token=False).r == 3
    assert bipartite_soft_matching(metric[:, :1], 10, class_token=True).r == 0


def test_unmerge_gives_every_token_the_value_of_its_group():
    g = torch.Generator().manual_seed(1)
    metric, x = torch.randn(2, 9, 4, generator=g), torch.randn(2, 9, 3, generator=g)
    matching = bipartite_soft_matching(metric, 3)
    merged, _ = merge_wavg(matching, x, torch.ones(2, 9, 1))
    back = matching.unmerge(merged)
    assert back.shape == x.shape
    for b in range(2):
        untouched = sorted(set(range(9)) - set(matching.src_pos[b].tolist()) - set(matching.dst_pos[b].tolist()))
        torch.testing.assert_close(back[b, untouched], x[b, untouched])
        for src, dst in zip(matching.src_pos[b], matching.dst_pos[b], strict=True):
            torch.testing.assert_close(back[b, src], back[b, dst])  # a merged pair shares its group's value
            assert not torch.allclose(back[b, src], x[b, src])


def test_r_zero_is_the_identity():
    x = torch.randn(2, 7, 3)
    matching = bipartite_soft_matching(torch.randn(2, 7, 4), 0)
    assert matching.r == 0
    torch.testing.assert_close(matching.merge(x), x)
    torch.testing.assert_close(matching.unmerge(x), x)


def test_clear_errors():
    with pytest.raises(ValueError, match="r .* must be >= 0"):
        bipartite_soft_matching(torch.randn(1, 5, 2), -1)
    with pytest.raises(ValueError, match=r"metric must be \[B, N, C\]"):
        bipartite_soft_matching(torch.randn(5, 2), 1)
    matching = bipartite_soft_matching(torch.randn(1, 5, 2), 1)
    with pytest.raises(ValueError, match=r"size must be \[B, N, 1\]"):
        merge_wavg(matching, torch.randn(1, 5, 2), torch.ones(1, 5))
    with pytest.raises(ValueError, match=r"expected tokens \[B, 5, C\]"):
        matching.merge(torch.randn(1, 4, 2))
    with pytest.raises(ValueError, match="needs global_pool='token'"):
        vitlab.create_model("tome_pico", global_pool="avg")


def test_proportional_attention_treats_a_token_of_size_s_as_s_copies():
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2).eval()
    tokens = torch.randn(1, 3, 8)
    copies = torch.cat([tokens, tokens[:, 2:].expand(-1, 2, -1)], dim=1)  # token 2 three times
    with torch.no_grad():
        want = attn(copies)[:, :3]
        got = attn(tokens, size=torch.tensor([[[1.0], [1.0], [3.0]]]))
    torch.testing.assert_close(got, want)


def test_merging_block_with_r_zero_equals_the_plain_block():
    torch.manual_seed(0)
    block = Block(16, num_heads=4).eval()
    x = torch.randn(2, 7, 16)
    merged, size = block.forward_merging(x, torch.ones(2, 7, 1), r=0)
    torch.testing.assert_close(merged, block(x), atol=1e-6, rtol=0)
    assert (size == 1).all()


def test_tome_with_r_zero_equals_the_plain_vit():
    torch.manual_seed(0)
    plain = vitlab.create_model("vit_pico", img_size=16, patch_size=4, num_classes=5).eval()
    tome = vitlab.create_model("tome_pico", img_size=16, patch_size=4, num_classes=5, tome_r=0).eval()
    tome.load_state_dict(plain.state_dict())  # same keys: ToMe adds no parameters
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(tome(x), plain(x), atol=1e-6, rtol=0)
    tome.tome_r = 2
    assert (tome(x) - plain(x)).abs().max() > 1e-4  # and merging does change the result


def test_exactly_r_tokens_disappear_per_block_and_cls_stays_first():
    torch.manual_seed(0)
    model = vitlab.create_model("tome_pico", img_size=16, patch_size=4, num_classes=5, tome_r=3).eval()
    x = torch.randn(2, 3, 16, 16)
    _, inter = model.forward_intermediates(x, output_fmt="NLC")
    assert [t.shape[1] for t in inter] == [13, 10, 7, 4]  # 16 patch tokens (+ CLS), 3 fewer after each of the 4 blocks
    # the CLS token's path: merging never touches position 0, so the head reads the CLS token
    feats = model.forward_features(x)
    torch.testing.assert_close(model.forward_head(feats), model(x))
    # once the tokens run low, a block merges what set A can give: 17 -> 9 -> 5 -> 3 -> 2 (CLS included)
    model.tome_r = 8
    assert [t.shape[1] for t in model.forward_intermediates(x, output_fmt="NLC")[1]] == [8, 4, 2, 1]


def test_tome_trains():
    torch.manual_seed(0)
    model = vitlab.create_model("tome_pico", img_size=16, patch_size=4, num_classes=5, tome_r=4).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 5
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]

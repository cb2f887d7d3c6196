"""CET-ViT (spec sections 1-2): the V-CEO functions, the Dynamic-K estimator, shapes, gradients, parameter counts."""

import pytest
import torch
import torch.nn.functional as F

from vitlab.diagnostics.capture import capture_attention
from vitlab.families.cet_vit.model import CETViT, param_breakdown
from vitlab.families.cet_vit.parts import MicroEncoder
from vitlab.families.cet_vit.slots import dynamic_k_assignment, pool_slots, slot_usage_k, topk_softmax
from vitlab.models import create_model

SMALL_PRESETS = ["cet_vit_pico", "cet_vit_nano", "cet_vit_tiny"]


# ---------------------------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
def test_topk_softmax_rows_sum_to_one_with_exactly_k_nonzeros(k):
    logits = torch.randn(2, 10, 8)
    S = topk_softmax(logits, k)
    torch.testing.assert_close(S.sum(-1), torch.ones(2, 10))
    assert ((S > 0).sum(-1) == k).all()
    # The non-zeros sit on the k largest logits and follow their softmax.
    values, index = logits.topk(k, dim=-1)
    torch.testing.assert_close(S.gather(-1, index), values.softmax(-1))


def test_topk_softmax_with_k_equal_to_all_slots_is_the_dense_softmax():
    logits = torch.randn(3, 7, 6)
    torch.testing.assert_close(topk_softmax(logits, 6), logits.softmax(-1))


def test_topk_softmax_rejects_k_outside_the_slots():
    with pytest.raises(ValueError, match="1 <= k <= K"):
        topk_softmax(torch.randn(1, 2, 4), 5)


def test_slot_usage_k_hand_case():
    # 50 tokens over 4 slots: usage 0.6, 0.36, 0.04, 0 -> two slots above 5%.
    slots = torch.tensor([0] * 30 + [1] * 18 + [2] * 2)
    S = F.one_hot(slots, 4).float().unsqueeze(0)
    assert slot_usage_k(S).tolist() == [2]
    assert slot_usage_k(S, threshold=0.03).tolist() == [3]


def test_pool_slots_mean_and_sum_hand_case():
    tokens = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 4.0]]).unsqueeze(0)
    # Tokens 0 and 1 wholly in slot 0; token 2 split 0.5 / 0.5 between slots 1 and 2; slot 3 empty.
    S = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 0.5, 0.5, 0]]).unsqueeze(0)
    summed = pool_slots(S, tokens, "sum")
    torch.testing.assert_close(summed[0], torch.tensor([[4.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 0.0]]))
    mean = pool_slots(S, tokens, "mean")
    # Slot 0 holds two tokens -> their average; slots under one token's mass keep their sum; empty -> zero.
    torch.testing.assert_close(mean[0], torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 0.0]]))


def test_dynamic_k_assignment_forward_is_the_masked_topk_softmax_of_the_chosen_budget():
    logits = torch.randn(3, 5, 8)
    candidates = (3, 4, 8)
    choice = F.one_hot(torch.tensor([0, 1, 2]), 3).float()
    S = dynamic_k_assignment(logits, choice, candidates, k=3)
    for b, budget in enumerate([3, 4, 8]):
        expected = topk_softmax(logits[b : b + 1].masked_fill(torch.arange(8) >= budget, float("-inf")), 3)
        torch.testing.assert_close(S[b : b + 1], expected)
        assert S[b, :, budget:].abs().sum() == 0


def test_dynamic_k_assignment_passes_a_gradient_to_every_candidate():
    estimator_logits = torch.randn(4, 3, requires_grad=True)
    choice = F.gumbel_softmax(estimator_logits, hard=True)
    S = dynamic_k_assignment(torch.randn(4, 6, 8), choice, (3, 4, 8), k=3)
    (S * torch.randn_like(S)).sum().backward()
    assert (estimator_logits.grad.abs().sum(0) > 0).all()


# ---------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_output_shapes(name):
    torch.manual_seed(0)
    model = create_model(name, img_size=8, num_classes=5, dynamic_k="gumbel").eval()
    B, N, K = 2, 16, model.num_slots
    x = torch.randn(B, 3, 8, 8)
    logits, aux = model.forward_with_aux(x)
    tokens = model.forward_features(x)  # both streams, each in its half of the 2D channels
    D = model.embed_dim
    assert logits.shape == (B, 5)
    torch.testing.assert_close(model(x), logits)
    assert tokens.shape == (B, N + K, 2 * D) and model.num_features == 2 * D
    assert not tokens[:, :N, D:].any() and not tokens[:, N:, :D].any()
    assert model.forward_head(tokens, pre_logits=True).shape == (B, 2 * D)
    assert aux.S.shape == (B, N, K) and aux.h_macro.shape == (B, K, D)
    assert aux.slot_usage_k.shape == (B,) and aux.k_chosen.shape == (B,) and aux.k_expected.shape == (B,)
    assert all(aux.ei[t].shape == (B,) for t in ("norm_entropy", "reversibility", "degen"))
    assert aux.ei_loss.ndim == 0 and aux.k_cost.ndim == 0
    assert torch.isfinite(logits).all()


def test_chosen_budget_masks_the_slots_beyond_it_and_eval_takes_the_argmax():
    torch.manual_seed(0)
    model = create_model("cet_vit_pico", img_size=8, dynamic_k="gumbel").eval()
    _, aux = model.forward_with_aux(torch.randn(4, 3, 8, 8))
    candidates = torch.tensor(model.k_estimator.k_candidates)
    torch.testing.assert_close(aux.k_chosen, candidates[aux.k_probs.argmax(-1)])
    torch.testing.assert_close(aux.k_expected, aux.k_probs @ candidates.float())
    torch.testing.assert_close(aux.k_cost, aux.k_expected.mean() / model.num_slots)
    for b, budget in enumerate(aux.k_chosen.tolist()):
        assert aux.S[b, :, budget:].abs().sum() == 0
        assert ((aux.S[b] > 0).sum(-1) == 3).all()


def _training_loss(model, x, y, lambda_ei=0.05, lambda_k=0.01):
    logits, aux = model.forward_with_aux(x)
    return F.cross_entropy(logits, y) + aux.regularization(lambda_ei, lambda_k)


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_every_parameter_gets_a_nonzero_gradient(name):
    """No dead weights (card, Disclosure 1): CE + EI + k_cost reaches every parameter, the estimator included."""
    torch.manual_seed(0)
    model = create_model(name, img_size=16, num_classes=4, dynamic_k="gumbel").train()
    _training_loss(model, torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])).backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert dead == []


@pytest.mark.parametrize(
    "options", [dict(select_grad="dense_st"), dict(dynamic_k="gumbel"), dict(dynamic_k="exact")], ids=str
)
def test_an_empty_slot_gives_every_parameter_a_bounded_ei_gradient(options):
    """The EI degeneracy term at an empty slot (cosine of a zero macro token): every gradient below 1e3 under each
    selection gradient and Dynamic-K mode (with F.normalize it reached 1e8-1e11)."""
    torch.manual_seed(0)
    model = create_model("cet_vit_nano", **options).train()
    with torch.no_grad():
        model.v_ceo.assign.bias[5] -= 2.0  # slot 5 leaves every token's top 3
    _, aux = model.forward_with_aux(torch.randn(4, 3, 32, 32))
    assert not (aux.S.detach().sum(1) > 0).all(), "the case needs at least one empty slot"
    aux.ei["degen"].mean().backward()
    worst = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
    assert worst < 1e3


def test_dense_selection_with_ei_keeps_more_than_one_slot_in_use():
    """Dense straight-through selection + the full EI term under clipping at 1.0 (the card's recipe): training
    spreads the tokens over several slots instead of collapsing them into one group. Under top-3 every token fills
    3 slots, so the collapse reads as slot-usage K = 3 (it did, at gradient norms of 1e10-1e12, before the
    degeneracy term skipped empty slots); here K stays near 9 of 16."""
    torch.manual_seed(0)
    model = create_model("cet_vit_pico", img_size=16, num_classes=4, select_grad="dense_st").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    x, y = torch.randn(32, 3, 16, 16), torch.arange(32) % 4
    for _ in range(30):
        logits, aux = model.forward_with_aux(x)
        loss = F.cross_entropy(logits, y) + aux.regularization(1.0, 0.0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    _, aux = model.eval().forward_with_aux(x)
    assert aux.slot_usage_k.float().mean().item() > model.v_ceo.topk + 1


def test_dynamic_k_estimator_learns_from_the_classification_loss_alone():
    torch.manual_seed(0)
    model = create_model("cet_vit_pico", img_size=8, num_classes=4, dynamic_k="gumbel").train()
    logits, _ = model.forward_with_aux(torch.randn(8, 3, 8, 8))
    F.cross_entropy(logits, torch.arange(8) % 4).backward()
    grads = {n: p.grad for n, p in model.k_estimator.named_parameters()}
    assert len(grads) == 6  # LayerNorm, fc1, fc2: weight and bias each
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_without_dynamic_k_the_cost_is_zero_and_nothing_is_estimated():
    model = create_model("cet_vit_pico", img_size=8)
    _, aux = model.forward_with_aux(torch.randn(2, 3, 8, 8))
    assert model.k_estimator is None and aux.k_chosen is None and aux.k_cost.item() == 0
    assert ((aux.S > 0).sum(-1) == 3).all()


def test_micro_encoder_pads_a_grid_not_divisible_by_the_window():
    """Grid 6, window 4: windows are rows/cols [0, 4) and [4, 6) + 2 padded. A change to token (0, 0) stays in its
    window in the unshifted block, and the shifted block runs on the padded grid."""
    torch.manual_seed(0)
    kw = dict(grid=6, embed_dims=(8,), num_heads=(2,), window_size=4, mlp_ratio=2.0, qkv_bias=True)
    one_block = MicroEncoder(depths=(1,), drop_path=[0.0], proj_drop=0.0, attn_drop=0.0, **kw).eval()
    x = torch.randn(1, 6, 6, 8)
    x_changed = x.clone()
    x_changed[0, 0, 0] += torch.randn(8)  # not a constant shift, which LayerNorm would erase
    moved = (one_block(x_changed) - one_block(x)).abs().sum(-1)[0] > 1e-5
    inside = torch.zeros(6, 6, dtype=torch.bool)
    inside[:4, :4] = True
    assert moved[inside].all() and not moved[~inside].any()

    shifted = MicroEncoder(depths=(2,), drop_path=[0.0, 0.0], proj_drop=0.0, attn_drop=0.0, **kw).eval()
    assert shifted.stages[0].blocks[1].shift_size == (2, 2)
    out = shifted(x)
    assert out.shape == (1, 6, 6, 8) and torch.isfinite(out).all()
    model = create_model("cet_vit_pico", img_size=12, num_classes=3)  # 6 x 6 grid
    assert model(torch.randn(2, 3, 12, 12)).shape == (2, 3)


def test_macro_and_deep_attention_can_be_captured():
    model = create_model("cet_vit_pico", img_size=8).eval()
    maps = capture_attention(model, torch.randn(2, 3, 8, 8))
    assert maps["macro_encoder.blocks.0.attn"].shape == (2, 4, 16, 16)
    assert maps["deep_encoder.0.attn"].shape == (2, 4, 16, 16)
    torch.testing.assert_close(maps["deep_encoder.0.attn"].sum(-1), torch.ones(2, 4, 16))


def test_no_weight_decay_names_the_position_tables_and_the_slot_embedding():
    model = create_model("cet_vit_pico", img_size=8)
    names = model.no_weight_decay()
    params = dict(model.named_parameters())
    assert "macro_encoder.slot_embed" in names
    tables = {n for n in params if n.endswith("relative_position_bias_table")}
    assert len(tables) == 4 and tables <= names
    assert names <= set(params)


def test_base_parameter_counts_match_the_card():
    """Card: 33.12M total; MicroEncoder 29.8M, MacroEncoder 2.7M, CrossScaleAttention 0.3M, V-CEO 0.026M."""
    with torch.device("meta"):
        model = create_model("cet_vit_base")
    parts = param_breakdown(model)
    assert sum(parts.values()) == sum(p.numel() for p in model.parameters())
    assert sum(parts.values()) == pytest.approx(33.12e6, rel=0.02)
    assert parts["micro_encoder"] == pytest.approx(29.8e6, rel=0.02)
    assert parts["macro_encoder"] == pytest.approx(2.7e6, rel=0.02)
    assert parts["cross_scale"] == pytest.approx(0.3e6, rel=0.02)
    assert parts["v_ceo"] == pytest.approx(0.026e6, rel=0.02)


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_small_presets_have_a_few_million_parameters_or_less(name):
    with torch.device("meta"):
        model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) < 3e6


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (dict(pool="max"), "pool must be"),
        (dict(dynamic_k="learned"), "dynamic_k must be"),
        (dict(ei="double_well"), "ei must be"),
        (dict(topk=40), "topk <= num_slots"),
        (dict(dynamic_k="gumbel", k_candidates=(2, 8)), "k_candidates"),
        (dict(depths=(1, 1)), "same length"),
        (dict(img_size=31), "not divisible by the patch size"),
    ],
)
def test_bad_options_are_named(option, message):
    with pytest.raises(ValueError, match=message):
        CETViT(**{"embed_dims": (8, 8, 8, 8), "num_heads": (1, 1, 1, 1), "depths": (1, 1, 1, 1), **option})

"""CET-ViT's issue-13 options: position embedding, slots sized to the tokens with empty slots masked, the dense
straight-through selection gradient, the exact Dynamic-K target, the two-term EI and no SVD without EI, and the
test-time grouping ablation."""

import pytest
import torch
import torch.nn.functional as F

from vitlab.families.cet_vit.ei import ei_terms, ei_weight
from vitlab.families.cet_vit.grouping import grouping_ablation
from vitlab.families.cet_vit.slots import ablate_assignment, exact_k_targets, topk_softmax
from vitlab.models import create_model


def _pico(**kw):
    torch.manual_seed(0)
    return create_model("cet_vit_pico", img_size=16, patch_size=2, num_classes=4, **kw)


@pytest.mark.parametrize("pos_embed, differs", [("none", False), ("learned", True)])
def test_position_embedding_breaks_the_symmetry_of_a_constant_image(pos_embed, differs):
    model = _pico(pos_embed=pos_embed).eval()
    with torch.no_grad():
        h = model.micro_tokens(torch.full((1, 3, 16, 16), 0.3))  # [1, 64, C]
    spread = (h - h.mean(1, keepdim=True)).abs().max().item()
    assert (spread > 1e-3) if differs else (spread < 1e-5), spread


def test_slot_ratio_sizes_the_slots_to_the_token_count():
    assert _pico(slot_ratio=8).num_slots == 64 // 8
    assert _pico(slot_ratio=32).num_slots == 4  # max(topk + 1, 64 // 32)
    with pytest.raises(ValueError, match="slot_ratio"):
        _pico(slot_ratio=-1)


@pytest.mark.parametrize("mask, unchanged", [(True, True), (False, False)])
def test_masked_empty_slots_contribute_nothing(mask, unchanged):
    model = _pico(mask_empty_slots=mask).eval()
    empty = 5
    with torch.no_grad():
        model.v_ceo.assign.bias[empty] = -1e4  # slot 5 is never among any token's top 3
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        before = model(x)
        _, aux = model.forward_with_aux(x)
        model.macro_encoder.slot_embed[:, empty] += 5.0  # the only input an empty slot has
        after = model(x)
    assert aux.S[..., empty].abs().max() == 0
    if mask:
        assert not aux.occupied[:, empty].any()
    assert torch.allclose(before, after, atol=1e-6) == unchanged


@pytest.mark.parametrize("select_grad, nonzero", [("hard", 3), ("dense_st", 16)])
def test_selection_gradient_reaches_all_slots_with_dense_st(select_grad, nonzero):
    model = _pico(select_grad=select_grad).train()
    logits = torch.randn(2, 10, 16, requires_grad=True)
    S = model.v_ceo.assignment(logits)
    assert torch.equal(S.detach(), topk_softmax(logits.detach(), 3))  # the forward is the card's top-3
    (S * torch.randn_like(S)).sum().backward()
    per_row = (logits.grad.abs() > 0).sum(-1)
    assert (per_row == nonzero).all(), per_row


def test_dense_st_reaches_every_vceo_logit_in_the_model():
    model = _pico(select_grad="dense_st").train()
    seen = {}

    def keep_grad(module, inputs, output):
        output.register_hook(lambda grad: seen.setdefault("g", grad))

    model.v_ceo.assign.register_forward_hook(keep_grad)
    F.cross_entropy(model(torch.randn(2, 3, 16, 16)), torch.tensor([0, 1])).backward()
    assert (seen["g"].abs() > 0).all()


def test_exact_dynamic_k_target_equals_a_brute_force_loop_over_candidates():
    model = _pico(dynamic_k="exact", drop_rate=0.1, drop_path_rate=0.1).train()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 0, 1])
    model.micro_encoder.eval()  # the same micro tokens in both passes (the after-V-CEO part is always eval)
    _, aux = model.forward_with_aux(x)
    candidates = model.k_estimator.k_candidates
    losses = torch.stack([F.cross_entropy(c, y, reduction="none") for c in aux.candidate_logits])
    targets = exact_k_targets(losses, candidates, model.num_slots, lambda_k=0.05)
    model.eval()
    brute = []
    with torch.no_grad():
        for c in range(len(candidates)):
            force = F.one_hot(torch.full((6,), c), len(candidates)).float()
            brute.append(F.cross_entropy(model.forward_with_aux(x, force_choice=force)[0], y, reduction="none"))
    brute = torch.stack(brute)
    assert torch.allclose(losses, brute, atol=1e-5)
    cost = torch.tensor(candidates, dtype=torch.float) / model.num_slots
    expected = torch.tensor([min(range(len(candidates)), key=lambda c: brute[c, i] + 0.05 * cost[c]) for i in range(6)])
    assert torch.equal(targets, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_budgets_filled_on_the_device_train_exactly_as_budgets_copied_from_the_host(dtype, monkeypatch):
    """``budget_values`` (filled where the tensors live) against ``torch.tensor(k_candidates)`` (a copy from the
    host): the same logits, Dynamic-K targets, loss and gradients, bit for bit, with the exact estimator and the
    dense straight-through selection (the two paths that use the budgets as a tensor)."""
    from vitlab.families.cet_vit import parts, slots
    from vitlab.families.cet_vit.config import CETLossConfig
    from vitlab.families.cet_vit.task import regularisation

    def from_host(k_candidates, like):
        return torch.tensor(k_candidates, dtype=like.dtype, device=like.device)

    like = torch.zeros((), dtype=dtype)
    assert torch.equal(slots.budget_values((4, 8, 16), like), from_host((4, 8, 16), like))
    x, y = torch.randn(6, 3, 16, 16, dtype=dtype), torch.tensor([0, 1, 2, 3, 0, 1])
    # every budget in use, so that the dense straight-through gradient is masked at each of them
    choice = F.one_hot(torch.tensor([0, 1, 2, 0, 1, 2]), 3).to(dtype)
    runs = []
    for budgets in (slots.budget_values, from_host):
        monkeypatch.setattr(parts, "budget_values", budgets)
        monkeypatch.setattr(slots, "budget_values", budgets)
        model = _pico(dynamic_k="exact", select_grad="dense_st").to(dtype).train()
        torch.manual_seed(1)
        logits, aux = model.forward_with_aux(x, force_choice=choice)
        reg, extras = regularisation(model, aux, y, 0.05, CETLossConfig(), list(model.k_estimator.k_candidates))
        loss = F.cross_entropy(logits, y) + reg
        loss.backward()
        runs.append([logits, aux.S, extras["k_fit"], loss, *(p.grad for p in model.parameters())])
    for new, old in zip(*runs, strict=True):
        assert new.dtype == dtype and torch.equal(new, old)


def test_exact_dynamic_k_trains_every_estimator_parameter():
    model = _pico(dynamic_k="exact").train()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    logits, aux = model.forward_with_aux(x)
    losses = torch.stack([F.cross_entropy(c, y, reduction="none") for c in aux.candidate_logits])
    targets = exact_k_targets(losses, model.k_estimator.k_candidates, model.num_slots, lambda_k=0.01)
    (F.cross_entropy(logits, y) + F.cross_entropy(aux.k_logits, targets)).backward()
    for name, p in model.k_estimator.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_two_term_ei_is_the_two_spectral_penalties():
    S = topk_softmax(torch.randn(2, 16, 8) * 3, 3)
    h = torch.randn(2, 8, 4)
    terms = ei_terms(S, h, variant="two_term")
    assert torch.allclose(terms["ei_loss"], (terms["entropy_penalty"] + 2.0 * terms["rev_penalty"]).mean())
    full = ei_terms(S, h, variant="full")["ei_loss"]
    assert torch.allclose(full - terms["ei_loss"], 0.1 * terms["degen"].mean())


def test_no_svd_without_ei(monkeypatch):
    model = _pico().train()

    def forbidden(*args, **kwargs):
        raise AssertionError("SVD ran")

    monkeypatch.setattr(torch.linalg, "svdvals", forbidden)
    _, aux = model.forward_with_aux(torch.randn(2, 3, 16, 16), compute_ei=False)
    assert aux.ei == {} and aux.ei_loss.item() == 0.0
    _, aux = _pico(ei="none").forward_with_aux(torch.randn(2, 3, 16, 16))
    assert aux.ei_loss.item() == 0.0
    with pytest.raises(AssertionError, match="SVD ran"):
        model.forward_with_aux(torch.randn(2, 3, 16, 16))


def test_ei_schedules():
    assert ei_weight(0.0, 0.01, 50, 200, schedule="constant") == 0.01
    assert ei_weight(0.0, 0.05, 50, 200) == 0.0 and ei_weight(200, 0.05, 50, 200) == 0.05
    with pytest.raises(ValueError, match="schedule"):
        ei_weight(0.0, schedule="linear")


def test_assignment_ablations():
    S = topk_softmax(torch.randn(2, 10, 8), 3)
    random = ablate_assignment(S, "random", 3, torch.Generator().manual_seed(0))
    assert torch.allclose(random.sum(-1), torch.ones(2, 10)) and ((random > 0).sum(-1) == 3).all()
    assert torch.allclose(random.sort(-1).values, S.sort(-1).values)  # the same weights, on other slots
    assert not torch.equal(random, S)
    assert torch.allclose(ablate_assignment(S, "uniform", 3), torch.full_like(S, 1 / 8))


def test_grouping_ablation_reports_points_per_mode():
    model = _pico()
    batches = [(torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))) for _ in range(2)]
    out = grouping_ablation(model, batches)
    assert out["n"] == 8 and model.assignment_ablation == "none"
    assert out["points_random"] == pytest.approx(100 * (out["acc_none"] - out["acc_random"]))
    assert 1 <= out["slot_usage_k"] <= model.num_slots
    with torch.no_grad():
        model.assignment_ablation = "uniform"
        _, aux = model.forward_with_aux(batches[0][0], compute_ei=False)
    assert torch.allclose(aux.h_macro, aux.h_macro[:, :1].expand_as(aux.h_macro), atol=1e-6)


def test_fused_window_attention_computes_the_same_logits():
    eager = _pico().eval()
    fused = _pico(fused_window_attention=True).eval()
    fused.load_state_dict(eager.state_dict())
    assert any(getattr(m, "fused_attn", False) for m in fused.modules())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(eager(x), fused(x), atol=1e-5)


def test_grouping_none_is_the_micro_encoder_and_a_head_on_mean_micro():
    model = _pico(grouping="none").train()
    names = {name.split(".")[0] for name, _ in model.named_parameters()}
    assert names == {"patch_embed", "micro_encoder", "head"}  # no V-CEO, macro, cross-scale or deep parameters
    assert model.head.fc.in_features == 64  # mean(micro) alone, at the micro width
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
    logits, aux = model.forward_with_aux(x)
    assert logits.shape == (4, 4)
    assert aux.S is None and aux.slot_usage_k is None and aux.ei_loss.item() == 0.0
    model.eval()
    with torch.no_grad():
        expected = model.head.fc(model.head.norm(model.micro_tokens(x).mean(1)))
        assert torch.allclose(model(x), expected, atol=1e-6)
    model.train()
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
    from vitlab.families.cet_vit.probes import collect_assignments

    with pytest.raises(TypeError, match="grouping: none has no S"):
        collect_assignments(model, [(x, y)])
    with pytest.raises(ValueError, match="grouping: none"):
        _pico(grouping="none", dynamic_k="gumbel")
    with pytest.raises(ValueError, match="grouping must be one of card, none"):
        _pico(grouping="slots")


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")  # no Trainer attached
def test_grouping_none_trains_through_the_cet_task():
    from vitlab.config import build_config
    from vitlab.families.cet_vit.task import CETViTTask

    model = _pico(grouping="none").train()
    task = CETViTTask(model, cfg=build_config("cet_vit/digits"), hparams={"data_info": {"num_classes": 4}})
    losses = task.compute_losses((torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))), "train")
    assert "slot_k" not in losses and losses["ei"].item() == 0.0 and torch.isfinite(losses["loss"])


def test_topk_margin_is_the_gap_between_the_kth_and_the_next_logit():
    from vitlab.families.cet_vit.slots import topk_margin

    logits = torch.tensor([[[5.0, 1.0, 3.0, 2.5], [0.0, 0.0, 4.0, 1.0]]])  # one image, two tokens, 4 slots
    # k = 2: token 0 keeps 5 and 3, next 2.5 -> 0.5; token 1 keeps 4 and 1, next 0 -> 1.0
    torch.testing.assert_close(topk_margin(logits, 2), torch.tensor([0.75]))


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")  # no Trainer attached
def test_the_cet_task_reports_the_vceo_margin_of_its_assignment_logits():
    from vitlab.config import build_config
    from vitlab.families.cet_vit.slots import topk_margin
    from vitlab.families.cet_vit.task import CETViTTask

    model = _pico().eval()
    task = CETViTTask(model, cfg=build_config("cet_vit/digits"), hparams={"data_info": {"num_classes": 4}})
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
    losses = task.compute_losses((x, y), "val")
    expected = topk_margin(model.v_ceo.logits(model.micro_tokens(x)), model.v_ceo.topk).mean()
    torch.testing.assert_close(losses["vceo_margin"], expected)
    assert losses["vceo_margin"] > 0

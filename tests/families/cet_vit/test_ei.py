"""The CET-ViT EI regulariser (spec section 3) on hand-made assignment matrices, and the card's reversibility table."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from vitlab.families.cet_vit import probes
from vitlab.families.cet_vit.ei import assignment_singular_values, ei_terms, ei_weight, macro_degeneracy, reversibility
from vitlab.families.cet_vit.slots import topk_softmax

N, K = 256, 32


def balanced_one_hot(num_tokens: int = N, num_slots: int = K) -> torch.Tensor:
    return probes.balanced_one_hot(num_tokens, num_slots)


def common_mode_mixture(a: float, num_tokens: int = N, num_slots: int = K) -> torch.Tensor:
    return probes.common_mode_mixture(a, num_tokens, num_slots)


def mixture_for_reversibility(target: float, num_slots: int = K) -> float:
    return probes.mixture_for_reversibility(target, num_slots)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.9, 0.999])
def test_reversibility_matches_the_hand_worked_mixture(a):
    expected = 1 / (1 + (K - 1) * (1 - a))
    assert reversibility(common_mode_mixture(a)).item() == pytest.approx(expected, rel=1e-4)


def test_reversibility_table_of_the_card():
    """Card, Disclosure 2: concentrated ~0.99, tokens one-hot over distinct slots ~0.04, realistic top-3 ~0.05."""
    g = torch.Generator().manual_seed(0)
    B = 16
    # Concentrated, near rank one: every token routes to the same three slots with nearly the same weights.
    shared = 3 * torch.randn(B, 1, K, generator=g)
    concentrated = topk_softmax(shared + 0.02 * torch.randn(B, N, K, generator=g), k=3)
    # Diffuse: each token one-hot on a slot drawn at random (the card's ~0.04). Perfectly balanced gives 1/K.
    random_one_hot = F.one_hot(torch.randint(0, K, (B, N), generator=g), K).float()
    # Realistic top-3 sparse: the top-3 softmax of standard normal logits.
    top3 = topk_softmax(torch.randn(B, N, K, generator=g), k=3)

    assert reversibility(concentrated).mean().item() == pytest.approx(0.99, abs=0.015)
    assert reversibility(random_one_hot).mean().item() == pytest.approx(0.04, abs=0.005)
    assert reversibility(balanced_one_hot().unsqueeze(0)).item() == pytest.approx(1 / K, rel=1e-4)
    assert reversibility(top3).mean().item() == pytest.approx(0.05, abs=0.006)

    # ReLU(rev - 0.45) fires for the concentrated matrix only.
    h_macro = torch.randn(B, K, 8, generator=g)
    assert (ei_terms(concentrated, h_macro)["rev_penalty"] > 0).all()
    assert (ei_terms(random_one_hot, h_macro)["rev_penalty"] == 0).all()
    assert (ei_terms(top3, h_macro)["rev_penalty"] == 0).all()


def test_both_relu_terms_are_zero_at_the_operating_point():
    """Card: at reversibility ~0.24 neither ReLU fires, so only the degeneracy term acts."""
    S = common_mode_mixture(mixture_for_reversibility(0.24))
    terms = ei_terms(S, torch.randn(1, K, 8))
    rev = terms["reversibility"].item()
    assert rev == pytest.approx(0.24, rel=1e-4)
    # Normalised entropy of the spectrum p = (rev, (1 - rev)/(K - 1) x (K - 1)), worked by hand.
    entropy = -rev * math.log(rev) - (1 - rev) * math.log((1 - rev) / (K - 1))
    assert terms["norm_entropy"].item() == pytest.approx(entropy / math.log(K), rel=1e-4)
    assert terms["entropy_penalty"].item() == 0
    assert terms["rev_penalty"].item() == 0
    assert terms["ei_loss"].item() == pytest.approx(0.1 * terms["degen"].item(), rel=1e-5)


def test_both_relu_terms_penalise_concentration():
    """Disclosure 2: a rank-one S fires both terms (entropy 0 -> 0.5, reversibility 1 -> 0.55); diffuse fires none."""
    rank_one = F.one_hot(torch.zeros(1, 64, dtype=torch.long), 8).float()  # every token in slot 0
    h_macro = torch.randn(1, 8, 4)
    terms = ei_terms(rank_one, h_macro)
    assert terms["norm_entropy"].item() == pytest.approx(0.0, abs=1e-5)
    assert terms["entropy_penalty"].item() == pytest.approx(0.5, abs=1e-5)
    assert terms["reversibility"].item() == pytest.approx(1.0, abs=1e-6)
    assert terms["rev_penalty"].item() == pytest.approx(0.55, abs=1e-6)
    diffuse = ei_terms(balanced_one_hot(64, 8).unsqueeze(0), h_macro)
    assert diffuse["norm_entropy"].item() == pytest.approx(1.0, abs=1e-5)
    assert diffuse["entropy_penalty"].item() == 0 and diffuse["rev_penalty"].item() == 0


def test_macro_degeneracy_hand_cases():
    e = torch.eye(3)
    identical = torch.ones(1, 3, 5)
    opposite = torch.stack([e[0], -e[0]]).unsqueeze(0)
    with_empty_slot = torch.stack([e[0], e[0], torch.zeros(3)]).unsqueeze(0)
    assert macro_degeneracy(identical).item() == pytest.approx(1.0, abs=1e-6)
    assert macro_degeneracy(e.unsqueeze(0)).item() == pytest.approx(0.0, abs=1e-6)
    assert macro_degeneracy(opposite).item() == pytest.approx(-1.0, abs=1e-6)
    # over the occupied pairs only: the two identical tokens -> 1
    assert macro_degeneracy(with_empty_slot).item() == pytest.approx(1.0, abs=1e-6)
    # the card's mean over all pairs: 1, 0, 0 (twice each) -> 1/3
    assert macro_degeneracy(with_empty_slot, slots="all").item() == pytest.approx(1 / 3, abs=1e-6)
    # an explicit mask wins over the zero test; fewer than two occupied slots give 0
    assert macro_degeneracy(identical, torch.tensor([[True, False, False]])).item() == 0.0


@pytest.mark.parametrize("slots", ["occupied", "all"])
def test_macro_degeneracy_gradient_is_bounded_at_an_empty_slot(slots):
    """An empty slot's zero macro token gets no gradient (F.normalize's would be ~1/eps = 1e12 there)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 4, 8, generator=g)
    h[:, 3] = 0
    h.requires_grad_()
    macro_degeneracy(h, slots=slots).sum().backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().max() < 10
    assert h.grad[:, 3].abs().max() == 0 and h.grad[:, :3].abs().sum() > 0


def test_ei_loss_of_each_variant():
    g = torch.Generator().manual_seed(1)
    S = topk_softmax(3 * torch.randn(2, 1, 8, generator=g) + 0.1 * torch.randn(2, 16, 8, generator=g), k=3)
    h_macro = torch.randn(2, 8, 4, generator=g)
    full = ei_terms(S, h_macro, variant="full")
    assert full["entropy_penalty"].min() > 0 and full["rev_penalty"].min() > 0
    expected = (full["entropy_penalty"] + 2.0 * full["rev_penalty"] + 0.1 * full["degen"]).mean()
    assert full["ei_loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    entropy_only = ei_terms(S, h_macro, variant="entropy_only")
    assert entropy_only["ei_loss"].item() == pytest.approx(full["entropy_penalty"].mean().item(), rel=1e-6)
    none = ei_terms(S, h_macro, variant="none")
    assert none["ei_loss"].item() == 0
    torch.testing.assert_close(none["reversibility"], full["reversibility"])  # still logged


def test_gradient_is_finite_for_repeated_and_zero_singular_values():
    logits = torch.zeros(1, 64, 16).index_fill(-1, torch.tensor([0]), 5.0).requires_grad_()  # rank one, many zeros
    S = topk_softmax(logits, k=3)
    ei_terms(S, torch.randn(1, 16, 4))["ei_loss"].backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
)
def test_the_host_svd_gives_the_devices_values_and_gradient(device):
    logits = torch.randn(6, 64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    S = topk_softmax(logits, k=3).float().to(device)
    weight = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).to(device)
    values, grads = {}, {}
    for way in ("device", "host", "gram"):
        x = S.clone().requires_grad_()
        values[way] = assignment_singular_values(x, way)
        (values[way] * weight).sum().backward()
        grads[way] = x.grad
        assert values[way].device == S.device and x.grad.device == S.device
        assert values[way].dtype == torch.float32 and x.grad.dtype == S.dtype
    for way in ("host", "gram"):
        torch.testing.assert_close(values[way], values["device"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[way], grads["device"], rtol=1e-4, atol=1e-5)
    assert grads["host"].abs().sum() > 0


def test_the_gram_way_keeps_svdvals_values_and_gradient_and_stays_finite_at_empty_slots():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 256, 32, generator=g, dtype=torch.float64)
    logits[:, :, 5:9] = -1e9  # four empty slots per image: four zero singular values
    S = topk_softmax(logits, k=3)
    weight = torch.randn(4, 32, generator=g, dtype=torch.float64)
    x = S.clone().requires_grad_()
    gram = assignment_singular_values(x, "gram")
    (gram * weight).sum().backward()
    reference = torch.linalg.svdvals(S)  # float64 LAPACK
    torch.testing.assert_close(gram.double(), reference, rtol=1e-6, atol=1e-7)  # the zeros included
    assert (gram[:, -4:] < 1e-6 * gram[:, :1]).all() and torch.isfinite(x.grad).all()
    # the gradient of the nonzero singular values is svdvals'; the zero ones' directions are arbitrary there (any
    # unit vector in S's left null space), and the gram way gives them none
    live = torch.zeros_like(weight)
    live[:, :28] = weight[:, :28]
    y = S.clone().requires_grad_()
    (torch.linalg.svdvals(y) * live).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)
    balanced = torch.full((2, 64, 8), 1 / 8, dtype=torch.float64, requires_grad=True)  # rank one: seven zeros
    ei_terms(balanced, torch.randn(2, 8, 4, dtype=torch.float64), svd="gram")["ei_loss"].backward()
    assert torch.isfinite(balanced.grad).all()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="EI SVD way must be one of device, host, gram"):
        ei_terms(torch.rand(1, 4, 3), torch.rand(1, 3, 2), svd="gpu")
    with pytest.raises(ValueError, match="unknown EI variant"):
        ei_terms(torch.rand(1, 4, 3), torch.rand(1, 3, 2), variant="double_well")
    with pytest.raises(ValueError, match="matching S"):
        ei_terms(torch.rand(1, 4, 3), torch.rand(1, 5, 2))
    with pytest.raises(ValueError, match="must end after it starts"):
        ei_weight(10, start=5, end=5)


def test_ei_weight_cosine_ramp():
    assert ei_weight(0) == 0 and ei_weight(50) == 0
    assert ei_weight(125) == pytest.approx(0.025)  # halfway: half the final weight
    assert ei_weight(200) == pytest.approx(0.05) and ei_weight(300) == pytest.approx(0.05)
    ramp = [ei_weight(e, final=1.0, start=0, end=10) for e in range(11)]
    assert all(b > a for a, b in itertools.pairwise(ramp))
    assert ramp[2] == pytest.approx(0.5 * (1 - math.cos(math.pi * 0.2)))

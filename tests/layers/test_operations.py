"""The plain form of ``F.scaled_dot_product_attention`` computes what torch's does with every mask it takes, and the
relevance through it conserves the logit (``nn.MultiheadAttention``'s plain form: tests/explain/test_multihead.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitlab.explain.adapters import UnsupportedOperation
from vitlab.explain.hilrp import Variant, relevance
from vitlab.layers.operations import is_query_key_product, keeps_axes, scaled_dot_product_attention

#: name -> the keywords of one call on ``[2, 2, 5, 4]`` queries and keys
CALLS = {
    "plain": {},
    "bool_mask": {"attn_mask": torch.eye(5, dtype=torch.bool).roll(1, 1) | torch.eye(5, dtype=torch.bool)},
    "float_mask": {"attn_mask": torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(1)).double()},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
}


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(3, 2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).unbind(0)


@pytest.mark.parametrize("name", list(CALLS))
def test_the_plain_form_computes_what_sdpa_does(name: str) -> None:
    q, k, v = _qkv()
    expected = F.scaled_dot_product_attention(q, k, v, **CALLS[name])
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, **CALLS[name]), expected, rtol=1e-12, atol=1e-12)


def _sdpa_logit(name: str, **extra):
    def logits_of(model, x):
        tokens = x.reshape(1, 1, 5, 4)
        return F.scaled_dot_product_attention(tokens, tokens, tokens, **CALLS[name], **extra).sum(-1).flatten(1)

    return logits_of


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("variant", [Variant(), Variant(softmax="constant")], ids=["attnlrp", "cp_lrp"])
def test_relevance_through_sdpa_conserves_the_logit(name: str, variant: Variant) -> None:
    x = torch.randn(1, 1, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    maps, absorbed, logit = relevance(torch.nn.Identity(), _sdpa_logit(name), x, torch.tensor([1]), variant)
    assert maps.abs().sum() > 0
    torch.testing.assert_close(maps.sum() + absorbed[0], logit[0], rtol=1e-12, atol=1e-12)


def test_grouped_query_heads_are_refused_by_lrp() -> None:
    x = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    with pytest.raises(UnsupportedOperation, match="grouped-query attention"):
        relevance(torch.nn.Identity(), _sdpa_logit("plain", enable_gqa=True), x, torch.tensor([0]))


def test_a_query_key_product_relates_two_token_sequences() -> None:
    tokens, weight = torch.randn(2, 5, 4), torch.nn.Parameter(torch.randn(4, 3))
    assert is_query_key_product("matmul", [tokens, tokens.transpose(-2, -1)])
    assert not is_query_key_product("matmul", [tokens, weight])  # a projection, not a product of tokens
    assert not is_query_key_product("mul", [tokens, tokens])
    assert is_query_key_product("baddbmm", [torch.zeros(2, 5, 5), tokens, tokens.transpose(-2, -1)])
    assert keeps_axes(torch.Size([2, 3, 5, 7]), (5, 7)) and not keeps_axes(torch.Size([2, 35]), (5, 7))

"""Head permutations of the shared Attention (an exact symmetry) and states saved with a head order."""

import pytest
import torch

from vitlab.layers import Attention
from vitlab.layers.heads import HEAD_PARAMETERS, permute_heads, state_in_original_order


def _attn() -> Attention:
    torch.manual_seed(0)
    m = Attention(32, num_heads=4, temperature=True)
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.4, -0.3, 0.2, 0.8]))
    return m


def test_permuting_the_heads_keeps_the_function():
    m, permuted = _attn(), _attn()
    perm = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        for name in HEAD_PARAMETERS:
            parameter = permuted.get_parameter(name)
            parameter.copy_(permute_heads(name, parameter, perm, 4))
    assert not torch.equal(permuted.qkv.weight, m.qkv.weight)
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(permuted(x), m(x), atol=1e-6, rtol=1e-5)
    assert torch.equal(permuted.tau, m.tau[perm])


def test_a_state_saved_with_a_head_order_loads_in_original_order():
    """A state whose slot j holds original head order[j] (as head freezing saves it) loads back exactly."""
    m = _attn()
    order = torch.tensor([2, 0, 3, 1])
    saved = {k: permute_heads(k, v, order, 4) if k in HEAD_PARAMETERS else v for k, v in m.state_dict().items()}
    saved |= {"head_order": order, "frozen_heads": torch.tensor([True, True, False, False])}
    plain = Attention(32, num_heads=4, temperature=True)
    state = state_in_original_order(plain, saved)
    assert "head_order" in saved and set(state) == set(plain.state_dict())
    plain.load_state_dict(state)
    for key, value in m.state_dict().items():
        assert torch.equal(plain.state_dict()[key], value), key


@pytest.mark.parametrize("with_order", [False, True])
def test_a_state_with_heads_in_order_only_loses_the_buffers(with_order):
    """What every vitlab checkpoint held before freezing moved out of the shared Attention: the buffers, no move."""
    m = _attn()
    saved = dict(m.state_dict()) | {"frozen_heads": torch.zeros(4, dtype=torch.bool)}
    if with_order:
        saved["head_order"] = torch.arange(4)
    state = state_in_original_order(m, saved)
    assert state.keys() == m.state_dict().keys()
    assert all(state[k] is saved[k] for k in state)  # nothing moved

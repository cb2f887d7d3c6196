"""FrozenHeadAttention (ViTCAE eq. 26): the shared Attention with frozen heads, its gradients, autograd routes,
head permutation and state."""

import pytest
import torch
import torch.nn.functional as F

from vitlab.dynamics import FrozenHeadAttention
from vitlab.layers import attention_capture
from vitlab.layers.dropout import dropout


def _attn(**kw):
    torch.manual_seed(0)
    return FrozenHeadAttention(32, num_heads=4, **kw).eval()


def _frozen_rows(frozen: torch.Tensor, d: int, train_values: bool = False) -> torch.Tensor:
    """``[3C]`` bool: the rows of ``W_qkv`` that a frozen head keeps fixed (its q, k and v rows; with
    ``train_values``, ``dynamics.freeze_scope: pattern``, only its q and k rows)."""
    rows = frozen.repeat_interleave(d)
    return torch.cat([rows, rows, rows & (not train_values)])


def _unpermuted_frozen_reference(
    m: FrozenHeadAttention, x: torch.Tensor, frozen: torch.Tensor, train_values: bool = False
) -> torch.Tensor:
    """Eq. 26 written out in original head order, with plain autograd: the frozen heads' weight rows and tau are
    detached, their q and k are constants, their attention ``P`` a constant, and only ``P V`` keeps a gradient
    (with ``train_values`` their v rows stay attached: only the pattern is frozen)."""
    B, N, C = x.shape
    H, d = m.num_heads, m.head_dim
    rows = _frozen_rows(frozen, d, train_values)[:, None]  # [3C, 1]
    weight = torch.where(rows, m.qkv.weight.detach(), m.qkv.weight)
    bias = torch.where(rows[:, 0], m.qkv.bias.detach(), m.qkv.bias)
    log_tau = torch.where(frozen, m.log_tau.detach(), m.log_tau)
    q, k, v = F.linear(x, weight, bias).view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
    q = q * log_tau.exp().view(1, H, 1, 1)
    head = frozen.view(1, H, 1, 1)
    q, k = torch.where(head, q.detach(), q), torch.where(head, k.detach(), k)
    probs = ((q @ k.transpose(-2, -1)) * m.scale).softmax(-1)
    probs = torch.where(head, probs.detach(), probs)
    return m.proj((probs @ v).transpose(1, 2).reshape(B, N, C))


def _grads_in_original_order(m: FrozenHeadAttention) -> dict[str, torch.Tensor]:
    grads = {name: m.in_original_order(name, p.grad) for name, p in m.head_parameters()}
    return {**grads, "proj.bias": m.proj.bias.grad}


@pytest.mark.parametrize("train_values", [False, True])
@pytest.mark.parametrize(
    "mask", [[True, False, True, False], [False, True, True, False], [True] * 4, [False, True, False, False]]
)
def test_permuted_frozen_heads_give_the_unpermuted_outputs_and_gradients(mask, train_values):
    """Eq. 26 (``train_values`` False) and the pattern-only freezing of ``dynamics.freeze_scope: pattern``."""
    frozen = torch.tensor(mask)
    m = _attn(temperature=True).train()
    m.train_frozen_values = train_values
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.4, -0.3, 0.2, 0.8]))
    x = torch.randn(2, 6, 32, requires_grad=True)
    target = torch.randn(2, 6, 32)
    (_unpermuted_frozen_reference(m, x, frozen, train_values) - target).square().sum().backward()
    reference, reference_x = _grads_in_original_order(m), x.grad.clone()
    reference_tau = m.tau.detach().clone()
    m.zero_grad()
    x.grad = None

    m.set_frozen_heads(frozen)
    assert m.frozen_heads.tolist() == mask and m.num_frozen == sum(mask)
    assert m.head_order[: sum(mask)].tolist() == [h for h in range(4) if mask[h]], "frozen heads go first"
    torch.testing.assert_close(m.tau, reference_tau)  # tau is reported by original head
    (m(x) - target).square().sum().backward()
    got = _grads_in_original_order(m)
    for name, grad in reference.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    torch.testing.assert_close(x.grad, reference_x, atol=1e-5, rtol=1e-4)
    weight_grad = got["qkv.weight"].view(3, 4, 8, 32)
    cut = 2 if train_values else 3  # q, k (and v) of a frozen head: no gradient
    assert torch.all(weight_grad[:cut, frozen] == 0) and torch.all(got["log_tau"][frozen] == 0), "exactly zero"
    assert torch.all(got["qkv.bias"].view(3, 4, 8)[:cut, frozen] == 0)
    if train_values:  # the frozen heads' values train: every row of them gets a gradient
        assert weight_grad[2, frozen].abs().sum(-1).gt(0).all()
        assert got["qkv.bias"].view(3, 4, 8)[2, frozen].abs().gt(0).all()
    if not frozen.all():
        assert weight_grad[:, ~frozen].abs().sum() > 0 and got["log_tau"][~frozen].abs().sum() > 0


def _frozen_step(x: torch.Tensor, mask: list[bool], **attributes) -> list[torch.Tensor]:
    """One backward of a temperature Attention with ``mask`` frozen and ToMe token sizes: ``[out, keys, dx, the head
    parameters' gradients...]``; ``attributes`` set on the module (``fused``, ``split_frozen``)."""
    size = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 4.0]).view(1, 6, 1).expand(2, 6, 1)
    m = _attn(temperature=True).train()
    m.set_frozen_heads(torch.tensor(mask))
    for name, value in attributes.items():
        setattr(m, name, value)
    inputs = x.clone().requires_grad_(True)
    out, keys = m(inputs, size=size, return_keys=True)
    out.square().sum().backward()
    return [out, keys, inputs.grad, *(p.grad for _, p in m.head_parameters())]


@pytest.mark.parametrize("train_values", [False, True])
@pytest.mark.parametrize("route", ["single", "logsumexp", "recompute"])
def test_frozen_heads_backward_routes_agree_with_the_saved_attention(route, train_values, monkeypatch):
    """The frozen heads' dV = P^T dO four ways: one flash call over all heads (the CPU default), two calls with P
    from the flash kernel's log-sum-exps, two calls with P recomputed (the public-API path of other devices and
    dtypes), and P kept by the eager path; with proportional attention's bias."""
    import vitlab.dynamics.frozen_heads as attention

    calls = []
    single = attention._FrozenHeadsInOneCall.apply
    monkeypatch.setattr(attention._FrozenHeadsInOneCall, "apply", lambda *a: calls.append(1) or single(*a))
    if route == "recompute":
        monkeypatch.setattr(attention, "_flash_with_logsumexp", lambda q: False)
    x = torch.randn(2, 6, 32)
    mask = [False, True, True, False]
    grads = [
        _frozen_step(x, mask, fused=fused, split_frozen=route == "logsumexp", train_frozen_values=train_values)[1:]
        for fused in (True, False)
    ]
    assert len(calls) == (route == "single"), "the single call runs where it applies, and only there"
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("train_v", [False, True])
@pytest.mark.parametrize("frozen", [1, 2, 4])
@pytest.mark.parametrize("with_size", [False, True])
def test_single_call_gradients_equal_plain_autograd_with_the_frozen_rows_cut(frozen, with_size, train_v):
    """_FrozenHeadsInOneCall against plain autograd: SDPA over all heads, the frozen heads' q and k detached (their
    attention a constant) and their rows of W and b detached (with ``train_v`` their v rows stay attached); the
    frozen rows' weight gradient is exactly 0."""
    from vitlab.dynamics.frozen_heads import _FrozenHeadsInOneCall

    torch.manual_seed(1)
    B, N, H, d = 2, 7, 4, 8
    C = H * d
    x = torch.randn(B, N, C, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3 * C, C, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3 * C, dtype=torch.float64, requires_grad=True)
    size = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 4.0, 2.0], dtype=torch.float64).view(1, 1, 1, N)
    mask = size.log().expand(B, 1, 1, N) if with_size else None
    grad_out = torch.randn(B, H, N, d, dtype=torch.float64)

    out, keys = _FrozenHeadsInOneCall.apply(x, weight, bias, mask, H, frozen, d**-0.5, train_v)
    got = torch.autograd.grad(out, (x, weight, bias), grad_out)
    assert not keys.requires_grad

    rows = _frozen_rows(torch.arange(H) < frozen, d, train_v)  # [3C]: the rows a frozen head keeps fixed
    qkv = F.linear(x, torch.where(rows[:, None], weight.detach(), weight), torch.where(rows, bias.detach(), bias))
    q, k, v = qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
    head = (torch.arange(H) < frozen).view(1, H, 1, 1)
    q, k = torch.where(head, q.detach(), q), torch.where(head, k.detach(), k)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d**-0.5)
    torch.testing.assert_close(out, reference)
    want = torch.autograd.grad(reference, (x, weight, bias), grad_out)
    for name, a, b in zip(("x", "weight", "bias"), got, want, strict=True):
        torch.testing.assert_close(a, b, msg=name)
    assert torch.all(got[1][rows] == 0) and torch.all(got[2][rows] == 0), "frozen rows: exactly zero"
    assert frozen == H or got[1][~rows].abs().min(1).values.gt(0).all()


def test_freezing_more_heads_later_keeps_the_function():
    m = _attn(temperature=True)
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.4, -0.3, 0.2, 0.8]))
    x = torch.randn(2, 6, 32)
    ref = m(x)
    for mask in ([False, False, True, False], [True, False, True, False], [False, True, True, True], [False] * 4):
        assert m.set_frozen_heads(torch.tensor(mask)) is not None
        torch.testing.assert_close(m(x), ref, atol=1e-6, rtol=1e-5)
    assert m.head_order.tolist() == [0, 1, 2, 3] and m.set_frozen_heads(torch.zeros(4, dtype=torch.bool)) is None


def test_frozen_heads_apply_attention_dropout():
    """The frozen branch drops attention out as the active one does (it did not, once)."""
    m = _attn(attn_drop=0.5).train()
    m.set_frozen_heads(torch.ones(4, dtype=torch.bool))
    x = torch.randn(2, 6, 32, requires_grad=True)
    torch.manual_seed(3)
    out = m(x)
    B, N, C = x.shape
    q, k, v = m.qkv(x).view(B, N, 3, 4, 8).permute(2, 0, 3, 1, 4)
    probs = ((q @ k.transpose(-2, -1)) * m.scale).softmax(-1).detach()
    torch.manual_seed(3)
    dropped = dropout(probs, 0.5)  # vitlab's mask, the same draw: the frozen branch is the only consumer of the RNG
    reference = m.proj((dropped @ v).transpose(1, 2).reshape(B, N, C))
    torch.testing.assert_close(out, reference)
    assert not torch.allclose(out, m.eval()(x), atol=1e-3)
    out.square().sum().backward()  # and its backward uses the same mask
    (x_ref := x.detach().clone().requires_grad_(True))
    q, k, v = m.qkv(x_ref).view(B, N, 3, 4, 8).permute(2, 0, 3, 1, 4)
    m.proj((dropped @ v).transpose(1, 2).reshape(B, N, C)).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_frozen_heads_capture_is_complete():
    m = _attn()
    x = torch.randn(2, 6, 32)
    with attention_capture(m) as cap:
        m(x)
    ref = cap.maps[""]
    m.set_frozen_heads(torch.tensor([False, True, False, True]))
    for grad in (False, True):
        with attention_capture(m) as cap, torch.set_grad_enabled(grad):
            m(x)
        torch.testing.assert_close(cap.maps[""], ref, atol=1e-6, rtol=1e-5)  # by original head


def test_frozen_state_survives_state_dict():
    m = _attn()
    x = torch.randn(2, 6, 32)
    m.set_frozen_heads(torch.tensor([True, False, False, True]))
    m2 = _attn()
    m2.load_state_dict(m.state_dict())
    assert m2.frozen_heads.tolist() == [True, False, False, True] and m2.head_order.tolist() == [0, 3, 1, 2]
    assert torch.equal(m2(x), m(x))


def test_a_state_saved_before_heads_were_permuted_loads_in_original_order():
    m = _attn()
    x = torch.randn(2, 6, 32)
    legacy = {k: v for k, v in m.state_dict().items() if k != "head_order"}
    legacy["frozen_heads"] = torch.tensor([False, True, False, True])
    m2 = _attn()
    m2.load_state_dict(legacy)
    assert m2.head_order.tolist() == [1, 3, 0, 2] and m2.frozen_heads.tolist() == [False, True, False, True]
    torch.testing.assert_close(m2(x), m(x), atol=1e-6, rtol=1e-5)


def test_frozen_heads_under_bf16_autocast():
    m = _attn(temperature=True).train()
    m.set_frozen_heads(torch.tensor([True, False, True, False]))
    x = torch.randn(2, 6, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    out.float().square().sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad.dtype == torch.float32 and m.qkv.weight.grad.dtype == torch.float32
    grad = m.in_original_order("qkv.weight", m.qkv.weight.grad).view(3, 4, 8, 32)
    assert torch.all(grad[:, [0, 2]] == 0) and grad[:, [1, 3]].abs().sum() > 0


def test_single_and_two_call_paths_agree_with_token_sizes_and_keys():
    """The one-call frozen path and the two-call path: same outputs, ToMe keys, and gradients."""
    x = torch.randn(2, 6, 32)
    results = [_frozen_step(x, [True, False, False, True], split_frozen=split) for split in (False, True)]
    assert not any(keys.requires_grad for _, keys, *_ in results)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_frozen_state_loads_into_a_plain_attention_by_original_head():
    """A model whose heads froze (and moved) loads into the shared Attention: same function, same maps and tau by
    original head."""
    from vitlab.layers import Attention
    from vitlab.layers.heads import state_in_original_order

    m = _attn(temperature=True)
    with torch.no_grad():
        m.log_tau.copy_(torch.tensor([0.4, -0.3, 0.2, 0.8]))
    m.set_frozen_heads(torch.tensor([False, True, False, True]))
    assert m.head_order.tolist() == [1, 3, 0, 2]
    plain = Attention(32, num_heads=4, temperature=True).eval()
    plain.load_state_dict(state_in_original_order(plain, m.state_dict()))
    x = torch.randn(2, 6, 32)
    torch.testing.assert_close(plain(x), m(x), atol=1e-6, rtol=1e-5)
    with attention_capture(m) as ours, attention_capture(plain) as theirs:
        m(x), plain(x)
    torch.testing.assert_close(theirs.maps[""], ours.maps[""], atol=1e-6, rtol=1e-5)
    assert torch.equal(plain.tau, m.tau)


def test_install_keeps_the_weights_and_refuses_other_attention_classes():
    from vitlab.layers import Attention, CrossAttention

    torch.manual_seed(0)
    plain = Attention(32, num_heads=4, temperature=True)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    x = torch.randn(2, 6, 32)
    out = plain(x)
    installed = FrozenHeadAttention.install(plain)
    assert installed is plain and FrozenHeadAttention.install(plain) is plain
    assert not plain.frozen_heads.any() and plain.head_order.tolist() == [0, 1, 2, 3]
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in before.items())
    assert torch.equal(plain(x), out)
    with pytest.raises(TypeError, match="not CrossAttention"):
        FrozenHeadAttention.install(CrossAttention(32, num_heads=4))


def test_an_export_and_a_checkpoint_of_a_model_with_frozen_heads_load_as_plain_models(tmp_path):
    from vitlab.dynamics import FrozenHeadGuard
    from vitlab.export import export_model, load_model
    from vitlab.layers import Attention
    from vitlab.models import create_model

    torch.manual_seed(0)
    model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2, temperature=True)
    guard = FrozenHeadGuard([block.attn for block in model.blocks])
    guard.freeze(torch.tensor([[True, False, False, True], [False, True, False, False]]))
    assert "blocks.0.attn.head_order" in model.state_dict()
    loaded = load_model(export_model(model.eval(), tmp_path / "export"))
    assert all(type(m) is Attention for m in loaded.modules() if isinstance(m, Attention))
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_task_resumes_a_checkpoint_whose_attention_saved_a_head_order():
    """A checkpoint saved while every Attention held ``frozen_heads`` and ``head_order`` (vitlab before freezing
    moved out of the shared Attention): the task's ``on_load_checkpoint`` drops them for plain modules and keeps
    them for the modules the controller made FrozenHeadAttention."""
    from vitlab.config import RunConfig
    from vitlab.models import create_model
    from vitlab.training.tasks import ClassificationTask

    def task():
        torch.manual_seed(0)
        model = create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3, depth=2)
        return ClassificationTask(model, cfg=RunConfig(), hparams={"data_info": {"num_classes": 3}})

    saved = task()
    for block in saved.model.blocks:
        FrozenHeadAttention.install(block.attn)
    checkpoint = {"state_dict": saved.state_dict()}
    assert "model.blocks.1.attn.head_order" in checkpoint["state_dict"]
    plain, controlled = task(), task()
    FrozenHeadAttention.install(controlled.model.blocks[1].attn)
    for target in (plain, controlled):
        loaded = {"state_dict": dict(checkpoint["state_dict"])}
        target.on_load_checkpoint(loaded)
        target.load_state_dict(loaded["state_dict"])  # strict
    assert "model.blocks.1.attn.head_order" in controlled.state_dict()
    assert "model.blocks.0.attn.head_order" not in controlled.state_dict()


@pytest.mark.parametrize("frozen", [2, 4])
def test_frozen_heads_backward_forms_no_attention_matrix(frozen):
    """The frozen heads' ``dV = P^T dO`` is a flash call (``_grad_v_from_logsumexp``), never a ``[B, h, N, N]``
    tensor: forming ``P`` made a frozen head's backward slower than an active one's at 256 tokens (docs/dynamics.md,
    "Freezing"). Every tensor an operation of the backward returns is recorded; none is N x N."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.shapes += [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            return out

    m = _attn(temperature=True).train()
    N = 33
    x = torch.randn(2, N, 32, requires_grad=True)
    m.set_frozen_heads(torch.arange(4) < frozen)
    y = m(x)
    with Shapes() as seen:
        y.sum().backward()
    assert seen.shapes and not any(len(s) >= 2 and s[-2:] == (N, N) for s in seen.shapes), seen.shapes
    assert x.grad is not None and torch.isfinite(x.grad).all()

"""The attention-dynamics controller (ViTCAE eq. 20 and 26): freezing, the schedule, state, and a short fit."""

import copy
import dataclasses
import io
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from model_fixtures import tiny_vit
from vitlab.cli.main import main
from vitlab.config import build_config
from vitlab.diagnostics.capture import capture_attention
from vitlab.diagnostics.convergence import directedness_standard_error
from vitlab.diagnostics.plots import frozen_at_epoch, head_table, read_dynamics
from vitlab.dynamics import (
    DynamicsConfig,
    DynamicsController,
    FrozenHeadAttention,
    FrozenHeadGuard,
    ProbeMeasurement,
    controlled_modules,
    select_probe,
)
from vitlab.errors import ConfigError
from vitlab.layers import Attention
from vitlab.models import create_model
from vitlab.rundir import RunDir
from vitlab.training.run import fit

NUM_HEADS, HEAD_DIM, WIDTH = 4, 16, 64  # vit_pico


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 1, 8, 8, generator=generator)
        y = torch.randint(0, 3, (4,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def head_rows(module: Attention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copies of the QKV weight ``[3, H, d, C]``, bias ``[3, H, d]`` and ``log_tau [H]`` of a module, by original
    head (the module keeps its frozen heads in its first slots)."""
    weight = module.in_original_order("qkv.weight", module.qkv.weight.detach()).view(3, NUM_HEADS, HEAD_DIM, WIDTH)
    bias = module.in_original_order("qkv.bias", module.qkv.bias.detach()).view(3, NUM_HEADS, HEAD_DIM)
    return weight.clone(), bias.clone(), module.in_original_order("log_tau", module.log_tau.detach()).clone()


FROZEN = torch.tensor([[True, False, False, True], [False, True, False, False]])


# --- eq. 26: freezing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("train_values", [False, True])
def test_frozen_heads_stay_bit_identical_through_adamw_with_weight_decay(train_values):
    """Eq. 26: a frozen head's q, k, v rows and tau stay bit-identical through AdamW with weight decay and get exactly
    zero gradient. ``freeze_scope: pattern`` (``train_values``): only its q, k rows and tau; its v rows train."""
    model = tiny_vit()
    modules = [FrozenHeadAttention.install(m) for _, m in controlled_modules(model, None)]
    for module in modules:
        module.train_frozen_values = train_values
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_steps(model, optimizer, 3, seed=0)  # AdamW momentum now sits on every row
    guard = FrozenHeadGuard(modules)
    guard.freeze(FROZEN)
    guard.attach(optimizer)
    before = [head_rows(m) for m in modules]
    train_steps(model, optimizer, 10, seed=1)
    fixed = 2 if train_values else 3  # of q, k, v
    for module, mask, (weight, bias, log_tau) in zip(modules, FROZEN, before, strict=True):
        assert module.frozen_heads.tolist() == mask.tolist()
        # no gradient reaches a frozen head's fixed rows or tau
        grad = module.in_original_order("qkv.weight", module.qkv.weight.grad).view(3, NUM_HEADS, HEAD_DIM, WIDTH)
        assert torch.all(grad[:fixed, mask] == 0) and torch.all(
            module.in_original_order("log_tau", module.log_tau.grad)[mask] == 0
        )
        now_weight, now_bias, now_log_tau = head_rows(module)
        assert torch.equal(now_weight[:fixed, mask], weight[:fixed, mask])
        assert torch.equal(now_bias[:fixed, mask], bias[:fixed, mask])
        assert torch.equal(now_log_tau[mask], log_tau[mask])
        if train_values:  # every frozen head's v rows get a gradient and move
            assert grad[2, mask].abs().sum(-1).gt(0).all()
            assert (now_weight[2, mask] != weight[2, mask]).any(-1).any(-1).all()
        # the other heads keep training
        assert not torch.equal(now_weight[:, ~mask], weight[:, ~mask])
        assert (now_log_tau[~mask] != log_tau[~mask]).all()


def test_freezing_moves_the_optimizer_state_with_the_heads():
    """The heads move to contiguous slots when they freeze; AdamW's moments must move with them, or every later step
    would apply one head's momentum to another's rows."""
    model = tiny_vit()
    modules = [FrozenHeadAttention.install(m) for _, m in controlled_modules(model, None)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_steps(model, optimizer, 3, seed=0)

    def moments(module):
        return [
            {k: module.in_original_order(name, v).clone() for k, v in optimizer.state[p].items() if k != "step"}
            for name, p in module.head_parameters()
        ]

    before = [moments(m) for m in modules]
    guard = FrozenHeadGuard(modules)
    guard.attach(optimizer)
    guard.freeze(FROZEN)
    assert modules[0].head_order.tolist() == [0, 3, 1, 2] and modules[1].head_order.tolist() == [1, 0, 2, 3]
    for module, saved in zip(modules, before, strict=True):
        for now, then in zip(moments(module), saved, strict=True):
            assert all(torch.equal(now[key], then[key]) for key in then)


@pytest.mark.parametrize("scope", ["qkv", "pattern"])
def test_the_optimizer_skips_parameters_frozen_whole_and_nothing_else_changes(scope, monkeypatch):
    """A layer with every head frozen: its W_qkv and b_qkv (eq. 26, ``qkv`` scope) and its log_tau get no gradient at
    the step, so AdamW skips them (their step count stops) instead of computing an update that the guard undoes.
    Every parameter ends bit-identical to a run whose guard lets AdamW update them and then restores them."""
    frozen = torch.tensor([[True, True, True, True], [False, True, False, False]])

    def run(skip: bool):
        model = tiny_vit()
        modules = [FrozenHeadAttention.install(m) for _, m in controlled_modules(model, None)]
        for module in modules:
            module.train_frozen_values = scope == "pattern"
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        train_steps(model, optimizer, 3, seed=0)
        guard = FrozenHeadGuard(modules)
        guard.attach(optimizer)
        guard.freeze(frozen)
        if not skip:
            monkeypatch.setattr(guard, "drop_frozen_gradients", lambda: None)
        train_steps(model, optimizer, 4, seed=1)
        return model, modules, optimizer

    model, modules, optimizer = run(skip=True)
    reference, _, _ = run(skip=False)
    whole = modules[0]
    skipped = [whole.log_tau] + ([whole.qkv.weight, whole.qkv.bias] if scope == "qkv" else [])
    for parameter in skipped:
        assert parameter.grad is None and float(optimizer.state[parameter]["step"]) == 3
    if scope == "pattern":  # the v rows of a pattern-frozen layer still train: the tensor is not frozen whole
        assert float(optimizer.state[whole.qkv.weight]["step"]) == 7
    assert float(optimizer.state[modules[1].qkv.weight]["step"]) == 7  # a partly frozen layer is updated
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name


def test_without_the_guard_adamw_moves_zero_gradient_rows():
    """Why the guard exists: momentum and weight decay move a frozen head even though its gradient is zero."""
    model = tiny_vit()
    modules = [FrozenHeadAttention.install(m) for _, m in controlled_modules(model, None)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_steps(model, optimizer, 3, seed=0)
    FrozenHeadGuard(modules).freeze(FROZEN)  # frozen, but not attached to the optimizer
    weight, _, log_tau = head_rows(modules[0])
    train_steps(model, optimizer, 2, seed=1)
    now_weight, _, now_log_tau = head_rows(modules[0])
    assert not torch.equal(now_weight[:, FROZEN[0]], weight[:, FROZEN[0]])
    assert not torch.equal(now_log_tau[FROZEN[0]], log_tau[FROZEN[0]])


@pytest.mark.parametrize("train_values", [False, True])
def test_frozen_head_forward_is_unchanged_and_its_attention_stays_fixed_through_training(train_values):
    torch.manual_seed(0)
    attn = FrozenHeadAttention(WIDTH, num_heads=NUM_HEADS, temperature=True)
    attn.train_frozen_values = train_values  # freeze_scope: pattern; the pattern stays fixed all the same
    with torch.no_grad():
        attn.log_tau.copy_(torch.tensor([0.3, -0.2, 0.1, 0.0]))
    x = torch.randn(2, 9, WIDTH)
    reference_out = attn(x)
    reference_map = capture_attention(attn, x)[""]
    mask = torch.tensor([False, True, True, False])
    guard = FrozenHeadGuard([attn])
    guard.freeze(mask[None])
    torch.testing.assert_close(attn(x), reference_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(capture_attention(attn, x)[""], reference_map, atol=1e-6, rtol=1e-5)

    optimizer = torch.optim.AdamW(attn.parameters(), lr=1e-2, weight_decay=0.1)
    guard.attach(optimizer)
    frozen_map = capture_attention(attn, x)[""]
    generator = torch.Generator().manual_seed(1)
    for _ in range(10):
        optimizer.zero_grad()
        inputs = torch.randn(2, 9, WIDTH, generator=generator, requires_grad=True)
        attn(inputs).square().mean().backward()
        assert inputs.grad.abs().sum() > 0  # the value path keeps the input gradient
        optimizer.step()
    trained_map = capture_attention(attn, x)[""]
    assert torch.equal(trained_map[:, mask], frozen_map[:, mask])
    assert not torch.allclose(trained_map[:, ~mask], frozen_map[:, ~mask])


# --- eq. 20 and convergence from hand-made measurements ---------------------------------------------------------------
def point_masses(patches: list[list[int]], num_images: int = 2, num_patches: int = 16) -> ProbeMeasurement:
    """All probe images of head (l, h) put their CLS attention on patch ``patches[l][h]`` of the 4x4 grid."""
    dist = torch.zeros(len(patches), len(patches[0]), num_images, num_patches)
    for layer, row in enumerate(patches):
        for head, patch in enumerate(row):
            dist[layer, head, :, patch] = 1
    return ProbeMeasurement(dist, torch.ones(len(patches), len(patches[0]), dtype=torch.float64))


# On the 4x4 grid patch p sits at (p // 4, p % 4): 0 -> 1 moves 1 patch, 0 -> 2 and 1 -> 3 move 2, 0 -> 5 sqrt 2.
EPOCH0 = [[0, 0, 0, 0], [0, 0, 0, 0]]
EPOCH1 = [[0, 1, 1, 0], [1, 0, 5, 1]]  # heads (0,0), (0,3), (1,1) do not move
EPOCH2 = [[2, 3, 3, 2], [3, 2, 7, 3]]  # every head moves by 2 patches (0->2, 1->3, 5->7)
STILL = torch.tensor([[True, False, False, True], [False, True, False, False]])


# The paper's reading: drift in patch widths, the absolute rule, the probe at the model's own tau. The scripted
# point masses below are in patch widths; tests of the defaults are in test_controller_units.py.
PAPER = dict(drift_units="patch", convergence="absolute", probe_tau="model", log_model_tau=False)


def scheduled_controller(**config) -> DynamicsController:
    settings = dict(alpha=2.0, eps_d=0.5, eps_tau=0.5, patience=1, burn_in=0, probe_size=2, kappa_images=2, **PAPER)
    controller = DynamicsController(DynamicsConfig(**{**settings, **config}))
    controller.attach(tiny_vit())
    return controller


def test_schedule_sets_tau_from_drift_and_spares_frozen_heads():
    controller = scheduled_controller()
    first = controller.advance(point_masses(EPOCH0))
    assert first["epoch"] == 0 and first["drift"] is None and first["non_converged"] == 8
    assert torch.equal(controller.temperatures(), torch.ones(2, 4, dtype=torch.float64))

    second = controller.advance(point_masses(EPOCH1))
    drift = torch.tensor(second["drift"], dtype=torch.float64)
    expected_drift = torch.tensor([[0, 1, 1, 0], [1, 0, math.sqrt(2), 1]], dtype=torch.float64)
    torch.testing.assert_close(drift, expected_drift)
    tau = controller.temperatures()  # stored as float32 log_tau
    torch.testing.assert_close(tau, 1 / (1 + 2.0 * expected_drift), rtol=1e-6, atol=1e-7)  # eq. 20, alpha = 2
    # still heads: d = 0 < eps_d and tau unchanged for patience = 1 epoch -> converged and frozen
    assert torch.equal(torch.tensor(second["converged"]), STILL)
    assert torch.equal(torch.tensor(second["frozen"]), STILL)
    assert [m.frozen_heads.tolist() for m in controller.modules] == STILL.tolist()

    tau_before = controller.temperatures()
    third = controller.advance(point_masses(EPOCH2))
    torch.testing.assert_close(
        torch.tensor(third["drift"], dtype=torch.float64), torch.full((2, 4), 2.0, dtype=torch.float64)
    )
    tau = controller.temperatures()
    assert torch.equal(tau[STILL], tau_before[STILL])  # frozen: eq. 20 no longer applies
    torch.testing.assert_close(
        tau[~STILL], torch.full((5,), 1 / (1 + 2.0 * 2.0), dtype=torch.float64), rtol=1e-6, atol=1e-7
    )
    assert torch.equal(torch.tensor(third["converged"]), STILL)  # convergence is final
    assert third["non_converged"] == 5


def moves(shifts: list[list[list[int]]]) -> torch.Tensor:
    """``[L, H, P, 16]`` point masses: image ``i`` of head ``(l, h)`` on patch ``shifts[l][h][i]`` of the 4x4 grid's
    first row, so its drift from patch 0 is that many patch widths."""
    dist = torch.zeros(len(shifts), len(shifts[0]), len(shifts[0][0]), 16)
    for layer, row in enumerate(shifts):
        for head, images in enumerate(row):
            for image, patch in enumerate(images):
                dist[layer, head, image, patch] = 1
    return dist


def test_adaptive_probe_extends_only_heads_near_the_threshold():
    controller = scheduled_controller(probe_size=8, probe_min=4, probe_z=3.0, eps_d=0.5, kappa_images=2)
    still = [[[0] * 8] * NUM_HEADS] * 2
    kappa = torch.ones(2, NUM_HEADS, dtype=torch.float64)
    base, rest = moves(still)[:, :, :4], moves(still)[:, :, 4:]
    controller.advance(ProbeMeasurement(base, kappa), 0, extend=lambda: rest)  # epoch 0 keeps the whole probe
    assert controller.previous.shape[2] == 8
    # head (0, 0): 0.5 +- 0.29 on the first four images, within 3 standard errors of eps_d; (0, 1): 2 patches, sure
    shifts = [[[0] * 8 for _ in range(NUM_HEADS)] for _ in range(2)]
    shifts[0][0], shifts[0][1] = [0, 1, 0, 1, 1, 1, 1, 1], [2] * 8
    epoch1 = moves(shifts)
    calls = []
    record = controller.advance(
        ProbeMeasurement(epoch1[:, :, :4], None), 1, extend=lambda: calls.append(1) or epoch1[:, :, 4:]
    )
    assert calls == [1] and controller.previous.shape[2] == 8
    assert record["drift"][0][:2] == [0.75, 2.0]  # (0, 0) over all 8 images, (0, 1) over the first 4
    assert record["drift_images"][0][:2] == [8, 4] and record["kappa"] == kappa.tolist()
    # nothing near the threshold: the other images are neither pushed through the model nor stored
    record = controller.advance(ProbeMeasurement(epoch1[:, :, :4], None), 2, extend=lambda: 1 / 0)
    assert controller.previous.shape[2] == 4 and record["drift_images"][0][0] == 4


def test_adaptive_probe_measures_the_whole_probe_only_when_a_decision_needs_it():
    controller = scheduled_controller(probe_size=8, probe_min=4, eps_d=0.5, burn_in=2, kappa_images=2)
    shifts = [[[0, 1, 0, 1, 1, 1, 1, 1] for _ in range(NUM_HEADS)] for _ in range(2)]  # always near eps_d
    calls = []
    for epoch in range(4):
        dist = moves(shifts if epoch % 2 else [[[0] * 8] * NUM_HEADS] * 2)
        kappa = torch.ones(2, NUM_HEADS, dtype=torch.float64)
        controller.advance(
            ProbeMeasurement(dist[:, :, :4], kappa), epoch, extend=lambda d=dist: calls.append(1) or d[:, :, 4:]
        )
        calls.append(controller.previous.shape[2])
    # burn-in: epoch 0 on the small probe, epoch 1 (= burn_in - 1) whole for the first decision, then as needed
    assert calls == [4, 1, 8, 1, 8, 1, 8]


def test_kappa_every_k_epochs_repeats_the_last_count_with_its_epoch():
    controller = scheduled_controller(kappa_every=2)
    records = []
    for epoch, patches in enumerate([EPOCH0, EPOCH1, EPOCH2]):
        counted = controller.wants_kappa(epoch)
        kappa = torch.full((2, NUM_HEADS), epoch + 1.0, dtype=torch.float64)
        records.append(
            controller.advance(ProbeMeasurement(point_masses(patches).distributions, kappa if counted else None), epoch)
        )
    assert [r["kappa_epoch"] for r in records] == [0, 0, 2]
    assert [r["kappa"][0][0] for r in records] == [1.0, 1.0, 3.0]
    assert controller.state_dict()["kappa_epoch"] == 2


def test_drift_workers_change_no_record():
    """The controller's transport problems on two threads: every record (drift, directedness, tau, freezing) is
    the same as on one."""
    records = []
    for workers in (1, 2):
        config = DynamicsConfig(
            convergence="noise", burn_in=0, patience=1, probe_size=6, kappa_images=2, rho=0.95, drift_workers=workers
        )
        controller = DynamicsController(config)
        controller.attach(tiny_vit())
        generator = torch.Generator().manual_seed(0)
        run = []
        for _ in range(5):
            weights = torch.rand(2, NUM_HEADS, 6, 16, generator=generator, dtype=torch.float64) ** 4
            measurement = ProbeMeasurement(weights / weights.sum(-1, keepdim=True), torch.ones(2, NUM_HEADS))
            run.append(controller.advance(measurement))
        records.append(run)
    assert records[0] == records[1]
    assert any(any(row) for row in records[0][-1]["converged"])  # the decisions were exercised, not only the drift


def test_no_head_converges_during_burn_in():
    controller = scheduled_controller(burn_in=2)
    converged_at = [controller.advance(point_masses(EPOCH0))["non_converged"] for _ in range(5)]
    assert converged_at == [8, 8, 8, 0, 0]  # the tracker starts at epoch 2 (tau only), patience 1 -> epoch 3


def test_learn_mode_leaves_tau_to_the_gradient_and_freeze_off_keeps_heads_trainable():
    controller = scheduled_controller(mode="learn", freeze=False)
    for patches in (EPOCH0, EPOCH1):
        record = controller.advance(point_masses(patches))
    assert torch.equal(controller.temperatures(), torch.ones(2, 4, dtype=torch.float64))
    assert torch.equal(torch.tensor(record["converged"]), STILL)
    assert not any(record["frozen"][0] + record["frozen"][1])
    assert not any(m.frozen_heads.any() for m in controller.modules)


def test_fixed_mode_holds_tau_at_one_outside_training():
    model = tiny_vit()
    with torch.no_grad():
        for _, module in controlled_modules(model, None):
            module.log_tau.fill_(0.5)
    DynamicsController(DynamicsConfig(mode="fixed")).attach(model)
    for _, module in controlled_modules(model, None):
        assert torch.equal(module.log_tau, torch.zeros(NUM_HEADS)) and not module.log_tau.requires_grad


def test_state_round_trips_through_a_weights_only_checkpoint():
    original = scheduled_controller()
    for patches in (EPOCH0, EPOCH1):
        original.advance(point_masses(patches))
    buffer = io.BytesIO()
    torch.save({"callbacks": {"DynamicsController": original.state_dict()}}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["callbacks"]["DynamicsController"]

    resumed = DynamicsController(copy.deepcopy(original.config))
    resumed.attach(copy.deepcopy(original.model))
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and torch.equal(resumed.frozen, STILL)
    assert [m.frozen_heads.tolist() for m in resumed.modules] == STILL.tolist()
    assert torch.equal(resumed.tracker.streak, original.tracker.streak)
    assert torch.equal(resumed.previous, original.previous)
    assert resumed.advance(point_masses(EPOCH2)) == original.advance(point_masses(EPOCH2))

    # this run's thresholds win over the checkpoint's on resume, the score clause's ratio too
    stricter = DynamicsController(dataclasses.replace(original.config, score_ratio=0.2))
    stricter.attach(copy.deepcopy(original.model))
    stricter.load_state_dict(state)
    assert (stricter.tracker.config.score_ratio, resumed.tracker.config.score_ratio) == (0.2, 0.5)

    # every option of the tracker, the decay rule's ratio and window included, as the resumed config sets it
    changed = dataclasses.replace(original.config, convergence="decay", decay_ratio=0.3, decay_window=5, patience=7)
    other_rule = DynamicsController(changed)
    other_rule.attach(copy.deepcopy(original.model))
    other_rule.load_state_dict(state)
    tracker = other_rule.tracker.config
    assert (tracker.convergence, tracker.decay_ratio, tracker.decay_window, tracker.patience) == ("decay", 0.3, 5, 7)
    assert torch.equal(other_rule.tracker.streak, state["tracker"]["streak"])  # the saved verdicts go on

    other_target = DynamicsController(DynamicsConfig(target="blocks.1"))
    other_target.attach(tiny_vit())
    with pytest.raises(ConfigError, match="same model and dynamics.target"):
        other_target.load_state_dict(state)


# --- configuration and targets -----------------------------------------------------------------------------------
def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"dynamics\.epsd.*eps_d"):
        DynamicsController.from_config({"epsd": 0.1}, ".")
    with pytest.raises(ConfigError, match="mode must be one of schedule, learn, fixed"):
        DynamicsConfig(mode="anneal")
    with pytest.raises(ConfigError, match="kappa_images"):
        DynamicsConfig(probe_size=8, kappa_images=16)
    with pytest.raises(ConfigError, match="freeze_scope must be one of qkv, pattern, got 'values'"):
        DynamicsConfig(freeze_scope="values")
    with pytest.raises(ConfigError, match="drift_workers must be >= 1 thread or null"):
        DynamicsConfig(drift_workers=0)
    with pytest.raises(ConfigError, match="temperature=true"):
        DynamicsController(DynamicsConfig(mode="schedule")).attach(tiny_vit(temperature=False))
    with pytest.raises(ConfigError, match="matches no attention module"):
        DynamicsController(DynamicsConfig(target="decoder")).attach(tiny_vit())


def test_default_target_is_the_vitcae_encoder_not_its_decoder():
    model = create_model("vitcae_pico")
    names = [n for n, _ in controlled_modules(model, None)]
    assert names == [f"encoder.blocks.{i}.attn" for i in range(4)]
    assert any(n.startswith("decoder_blocks") for n, _ in controlled_modules(model, ""))
    model.dynamics_target = "encoder.blocks.3"
    assert [n for n, _ in controlled_modules(model, None)] == ["encoder.blocks.3.attn"]


def test_measure_gives_distributions_on_the_grid_and_cluster_counts():
    controller = DynamicsController(DynamicsConfig(probe_size=5, probe_batch_size=2, kappa_images=3))
    controller.attach(tiny_vit())
    measurement = controller.measure(torch.randn(5, 1, 8, 8))
    assert measurement.distributions.shape == (2, 4, 5, 16)
    torch.testing.assert_close(measurement.distributions.sum(-1), torch.ones(2, 4, 5))
    assert measurement.kappa.shape == (2, 4) and ((measurement.kappa >= 1) & (measurement.kappa <= 17)).all()
    assert controller.model.training  # the train/eval state is restored


def test_probe_at_unit_tau_measures_as_if_tau_were_one_and_restores_it_exactly():
    model = tiny_vit()
    with torch.no_grad():
        for _, module in controlled_modules(model, None):
            module.log_tau.copy_(torch.tensor([0.7, -0.4, 0.2, -1.0]))
    at_one = copy.deepcopy(model)
    for _, module in controlled_modules(at_one, None):
        module.log_tau.data.zero_()
    log_tau = [m.log_tau.detach().clone() for _, m in controlled_modules(model, None)]
    probe = torch.randn(3, 1, 8, 8)
    measured = {}
    for name, probe_tau, net in (("unit", "unit", model), ("one", "model", at_one), ("own", "model", model)):
        controller = DynamicsController(DynamicsConfig(probe_tau=probe_tau, probe_size=3, kappa_images=3))
        controller.attach(net)
        measured[name] = controller.measure(probe).distributions
    assert torch.equal(measured["unit"], measured["one"])
    assert not torch.allclose(measured["own"], measured["one"])
    assert all(torch.equal(m.log_tau, t) for (_, m), t in zip(controlled_modules(model, None), log_tau, strict=True))


def test_select_probe_is_seeded_ordered_and_leaves_the_global_rng_alone():
    images = torch.arange(20.0).view(20, 1, 1, 1)
    loader = DataLoader(TensorDataset(images, torch.zeros(20)), batch_size=6)
    assert select_probe(loader, 4, seed=None).flatten().tolist() == [0, 1, 2, 3]
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    seeded = select_probe(loader, 5, seed=7).flatten()
    assert torch.equal(torch.rand(1), expected_next)
    assert torch.equal(seeded, torch.randperm(20, generator=torch.Generator().manual_seed(7))[:5].sort().values.float())
    assert torch.equal(select_probe(loader, 5, seed=7).flatten(), seeded)


# --- Lightning: a short fit, the jsonl, the plots and the command -------------------------------------------------
FIT = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=2",
    "model.depth=2",
    "model.temperature=true",
    "data.limit_train=128",
    "run.test=false",
    "run.export=false",
    "run.generate=false",
    "model.name=vit_pico",  # pinned, so that changes to the packaged config do not change these tests
    "model.patch_size=2",
    "dynamics.probe_size=16",
    "dynamics.probe_batch_size=8",
    "dynamics.kappa_images=4",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dynamics")
    out = {}
    for mode in ("schedule", "fixed"):
        # the schedule arm also logs the drift at the model's own tau (off by default), as Table I's recipe does
        extra = ["dynamics.log_model_tau=true"] if mode == "schedule" else []
        out[mode] = fit(build_config("vit/digits", [*FIT, f"run.dir={root / mode}", f"dynamics.mode={mode}", *extra]))
    return out


@pytest.mark.parametrize("mode", ["schedule", "fixed"])
def test_fit_writes_one_record_per_epoch_with_per_head_lists(runs, mode):
    lines = (runs[mode] / "dynamics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert records[0]["drift"] is None and records[0]["modules"] == ["blocks.0.attn", "blocks.1.attn"]
    for record in records:
        for key in ("kappa", "tau", "converged", "frozen"):
            assert [len(row) for row in record[key]] == [NUM_HEADS, NUM_HEADS], key
        assert record["non_converged"] == sum(not c for row in record["converged"] for c in row)
        assert record["seconds"] > 0
        # the parts are timed inside the controller's seconds; kappa is timed inside the probe pass
        parts = record["seconds_parts"]
        assert parts["probe"] + parts.get("probe_model_tau", 0) + parts.get("drift", 0) <= record["seconds"]
        assert 0 < parts["kappa"] <= parts["probe"]
    assert "drift" not in records[0]["seconds_parts"] and records[1]["seconds_parts"]["drift"] > 0
    assert ("probe_model_tau" in records[1]["seconds_parts"]) == (mode == "schedule")
    for record in records[1:]:
        assert [len(row) for row in record["drift"]] == [NUM_HEADS, NUM_HEADS]
        assert all(d >= 0 for row in record["drift"] for d in row)
    tau = torch.tensor([r["tau"] for r in records], dtype=torch.float64)
    if mode == "fixed":
        assert torch.equal(tau, torch.ones_like(tau))
        assert "drift_model_tau" not in records[1]  # fixed mode has no own tau to probe at
    else:  # eq. 20, alpha = 4 per image side: the tau an epoch ends with is 1 / (1 + 4 d) of that epoch
        drift = torch.tensor([r["drift"] for r in records[1:]], dtype=torch.float64)
        torch.testing.assert_close(tau[1:], 1 / (1 + 4 * drift), rtol=1e-6, atol=1e-6)
        # the default probes at tau = 1; log_model_tau logs the drift at the model's own tau beside it
        assert records[0]["drift_model_tau"] is None and len(records[1]["drift_model_tau"]) == 2
    assert records[0]["drift_units"] == "image" and records[0]["probe_tau"] == "unit"
    assert all(r["lr"] > 0 for r in records)
    metrics = RunDir(runs[mode]).metrics()
    assert [m["dynamics/non_converged"] for m in metrics] == [r["non_converged"] for r in records[1:]]
    assert {"dynamics.png", "temperature.png", "frozen.png"} <= {p.name for p in (runs[mode] / "dynamics").iterdir()}


def test_report_draws_the_two_arms_side_by_side_and_their_drift_against_the_learning_rate(runs):
    from vitlab.report.figures import draw
    from vitlab.report.page import Plot

    paths = [str(runs[mode] / "dynamics.jsonl") for mode in ("fixed", "schedule")]
    drawn = dict(draw(Plot("dynamics_comparison", {"paths": paths, "labels": ["uncontrolled", "controlled"]})))
    assert set(drawn) == {"comparison.png", "drift_vs_lr.png"}
    assert all(data.startswith(b"\x89PNG") for data in drawn.values())


def test_checkpoint_holds_the_controller_state_as_plain_data(runs):
    ckpt = torch.load(runs["schedule"] / "checkpoints" / "last.ckpt", weights_only=True)
    state = ckpt["callbacks"]["DynamicsController"]
    assert state["epoch"] == 2 and state["modules"] == ["blocks.0.attn", "blocks.1.attn"]
    assert state["previous"].shape == (2, NUM_HEADS, 16, 16)


@pytest.mark.parametrize(
    ("check_val_every", "first_epochs"),
    [
        (1, 1),  # last.ckpt written at the end of epoch 1: the resumed run trains epoch 2 on the restored state
        (2, 2),  # last.ckpt written at validation end, before the controller's step: Lightning replays that step
    ],
)
def test_resumed_run_continues_the_same_schedule(runs, tmp_path, check_val_every, first_epochs):
    settings = [*FIT, f"run.dir={tmp_path}", f"trainer.check_val_every_n_epoch={check_val_every}"]
    first = fit(build_config("vit/digits", [*settings, f"trainer.max_epochs={first_epochs}"]))
    fit(build_config("vit/digits", settings), resume=first)
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "dynamics.jsonl").read_text().splitlines()]
    assert epochs == ([0, 1, 2] if check_val_every == 1 else [0, 1, 2, 2])  # the replayed step writes epoch 2 again
    # StepTimer continues too: two training epochs in all, the one whose end is replayed counted once
    assert json.loads((tmp_path / "timing.json").read_text())["epochs"] == 2
    resumed, straight = read_dynamics(tmp_path), read_dynamics(runs["schedule"])
    for key in ("drift", "kappa", "tau", "converged", "frozen"):
        assert [r[key] for r in resumed] == [r[key] for r in straight], key


def scripted_config(**overrides) -> DynamicsConfig:
    """The config under which ScriptedController's STILL heads, and only they, converge at the end of epoch 1."""
    settings = dict(alpha=2.0, eps_d=0.5, eps_tau=0.5, patience=1, burn_in=0, probe_size=4, kappa_images=4)
    return DynamicsConfig(**{**settings, **PAPER, **overrides})


class ScriptedController(DynamicsController):
    """The real controller in a real fit, but its probe passes replaced by the hand-made measurements above, so that
    exactly the STILL heads converge (and freeze) at the end of the first epoch."""

    frozen_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def measure(self, probe: torch.Tensor, kappa: bool = True) -> ProbeMeasurement:
        epoch = 0 if self.epoch is None else self.epoch + 1
        return point_masses([EPOCH0, EPOCH1, EPOCH2][epoch], num_images=len(probe))

    def advance(self, measurement: ProbeMeasurement, epoch=None, extend=None, model_tau=None, rate=None) -> dict:
        record = super().advance(measurement, epoch, extend, model_tau, rate)
        if record["epoch"] == 1:
            self.frozen_rows = [head_rows(m) for m in self.modules]
        return record


@pytest.mark.parametrize("scope", ["qkv", "pattern"])
def test_frozen_heads_stay_bit_identical_through_lightning_training(tmp_path, scope):
    """What a frozen head keeps fixed through a real fit: its q, k, v rows and tau (eq. 26), or with
    ``freeze_scope: pattern`` its q, k rows and tau while its v rows train."""
    settings = [s for s in FIT if not s.startswith("dynamics.")]
    config = scripted_config(freeze_scope=scope)
    controller = ScriptedController(config, tmp_path)
    fit(build_config("vit/digits", [*settings, f"run.dir={tmp_path}"]), callbacks=[controller])
    assert [r["epoch"] for r in read_dynamics(tmp_path)] == [0, 1, 2]
    assert torch.equal(controller.frozen, STILL)
    fixed = 2 if scope == "pattern" else 3  # q, k (and v)
    assert all(m.train_frozen_values == (scope == "pattern") for m in controller.modules)
    assert {r["freeze_scope"] for r in read_dynamics(tmp_path)} == {scope}
    for module, mask, (weight, bias, log_tau) in zip(controller.modules, STILL, controller.frozen_rows, strict=True):
        now_weight, now_bias, now_log_tau = head_rows(module)
        assert torch.equal(now_weight[:fixed, mask], weight[:fixed, mask])
        assert torch.equal(now_bias[:fixed, mask], bias[:fixed, mask])
        assert torch.equal(now_log_tau[mask], log_tau[mask])
        assert not torch.equal(now_weight[:, ~mask], weight[:, ~mask])
        if scope == "pattern":
            assert (now_weight[2, mask] != weight[2, mask]).any(-1).any(-1).all(), "the frozen heads' values train"


class WholeLayerFrozen(DynamicsController):
    """The real controller in a real fit, with every head of the first layer frozen before the first step;
    ``skip=False``: the optimizer still updates that layer's tensors and the guard undoes it (the earlier way)."""

    optimizer: torch.optim.Optimizer | None = None
    skip = True

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self.frozen = torch.zeros(self.shape, dtype=torch.bool)
        self.frozen[0] = True
        self.guard.freeze(self.frozen)
        if not self.skip:
            self.guard.drop_frozen_gradients = lambda: None

    def on_train_end(self, trainer, pl_module) -> None:
        self.optimizer = trainer.optimizers[0]
        super().on_train_end(trainer, pl_module)


def test_lightning_training_skips_the_update_of_a_layer_frozen_whole_and_ends_bit_identical(tmp_path):
    """In a Lightning fit the backward and the gradient clipping run inside ``optimizer.step(closure)``; the guard
    wraps the closure and drops the zero gradients of the parameters frozen whole after it, so AdamW never creates
    state for them, while the next layer trains. The clipping norm is the one a run without the skip computes
    (dropping before the clipping changed its last bits, and a 50-epoch run took another path), so every parameter
    ends bit-identical to such a run."""
    settings = [s for s in FIT if not s.startswith("dynamics.")] + ["optim.grad_clip=0.5"]
    models = []
    for skip in (True, False):
        controller = WholeLayerFrozen(scripted_config(eps_d=1e-12), tmp_path / str(skip))  # nothing else converges
        controller.skip = skip
        fit(build_config("vit/digits", [*settings, f"run.dir={tmp_path / str(skip)}"]), callbacks=[controller])
        models.append(controller.model)
        if skip:
            first, second = controller.modules
            assert first.frozen_heads.all() and not second.frozen_heads.any()
            for parameter in (first.qkv.weight, first.qkv.bias, first.log_tau):
                assert parameter.grad is None and not controller.optimizer.state.get(parameter)
            assert float(controller.optimizer.state[second.qkv.weight]["step"]) == 4  # 2 epochs x 2 batches
    for (name, ours), theirs in zip(models[0].state_dict().items(), models[1].state_dict().values(), strict=True):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("scope", ["qkv", "pattern"])
def test_resumed_run_after_a_head_permutation_continues_bit_identically(tmp_path, scope):
    """STILL's heads freeze at the end of epoch 1, which moves them to the first slots of their modules (and the
    AdamW state with them); a run stopped right there and resumed ends bit-identical to one that never stopped,
    with eq. 26 and with ``freeze_scope: pattern`` (whose frozen heads' v rows and their moments keep training)."""
    settings = [s for s in FIT if not s.startswith("dynamics.")]
    config = scripted_config(freeze_scope=scope)

    def last_checkpoint(run_dir):
        return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)

    straight = tmp_path / "straight"
    fit(
        build_config("vit/digits", [*settings, f"run.dir={straight}"]), callbacks=[ScriptedController(config, straight)]
    )
    resumed = tmp_path / "resumed"
    first = [*settings, f"run.dir={resumed}", "trainer.max_epochs=1"]
    fit(build_config("vit/digits", first), callbacks=[ScriptedController(config, resumed)])
    assert last_checkpoint(resumed)["state_dict"]["model.blocks.0.attn.head_order"].tolist() == [0, 3, 1, 2]
    fit(
        build_config("vit/digits", [*settings, f"run.dir={resumed}"]),
        resume=resumed,
        callbacks=[ScriptedController(config, resumed)],
    )
    a, b = last_checkpoint(straight), last_checkpoint(resumed)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for state_a, state_b in zip(
        a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values(), strict=True
    ):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert [r["frozen"] for r in read_dynamics(straight)] == [r["frozen"] for r in read_dynamics(resumed)]


def test_dynamics_command_prints_the_head_table_and_draws_the_comparison(runs, tmp_path, capsys):
    assert main(["dynamics", str(runs["schedule"]), "--compare", str(runs["fixed"]), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attention heads after epoch 2" in out and len(head_table(read_dynamics(runs["schedule"]))) == 8
    assert out.count("\n    1    3 ") == 1  # the row of layer 1, head 3
    names = {"dynamics.png", "temperature.png", "frozen.png", "comparison.png", "drift_vs_lr.png"}
    assert {p.name for p in tmp_path.iterdir()} == names


def test_read_dynamics_keeps_the_last_line_of_an_epoch_and_finds_freezing_epochs(tmp_path):
    def record(epoch, frozen):
        return {
            "epoch": epoch,
            "tau": [[1.0, 1.0]],
            "kappa": [[1.0, 2.0]],
            "drift": None if epoch == 0 else [[0.1, 0]],
            "converged": frozen,
            "frozen": frozen,
            "non_converged": 0,
            "mode": "schedule",
        }

    lines = [
        record(0, [[False, False]]),
        record(1, [[False, True]]),
        record(1, [[True, True]]),
        record(2, [[True, True]]),
    ]
    (tmp_path / "dynamics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    records = read_dynamics(tmp_path)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert frozen_at_epoch(records).tolist() == [[1.0, 1.0]]
    (tmp_path / "plain").mkdir()  # a run trained without the controller
    with pytest.raises(FileNotFoundError, match="without the dynamics controller"):
        read_dynamics(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="missing does not exist; pass a run directory"):
        read_dynamics(tmp_path / "missing")


def test_adaptive_probe_under_the_noise_rule_extends_heads_whose_directedness_is_near_rho():
    """Head (0, 0) moves one patch (epoch 0 -> 1), then 3 of its first 4 images move on and one comes back: a
    directedness of 0.75 = rho on the first 4 images, uncertain; on all 8 images 7 move on (0.875). Head (0, 1)
    moves on everywhere (1.0, no spread: certain); the others do not move (0)."""
    controller = scheduled_controller(
        probe_size=8, probe_min=4, probe_z=3.0, convergence="noise", rho=0.75, burn_in=2, kappa_images=2
    )
    epochs = [[[[0] * 8 for _ in range(NUM_HEADS)] for _ in range(2)] for _ in range(3)]
    epochs[1][0][0], epochs[1][0][1] = [1] * 8, [1] * 8
    epochs[2][0][0], epochs[2][0][1] = [2, 0, 2, 2, 2, 2, 2, 2], [2] * 8
    kappa = torch.ones(2, NUM_HEADS, dtype=torch.float64)
    calls, records = [], []
    for epoch, shifts in enumerate(epochs):
        dist = moves(shifts)
        extend = lambda d=dist, e=epoch: calls.append(e) or d[:, :, 4:]  # noqa: E731
        records.append(controller.advance(ProbeMeasurement(dist[:, :, :4], kappa), epoch, extend=extend))
    assert calls == [0, 1, 2]  # epochs burn_in - 2 and burn_in - 1 measure the whole probe; epoch 2 for head (0, 0)
    assert records[2]["drift_images"][0][:2] == [8, 4]
    directed = records[2]["directedness"][0]
    assert directed[0] == pytest.approx(0.875) and directed[1] == pytest.approx(1.0) and directed[2] == 0
    # the same decision inputs as the exact probe for the extended head: d(t-1, t) and d(t-2, t) over all 8 images
    exact = scheduled_controller(probe_size=8, convergence="noise", rho=0.75, burn_in=2, kappa_images=2)
    exact_records = [exact.advance(ProbeMeasurement(moves(s), kappa), e) for e, s in enumerate(epochs)]
    assert exact_records[2]["directedness"][0][0] == pytest.approx(directed[0])
    assert exact_records[2]["drift"][0][0] == pytest.approx(records[2]["drift"][0][0])


def test_directedness_standard_error_is_the_delta_method_of_the_ratio():
    two_epoch = torch.tensor([[2.0, 0.0, 2.0, 2.0]])
    later = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    earlier = torch.tensor([1.0])
    # later has no spread, so the error is that of mean(two_epoch) / 2: std([2, 0, 2, 2]) / sqrt(4) / 2
    expected = torch.tensor([2.0, 0.0, 2.0, 2.0]).std() / 2 / 2
    torch.testing.assert_close(directedness_standard_error(two_epoch, later, earlier), expected[None].double())
    assert directedness_standard_error(torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(1)).item() == 0


def spread(weights: dict[int, float], num_images: int = 2) -> ProbeMeasurement:
    """Every head's probe images at half the uniform distribution over the 4x4 grid plus ``weights`` (patch -> mass,
    summing to 0.5): no patch without attention, so the scores (log-attention) are finite."""
    dist = torch.full((2, NUM_HEADS, num_images, 16), 0.5 / 16)
    for patch, mass in weights.items():
        dist[..., patch] += mass
    return ProbeMeasurement(dist, torch.ones(2, NUM_HEADS, dtype=torch.float64))


@pytest.mark.parametrize("thaw", [False, True])
def test_a_head_that_settles_and_moves_again_is_thawed_only_with_thaw(thaw):
    """Under the response rule (window 1, patience 1): half of the attention moves 3 patches each epoch, then 2% of it
    jitters between patches 2 and 4, sqrt(5) apart (settled: drift 0.045 < 0.35 x 1.5 and the scores move little,
    directedness 0), then moves 3 patches again. With ``thaw`` the head is released and its parameters train again."""
    controller = scheduled_controller(convergence="response", rho=0.9, decay_window=1, thaw=thaw)
    left, right = {3: 0.48, 2: 0.02}, {3: 0.48, 4: 0.02}
    path = [{0: 0.5}, {3: 0.5}, {0: 0.5}, {3: 0.5}, left, right, left, right, {0: 0.5}, {3: 0.5}]
    records = [controller.advance(spread(weights)) for weights in path]
    assert all(all(row) for row in records[7]["frozen"])  # settled at the jitter
    assert records[7]["response_level"][0][0] == pytest.approx(0.02 * 5**0.5) and records[7]["rate"] == 1.0
    assert records[7]["score_level"][0][0] < records[7]["score_threshold"][0][0]
    last = records[-1]
    assert all(all(row) for row in last["frozen"]) != thaw
    assert [bool(m.frozen_heads.any()) for m in controller.modules] == [not thaw] * 2


def test_a_saturated_head_whose_scores_keep_moving_is_not_settled():
    """The same path in attention as a settled head, but the jitter's 2% comes from patches the head ignored before
    (attention 0, scores at the floor): its scores move as much as before, so the response rule does not freeze it."""
    controller = scheduled_controller(convergence="response", rho=0.9, decay_window=1)
    path = [[[0] * 4] * 2, [[3] * 4] * 2, [[0] * 4] * 2, [[3] * 4] * 2, [[2] * 4] * 2, [[3] * 4] * 2]
    records = [controller.advance(point_masses(p)) for p in path]
    assert records[-1]["response_level"][0][0] < records[-1]["threshold"][0][0]  # the drift alone would freeze it
    assert records[-1]["score_level"][0][0] >= records[-1]["score_threshold"][0][0]
    assert not any(any(row) for row in records[-1]["frozen"])


def test_the_lag_clause_is_fed_by_the_controller():
    """dynamics.lag set in a run reaches the tracker: the controller keeps the last ``lag`` measurements and passes
    their score MSDs every epoch (without it the clause passed every head, and the option changed nothing)."""
    controller = scheduled_controller(convergence="response", lag=2, freeze=False)
    for patches in (EPOCH0, EPOCH1, EPOCH2, EPOCH1):
        controller.advance(point_masses(patches))
    tracker = controller.tracker
    assert tracker.config.lag == 2 and tracker.lag_seen
    assert torch.isfinite(tracker.lagged[-1]).all()  # over one epoch and over two, once two lie behind
    assert torch.isnan(tracker.lagged[0, 1]).all()
    assert scheduled_controller(convergence="response", freeze=False).lag_window is None

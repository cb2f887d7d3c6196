"""What a training step asks of the host: on CUDA each value read back, each data-dependent shape and each tensor
made from host data waits for the device, which costs a time slice per wait when processes share a GPU. Counted on
a CPU by the operations that would wait (:mod:`sync_fixtures`), through a ``vitlab fit`` of one epoch.
"""

from __future__ import annotations

import json
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from run_fixtures import TINY
from sync_fixtures import CountSyncsPerPhase, HostSyncCounter
from vitlab.config import build_config
from vitlab.rundir import STEPS_FILE
from vitlab.training.run import fit

QUICK = [o for o in TINY if not o.startswith(("model.depth", "data.limit_train"))] + [
    "trainer.max_epochs=1",
    "trainer.precision=32-true",
    "data.limit_train=192",
]
#: CET-ViT with the card's options (docs/card_claim.md: 8:1 slots, empty slots masked, a learned position
#: embedding) and the EI term in the loss from the first step
CET_CARD = [
    "model.pos_embed=learned",
    "model.slot_ratio=8",
    "model.mask_empty_slots=true",
    "model.dynamic_k=none",
    "loss.ei_schedule=constant",
]
CET_EXACT_DENSE = ["model.dynamic_k=exact", "model.select_grad=dense_st", "loss.ei_schedule=constant"]
#: the one wait CET-ViT's EI term keeps, per step: torch.linalg.svdvals, whose cuSOLVER kernel checks on the host
#: that every matrix converged (and reruns those that did not), a check torch offers no way to skip
SVD = ("SVD", "vitlab/families/cet_vit/ei.py")


def _count(config: str, overrides: list[str], tmp_path) -> CountSyncsPerPhase:
    counts = CountSyncsPerPhase()
    fit(build_config(config, [*QUICK, *overrides, f"run.dir={tmp_path / 'run'}"]), callbacks=[counts])
    assert counts.train_steps >= 3 and counts.val_steps >= 2
    return counts


def _per_step(counts: CountSyncsPerPhase, phase: str) -> dict[tuple[str, str], float]:
    steps = counts.train_steps - 1 if phase == "train_step" else counts.val_steps - 1
    return {(what, caller.split(":")[0]): n / steps for (what, caller), n in counts.counter.summary(phase).items()}


def test_the_counter_sees_each_kind_of_wait_and_nothing_else():
    x = torch.randn(4, 8)
    with HostSyncCounter() as counter:
        x.sum().item(), bool(x[0, 0] > 0), float(x.max()), x.tolist(), x.numpy(), x.cpu()
        x[x > 0], x.nonzero(), torch.where(x > 0), x.unique(), torch.tensor([1.0, 2.0]), torch.linalg.svdvals(x)
        seen = len(counter.events)
        torch.full((), 2.0), torch.where(x > 0, x, 0.0), x.topk(2), x.argmax(-1), x.softmax(-1)
        torch.nn.functional.one_hot(x.argmax(-1), 8)  # on a CPU only does one_hot read its classes
    kinds = {what for _, what, _ in counter.events}
    assert kinds == {
        "read a value",
        "tolist",
        "numpy",
        "copy to the host",
        "boolean-mask indexing",
        "nonzero",
        "unique",
        "tensor from host data",
        "SVD",
    }
    assert len(counter.events) == seen


def test_a_vit_training_step_waits_for_nothing(tmp_path):
    counts = _count("vit/digits", [], tmp_path)
    assert counts.counter.summary("train_step") == {}
    assert counts.counter.summary("val_step") == {}


@pytest.mark.parametrize("overrides", [CET_CARD, CET_EXACT_DENSE], ids=["card", "exact_dense_st"])
def test_a_cet_vit_step_with_ei_waits_only_for_the_svd(overrides, tmp_path):
    """With the EI term on, each training and validation step makes one wait: the SVD's convergence check."""
    counts = _count("cet_vit/digits", overrides, tmp_path)
    assert _per_step(counts, "train_step") == {SVD: 1.0}
    assert _per_step(counts, "val_step") == {SVD: 1.0}


def test_the_logged_learning_rate_is_the_optimisers_in_float32(tmp_path):
    """The learning rate is logged as a tensor filled on the device: the same float32 value, step by step, that
    Lightning made of the Python number before (``torch.tensor(lr)``)."""
    seen: list[float] = []

    class LearningRates(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    cfg = build_config("vit/digits", [*QUICK, "trainer.log_every_n_steps=1", f"run.dir={tmp_path / 'run'}"])
    run_dir = fit(cfg, callbacks=[LearningRates()])
    logged = [row["lr"] for row in map(json.loads, (run_dir / STEPS_FILE).read_text().splitlines())]
    assert len(logged) == len(seen) >= 3 and len(set(seen)) > 1
    assert logged == [torch.tensor(lr).item() for lr in seen]

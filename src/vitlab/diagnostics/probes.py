"""Probes that find dead or inert parts of a model, for any model of the project (CET-ViT v4 model card:
"Reproduce the diagnostics"); a family adds its own (``vitlab probe`` sub-commands registered with
:func:`vitlab.cli.probe.probe`).

The CET-ViT card (Disclosure 1) found its Dynamic-K estimator dead with two checks that any model deserves:

- :func:`gradient_flow`: one training batch through the task's real training loss, backward, and every parameter
  whose gradient is None (not in the graph) or all zeros. The card: "All 6 parameters return ``grad = None`` under
  the training loss".
- :func:`init_distance`: per parameter tensor, the trained statistics (mean, std) against those of several fresh
  initialisations. The card: "Trained weights vs. fresh init: statistically indistinguishable after 287 epochs".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitlab.models.contract import module_mode

#: with this relative floor on the spread across fresh initialisations, a tensor every seed initialises to the same
#: constants (LayerNorm weights 1, biases 0) counts as moved as soon as training changes it at all
_SPREAD_FLOOR = 1e-6


# -------------------------------------------------------------------------------------------------------------------
# Gradient flow
# -------------------------------------------------------------------------------------------------------------------
def gradient_flow(task: nn.Module, batch: Any) -> dict[str, Any]:
    """Every parameter of ``task`` that the training loss does not reach (CET-ViT card, Disclosure 1, check 1).

    ``task`` is a vitlab Lightning task (anything with ``compute_losses(batch, stage) -> {"loss": scalar, ...}``);
    ``batch`` one training batch as its data loader yields it, on the task's device. The task runs in training mode
    (dropout, Gumbel noise, Mixup targets as in training), the loss is backpropagated once, the gradients are read
    and cleared again, and the task's mode is restored (its running metrics, such as the training accuracy, do see
    the batch).

    Returns ``{"loss", "num_tensors", "num_trainable", "no_grad", "zero_grad", "frozen", "dead", "grad_norms"}``:
    ``no_grad`` the trainable parameters whose ``.grad`` is None, ``zero_grad`` those whose gradient is all zeros,
    ``dead`` both lists together, ``frozen`` the parameters with ``requires_grad=False`` (not counted as dead), and
    ``grad_norms`` the L2 norm of every gradient that exists. Names drop the task's ``model.`` prefix.
    """
    if not hasattr(task, "compute_losses"):
        raise TypeError(
            f"gradient_flow needs a training task with compute_losses(batch, stage), got {type(task).__name__}; "
            "wrap the model with vitlab.training.run.build_task(cfg, model, hparams)"
        )
    task.zero_grad(set_to_none=True)
    try:
        with module_mode(task, training=True), warnings.catch_warnings():
            # compute_losses logs through self.log, which warns (and does nothing) outside a Trainer
            warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
            loss = task.compute_losses(batch, "train")["loss"]
            loss.backward()
        no_grad, zero_grad, frozen, norms = [], [], [], {}
        for full_name, param in task.named_parameters():
            name = full_name.removeprefix("model.")
            if not param.requires_grad:
                frozen.append(name)
            elif param.grad is None:
                no_grad.append(name)
            else:
                norms[name] = param.grad.detach().float().norm().item()
                if not param.grad.any():
                    zero_grad.append(name)
    finally:
        task.zero_grad(set_to_none=True)
    return {
        "loss": loss.item(),
        "num_tensors": len(norms) + len(no_grad) + len(frozen),
        "num_trainable": len(norms) + len(no_grad),
        "no_grad": no_grad,
        "zero_grad": zero_grad,
        "dead": no_grad + zero_grad,
        "frozen": frozen,
        "grad_norms": norms,
    }


def format_gradient_flow(report: dict[str, Any]) -> str:
    """A short text report of :func:`gradient_flow`: counts, then every dead parameter by kind."""
    lines = [
        f"training loss {report['loss']:.4g}; {report['num_trainable']} trainable parameter tensors, "
        f"{len(report['frozen'])} frozen",
    ]
    for key, label in (("no_grad", "no gradient (grad is None)"), ("zero_grad", "all-zero gradient")):
        if report[key]:
            lines.append(f"{len(report[key])} with {label}:")
            lines += [f"  {name}" for name in report[key]]
    lines.append(
        f"DEAD: {len(report['dead'])} parameter tensors get no gradient"
        if report["dead"]
        else "every parameter gets a gradient"
    )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------------------
# Distance from a fresh initialisation
# -------------------------------------------------------------------------------------------------------------------
def _mean_std(t: torch.Tensor) -> tuple[float, float]:
    t = t.detach().double()
    return t.mean().item(), t.std(unbiased=False).item()


def _z(value: float, centre: float, spread: float) -> float:
    """``|value - centre|`` in units of ``spread``, floored so that a spread of zero still gives a finite number."""
    return abs(value - centre) / max(spread, _SPREAD_FLOOR * max(1.0, abs(centre)))


def init_distance(
    model: nn.Module, make_fresh: Callable[[int], nn.Module], n_seeds: int = 5, k: float = 3.0
) -> dict[str, Any]:
    """Parameter tensors of ``model`` whose statistics cannot be told from a fresh initialisation (card, check 2).

    ``make_fresh(seed)`` builds the same architecture, freshly initialised from ``seed``; it is called for seeds
    ``0 .. n_seeds - 1``. For each parameter tensor the mean ``m`` and (population) standard deviation ``s`` of its
    entries are compared with their average over the fresh models; the unit is their spread across the seeds (the
    standard deviation over seeds, floored at ``1e-6 * max(1, |average|)`` for tensors every seed initialises to the
    same constants)::

        z_mean = |m - mean_seeds(m_i)| / spread(m_i)        z_std = |s - mean_seeds(s_i)| / spread(s_i)

    A tensor is *indistinguishable* when ``z_mean <= k`` and ``z_std <= k``: training left its statistics within
    the noise of the initialiser. An untouched tensor is always flagged; a trained one is flagged only if training
    moved it less than the seed-to-seed spread, so the check is sharp for large tensors and weak for tiny ones.

    Returns ``{"n_seeds", "k", "tensors": [{name, shape, numel, mean, std, init_mean, init_mean_spread, init_std,
    init_std_spread, z_mean, z_std, indistinguishable}], "indistinguishable": [names]}``.
    """
    if n_seeds < 2:
        raise ValueError(f"init_distance needs at least 2 fresh seeds to measure their spread, got n_seeds={n_seeds}")
    trained = dict(model.named_parameters())
    fresh_stats = _fresh_statistics(trained, make_fresh, n_seeds)
    rows = [_distance_row(name, param, fresh_stats[name], k) for name, param in trained.items()]
    return {
        "n_seeds": n_seeds,
        "k": k,
        "tensors": rows,
        "indistinguishable": [row["name"] for row in rows if row["indistinguishable"]],
    }


def _distance_row(name: str, param: torch.Tensor, fresh: list[tuple[float, float]], k: float) -> dict[str, Any]:
    """One tensor's row of :func:`init_distance`: its mean and std against the ``fresh`` seeds' ``(mean, std)``."""
    means = torch.tensor([m for m, _ in fresh], dtype=torch.float64)
    stds = torch.tensor([s for _, s in fresh], dtype=torch.float64)
    mean, std = _mean_std(param)
    init_mean, init_std = means.mean().item(), stds.mean().item()
    mean_spread, std_spread = means.std().item(), stds.std().item()
    z_mean, z_std = _z(mean, init_mean, mean_spread), _z(std, init_std, std_spread)
    return {
        "name": name,
        "shape": list(param.shape),
        "numel": param.numel(),
        "mean": mean,
        "std": std,
        "init_mean": init_mean,
        "init_mean_spread": mean_spread,
        "init_std": init_std,
        "init_std_spread": std_spread,
        "z_mean": z_mean,
        "z_std": z_std,
        "indistinguishable": z_mean <= k and z_std <= k,
    }


def _fresh_statistics(
    trained: dict[str, nn.Parameter], make_fresh: Callable[[int], nn.Module], n_seeds: int
) -> dict[str, list[tuple[float, float]]]:
    """Per parameter name, the mean and std of its entries in each of ``n_seeds`` fresh models."""
    stats: dict[str, list[tuple[float, float]]] = {name: [] for name in trained}
    for seed in range(n_seeds):
        fresh = dict(make_fresh(seed).named_parameters())
        if fresh.keys() != trained.keys() or any(fresh[n].shape != trained[n].shape for n in trained):
            raise ValueError(
                "make_fresh(seed) must build the same architecture as the trained model (same parameter names and "
                "shapes); rebuild it from the trained model's preset and constructor arguments"
            )
        for name, param in fresh.items():
            stats[name].append(_mean_std(param))
    return stats


def format_init_distance(report: dict[str, Any]) -> str:
    """A text table of the tensors :func:`init_distance` flags, then a one-line verdict."""
    flagged = [row for row in report["tensors"] if row["indistinguishable"]]
    lines = [
        f"{len(report['tensors'])} parameter tensors against {report['n_seeds']} fresh initialisations "
        f"(indistinguishable: mean and std within {report['k']:g} seed-spreads of a fresh init)"
    ]
    if flagged:
        width = max(len(row["name"]) for row in flagged)
        lines.append(f"{'tensor':<{width}}  {'numel':>8}  {'mean':>10}  {'init mean':>10}  {'std':>9}  {'init std':>9}")
        lines += [
            f"{row['name']:<{width}}  {row['numel']:>8}  {row['mean']:>10.3g}  {row['init_mean']:>10.3g}  "
            f"{row['std']:>9.3g}  {row['init_std']:>9.3g}"
            for row in flagged
        ]
        lines.append(f"FLAGGED: {len(flagged)} tensors cannot be told from a fresh initialisation")
    else:
        lines.append("every tensor moved away from its initialisation")
    return "\n".join(lines)

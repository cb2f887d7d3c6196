"""The benchmark of a preset (:func:`bench`, ``vitlab bench``) and its text report."""

from __future__ import annotations

import os
from typing import Any

import torch

from vitlab.acceleration import PrecisionChoice, check_compile_mode, choose_precision
from vitlab.bench.memory import peak_memory
from vitlab.bench.specs import PHASES, PRECISIONS, NetworkSpec, check_settings, timm_counterpart
from vitlab.bench.timing import Runner, measure_networks, round_ratio, torch_threads
from vitlab.config import OptimConfig
from vitlab.environment import environment as run_environment
from vitlab.errors import ConfigError
from vitlab.export import check_device
from vitlab.layers import attention_path

#: the networks a run compares ``ours`` with, each as ``ours_over_<name>``
COMPARED = ("timm", "ours_eager", "timm_compiled", "ours_no_checkpointing")


# -------------------------------------------------------------------------------------------------------------------
# The benchmark of a preset
def bench(
    model: str,
    *,
    overrides: dict[str, Any] | None = None,
    batch_size: int = 64,
    precision: str = "auto",
    compile: bool = False,
    compile_mode: str | None = None,
    compile_backend: str = "inductor",
    fused: bool | str = "auto",
    vs: str | None = None,
    threads: int | None = 1,
    repeats: int = 5,
    warmup: int = 2,
    sample_seconds: float = 0.5,
    matmul_size: int = 1024,
    device: str = "cpu",
    memory: bool = True,
    grad_checkpointing: bool = False,
) -> dict[str, Any]:
    """Benchmark the preset ``model`` (with keyword ``overrides``) alone or, with ``vs="timm"``, next to timm's.

    ``ours`` runs as ``vitlab fit`` trains: its dropout and attention path (:func:`vitlab.create_model`), the
    gradient-norm clipping of ``optim.grad_clip``'s default, AdamW with ``optim.fused=fused`` and, with
    ``compile``, its blocks compiled (``trainer.compile``, mode ``compile_mode``); ``timm`` runs as a timm user's
    script does by default: eager, torch's default AdamW, no clipping. With ``compile`` the run also times
    ``ours_eager`` and, with ``vs="timm"``, ``timm_compiled`` (``torch.compile`` of the whole network, same
    mode), all alternating in one process.

    With ``grad_checkpointing`` ``ours`` recomputes its blocks' activations in the backward pass
    (``trainer.grad_checkpointing``) and the run also times and measures ``ours_no_checkpointing``, the same network
    without, alternating.


    ``precision``: ``auto`` (the default, as ``vitlab fit``'s) resolves for ``device`` by
    :func:`vitlab.acceleration.choose_precision`; ``settings`` holds the precision used and ``precision_choice``
    the request and the reason.

    Returns the :func:`measure_networks` record with ``settings``, ``environment``, ``attention_paths`` (the paths
    :mod:`vitlab.layers.attention_path` chose in this process, with their timings), ``load_average``
    (``os.getloadavg()`` before and after), each network's ``description``, ``runner`` and ``peak_memory`` (when
    ``memory``; eager training steps), and the throughput ratios formed per round, ``{clock: {phase: summary}}``:
    ``ours_over_timm``, and with ``compile`` ``ours_over_ours_eager`` and ``ours_over_timm_compiled``, with
    ``grad_checkpointing`` ``ours_over_ours_no_checkpointing``.
    """
    if precision not in ("auto", *PRECISIONS):
        raise ConfigError(f"precision must be one of auto, {', '.join(PRECISIONS)}, got {precision!r}")
    choice = choose_precision(precision, torch.device(device).type)
    precision = choice.precision
    check_settings(batch_size=batch_size, precision=precision, repeats=repeats, warmup=warmup)
    if vs not in (None, "timm"):
        raise ConfigError(f"--vs compares with 'timm' only, got {vs!r}")
    check_compile_mode(compile_mode)
    check_device(device)
    overrides = dict(overrides or {})
    ours = NetworkSpec("vitlab", model, overrides)
    specs = {"ours": NetworkSpec("vitlab", model, overrides, grad_checkpointing=True) if grad_checkpointing else ours}
    compiled = dict(mode=compile_mode, backend=compile_backend)
    clip = OptimConfig().grad_clip
    eager = Runner(fused=fused, grad_clip=clip)
    runners = {"ours": Runner("blocks", fused=fused, grad_clip=clip, **compiled) if compile else eager}
    if compile:
        specs["ours_eager"], runners["ours_eager"] = specs["ours"], eager
    if grad_checkpointing:
        specs["ours_no_checkpointing"], runners["ours_no_checkpointing"] = ours, runners["ours"]
    if vs == "timm":
        specs["timm"], runners["timm"] = timm_counterpart(model, overrides), Runner()
        if compile:
            specs["timm_compiled"], runners["timm_compiled"] = specs["timm"], Runner(compile="model", **compiled)
    settings = dict(
        model=model,
        overrides=overrides,
        batch_size=batch_size,
        precision=precision,
        precision_choice=choice.record(),
        compile=compile,
        compile_mode=compile_mode,
        compile_backend=compile_backend,
        fused=fused,
        vs=vs,
        threads=threads,
        repeats=repeats,
        warmup=warmup,
        sample_seconds=sample_seconds,
        matmul_size=matmul_size,
        device=device,
        grad_checkpointing=grad_checkpointing,
    )
    load_before = os.getloadavg()
    with torch_threads(threads):
        peak = {
            name: peak_memory(spec, batch_size=batch_size, precision=precision, device=device, threads=threads)
            for name, spec in specs.items()
            if memory and name in ("ours", "timm", "ours_no_checkpointing")
        }
        networks = {}
        for name, spec in specs.items():
            torch.manual_seed(0)  # the compiled and the eager copy of a network start from the same weights
            networks[name] = spec.build()
        result = measure_networks(
            networks,
            batch_size=batch_size,
            precision=precision,
            device=device,
            runners=runners,
            repeats=repeats,
            warmup=warmup,
            sample_seconds=sample_seconds,
            matmul_size=matmul_size,
        )
        environment = run_environment()
    for name, spec in specs.items():
        objective = result["networks"][name]["objective"]
        loss = "" if objective == "cross_entropy" else f", loss {objective}"
        result["networks"][name]["description"] = f"{spec.describe()}, {runners[name].describe()}{loss}"
        result["networks"][name]["spec"] = {
            "source": spec.source,
            "name": spec.name,
            "kwargs": spec.kwargs,
            "grad_checkpointing": spec.grad_checkpointing,
        }
        if name in peak:
            result["networks"][name]["peak_memory"] = peak[name]
    for other in COMPARED:
        if other in specs:
            result[f"ours_over_{other}"] = {
                clock: {phase: round_ratio(result, "ours", other, phase, clock) for phase in PHASES}
                for clock in result["clocks"]
            }
    return {
        "benchmark": "bench",
        "settings": settings,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "environment": environment,
        "attention_paths": attention_path.decisions(),
        **result,
    }


def format_bench(result: dict[str, Any]) -> str:
    """A short text table of a :func:`bench` record: medians with [min, max] over the rounds, per clock."""
    s = result["settings"]
    lines = [PrecisionChoice(**s["precision_choice"]).line()] if "precision_choice" in s else []
    lines += [
        f"{s['model']} {s['overrides'] or ''} batch {s['batch_size']}, {s['precision']}, threads {s['threads']}, "
        f"{s['repeats']} rounds; load average {result['load_average']['before'][0]:.2f} -> "
        f"{result['load_average']['after'][0]:.2f}"
    ]
    lines += [f"  {name}: {net.get('description', name)}" for name, net in result["networks"].items()]
    for clock in result["clocks"]:
        peak = result["matmul_peak"]["flops_per_s"][clock]
        lines += [
            f"[{clock} clock] matmul peak ({result['matmul_peak']['size']}^2, {s['precision']}): "
            f"{peak['median'] / 1e9:.1f} GFLOP/s [{peak['min'] / 1e9:.1f}, {peak['max'] / 1e9:.1f}]",
            f"  {'network':<14} {'params':>9} {'GFLOP/img':>9} {'train img/s':>18} {'MFU':>6} "
            f"{'infer img/s':>20} {'MFU':>6} {'peak MiB':>9}",
        ]
        for name, net in result["networks"].items():
            train, infer = net["train"][clock], net["inference"][clock]
            memory = net.get("peak_memory", {}).get("mib")
            lines.append(
                f"  {name:<14} {net['parameters'] / 1e6:>8.2f}M "
                f"{net['flops_per_image']['forward'] / 1e9:>9.3f} {_spread(train['images_per_s']):>18} "
                f"{train['mfu']['median']:>6.1%} {_spread(infer['images_per_s']):>20} {infer['mfu']['median']:>6.1%} "
                f"{'-' if memory is None else f'{memory:.0f}':>9}"
            )
        for other in COMPARED:
            for phase, ratio in result.get(f"ours_over_{other}", {}).get(clock, {}).items():
                lines.append(
                    f"  ours / {other}, {phase}: {ratio['median']:.3f} (IQR {ratio['q1']:.3f}-{ratio['q3']:.3f}, "
                    f"range {ratio['min']:.3f}-{ratio['max']:.3f})"
                )
    return "\n".join(lines)


def _spread(summary: dict[str, float]) -> str:
    return f"{summary['median']:.1f} [{summary['min']:.1f}-{summary['max']:.1f}]"

"""The benchmark of a preset (:func:`bench`, ``vitlab bench``) and its text report."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import torch

from vitlab.acceleration.compiling import check_compile_mode
from vitlab.acceleration.precision import PrecisionChoice, choose_precision
from vitlab.bench.memory import peak_memory
from vitlab.bench.specs import PHASES, PRECISIONS, NetworkSpec, check_settings, timm_counterpart
from vitlab.bench.timing import Runner, measure_networks, round_ratio, torch_threads
from vitlab.config import OptimConfig
from vitlab.environment import environment as run_environment
from vitlab.errors import ConfigError
from vitlab.export import check_device
from vitlab.layers import attention_path
from vitlab.progress import stage

#: the networks a run compares ``ours`` with, each as ``ours_over_<name>``
COMPARED = ("timm", "ours_eager", "timm_compiled", "ours_no_checkpointing")
#: the networks whose peak memory a run measures (the others are the same network run another way)
MEMORY_MEASURED = ("ours", "timm", "ours_no_checkpointing")
#: the settings that :func:`measure_networks` takes as they are
_MEASURE_SETTINGS = ("batch_size", "precision", "device", "repeats", "warmup", "sample_seconds", "matmul_size")


# -------------------------------------------------------------------------------------------------------------------
# The benchmark of a preset
def bench(
    model: str,
    *,
    overrides: dict[str, Any] | None = None,
    batch_size: int = 64,
    precision: str = "auto",
    compile: bool = False,
    compile_mode: str | None = "auto",
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

    ``ours`` runs as ``vitlab fit`` trains (its dropout and attention path, ``optim.grad_clip``'s default, AdamW with
    ``optim.fused=fused``, with ``compile`` compiled as ``trainer.compile`` does, in ``compile_mode``); ``timm`` as a
    timm user's script does (eager, torch's default AdamW, no clipping). With ``compile`` the run also times
    ``ours_eager`` and, with ``vs="timm"``, ``timm_compiled`` (``torch.compile`` of the network, the loss eager); with
    ``grad_checkpointing`` ``ours`` recomputes its blocks' activations and ``ours_no_checkpointing`` is timed beside
    it. ``precision`` ``auto`` resolves for ``device`` by :func:`vitlab.acceleration.precision.choose_precision`.

    Returns the :func:`measure_networks` record with ``settings`` (``precision_choice``: the request and the
    reason), ``load_average`` (before and after), ``environment``, ``attention_paths`` (the choices of
    :mod:`vitlab.layers.attention_path` in this process), each network's ``description``, ``spec``, ``runner`` and
    ``peak_memory`` (with ``memory``), and the per-round throughput ratios ``ours_over_<other>`` for the networks of
    :data:`COMPARED` that ran, ``{clock: {phase: summary}}``.

    Long because its body records each of its eighteen options by name in ``settings``.
    """
    choice = _check_options(precision, device, vs, compile_mode, batch_size=batch_size, repeats=repeats, warmup=warmup)
    settings = dict(
        model=model,
        overrides=dict(overrides or {}),
        batch_size=batch_size,
        precision=choice.precision,
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
    specs, runners = _networks(settings)
    return {"benchmark": "bench", "settings": settings, **_measure(specs, runners, settings, memory=memory)}


def _check_options(
    precision: str, device: str, vs: str | None, compile_mode: str | None, *, batch_size: int, repeats: int, warmup: int
) -> PrecisionChoice:
    """:func:`bench`'s options checked before anything is built; returns the precision ``precision`` resolves to."""
    if precision not in ("auto", *PRECISIONS):
        raise ConfigError(f"precision must be one of auto, {', '.join(PRECISIONS)}, got {precision!r}")
    choice = choose_precision(precision, torch.device(device).type)
    check_settings(batch_size=batch_size, precision=choice.precision, repeats=repeats, warmup=warmup)
    if vs not in (None, "timm"):
        raise ConfigError(f"--vs compares with 'timm' only, got {vs!r}")
    check_compile_mode(compile_mode)
    check_device(device)
    return choice


def _networks(settings: dict[str, Any]) -> tuple[dict[str, NetworkSpec], dict[str, Runner]]:
    """The networks a run of ``settings`` times and how each runs (:func:`bench`): ``ours`` and those of
    :data:`COMPARED` that the settings ask for."""
    s = settings
    ours = NetworkSpec("vitlab", s["model"], s["overrides"])
    checkpointed = NetworkSpec("vitlab", s["model"], s["overrides"], grad_checkpointing=True)
    specs = {"ours": checkpointed if s["grad_checkpointing"] else ours}
    compiled = dict(mode=s["compile_mode"], backend=s["compile_backend"])
    clip = OptimConfig().grad_clip
    eager = Runner(fused=s["fused"], grad_clip=clip)
    runners = {"ours": Runner("trainer", fused=s["fused"], grad_clip=clip, **compiled) if s["compile"] else eager}
    if s["compile"]:
        specs["ours_eager"], runners["ours_eager"] = specs["ours"], eager
    if s["grad_checkpointing"]:
        specs["ours_no_checkpointing"], runners["ours_no_checkpointing"] = ours, runners["ours"]
    if s["vs"] == "timm":
        specs["timm"], runners["timm"] = timm_counterpart(s["model"], s["overrides"]), Runner()
        if s["compile"]:
            specs["timm_compiled"], runners["timm_compiled"] = specs["timm"], Runner(compile="model", **compiled)
    return specs, runners


def _measure(
    specs: dict[str, NetworkSpec], runners: dict[str, Runner], settings: dict[str, Any], *, memory: bool
) -> dict[str, Any]:
    """Peak memory (with ``memory``), then the alternating timing of the networks (:func:`measure_networks`), with
    the machine's load average before and after, its environment and the per-round ratios of ``ours``."""
    s = settings
    load_before = os.getloadavg()
    with torch_threads(s["threads"]):
        if memory:
            stage(f"vitlab bench: peak memory of {', '.join(n for n in specs if n in MEMORY_MEASURED)}")
        peak = {
            name: peak_memory(
                spec, batch_size=s["batch_size"], precision=s["precision"], device=s["device"], threads=s["threads"]
            )
            for name, spec in specs.items()
            if memory and name in MEMORY_MEASURED
        }
        networks = {}
        stage(f"vitlab bench: building {', '.join(specs)} and counting their FLOPs")
        for name, spec in specs.items():
            torch.manual_seed(0)  # the compiled and the eager copy of a network start from the same weights
            networks[name] = spec.build()
        result = measure_networks(networks, runners=runners, **{key: s[key] for key in _MEASURE_SETTINGS})
        environment = run_environment()
    for name, spec in specs.items():
        network = result["networks"][name]
        loss = "" if network["objective"] == "cross_entropy" else f", loss {network['objective']}"
        network["description"] = f"{spec.describe()}, {runners[name].describe()}{loss}"
        network["spec"] = asdict(spec)
        if name in peak:
            network["peak_memory"] = peak[name]
    for other in COMPARED:
        if other in specs:
            result[f"ours_over_{other}"] = {
                clock: {phase: round_ratio(result, "ours", other, phase, clock) for phase in PHASES}
                for clock in result["clocks"]
            }
    return {
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

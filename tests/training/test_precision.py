"""``trainer.precision: auto``: bf16-mixed where the processor computes bf16 natively, 32-true elsewhere; an explicit
precision wins; the choice is the run's first line and is recorded in ``env.json``; an old run resumes as it was."""

from __future__ import annotations

import json

import pytest

from run_fixtures import TINY
from vitlab.acceleration.precision import bf16_matmul_speedup, choose_precision, cpu_bf16_flags
from vitlab.cli.main import main
from vitlab.config import ConfigError, TrainerConfig


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n\nprocessor\t: 1\nflags\t\t: fpu {flags}\n")
    return path


@pytest.mark.parametrize(
    ("flags", "found"),
    [
        ("avx512f amx_tile amx_bf16 avx512_bf16", ("amx_bf16", "avx512_bf16")),
        ("avx512_bf16", ("avx512_bf16",)),
        ("", ()),
    ],
)
def test_cpu_bf16_flags_are_read_from_cpuinfo(tmp_path, flags, found):
    assert cpu_bf16_flags(_cpuinfo(tmp_path, flags)) == found


def test_auto_is_bf16_with_amx_and_with_avx512_bf16_only_where_bf16_measured_faster():
    assert choose_precision("auto", "cpu", cpu_flags=("amx_bf16", "avx512_bf16"), bf16_speedup=0.5).line() == (
        "precision bf16-mixed (auto: CPU has amx_bf16)"
    )
    faster = choose_precision("auto", "cpu", cpu_flags=("avx512_bf16",), bf16_speedup=2.6)
    assert faster.precision == "bf16-mixed" and "a bf16 matmul ran 2.60x the fp32 one" in faster.reason
    slower = choose_precision("auto", "cpu", cpu_flags=("avx512_bf16",), bf16_speedup=0.5)
    assert slower.precision == "32-true" and "0.50x" in slower.reason
    emulated = choose_precision("auto", "cpu", cpu_flags=())
    assert emulated.precision == "32-true" and "emulated" in emulated.reason


def test_the_bf16_speedup_is_measured_once_per_process():
    first = bf16_matmul_speedup()
    assert first > 0 and bf16_matmul_speedup() == first


def test_an_explicit_precision_wins():
    for precision in ("32-true", "bf16-mixed", "16-mixed"):
        device = "cuda" if precision == "16-mixed" else "cpu"
        choice = choose_precision(precision, device, cpu_flags=("amx_bf16",) if precision == "32-true" else ())
        assert choice.precision == precision and choice.reason == "set explicitly"


def test_fp16_on_a_cpu_is_said_to_be_bf16_in_the_first_line_not_by_lightnings_warning(tmp_path, capsys, caplog):
    choice = choose_precision("16-mixed", "cpu")
    assert choice.precision == "bf16-mixed" and "fp16 autocast does not run on a CPU" in choice.reason
    run_dir = tmp_path / "run"
    argv = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *TINY, "run.export=false"]
    with caplog.at_level("INFO"):
        assert main([*argv, "trainer.precision=16-mixed"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "precision bf16-mixed (set explicitly; fp16 autocast does not run on a CPU)"
    lightning = [r.getMessage() for r in caplog.records] + err.splitlines()
    assert not [line for line in lightning if "Automatic Mixed Precision" in line or "precision=" in line], lightning


def test_a_warning_reaches_the_terminal_of_a_command_as_one_line(monkeypatch, capsys):
    import sys
    import warnings

    from vitlab.cli import main as cli

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after the test
    monkeypatch.setattr(sys, "argv", ["vitlab", "list-models"])
    assert cli.main() == 0
    assert warnings.showwarning is cli.one_line_warning
    cli.one_line_warning(UserWarning("a thing happened\nsecond line"), UserWarning, "/x/lib.py", 3)
    assert capsys.readouterr().err == "vitlab: warning: a thing happened\n"
    cli.one_line_warning(FutureWarning("old name"), FutureWarning, "/x/lib.py", 3)  # a name going away says so
    assert capsys.readouterr().err == "vitlab: warning: old name (FutureWarning)\n"


def test_the_config_accepts_auto_and_names_the_choices_for_a_typo():
    assert TrainerConfig().precision == "auto"
    assert TrainerConfig(precision="bf16-mixed").precision == "bf16-mixed"
    with pytest.raises(ConfigError, match="trainer.precision must be auto or one of .*32-true.*got 'bf16-mxed'"):
        TrainerConfig(precision="bf16-mxed")


def test_fit_prints_the_choice_first_and_records_it_and_an_fp32_run_resumes_as_fp32(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["fit", "--config", "vit/digits", f"run.dir={run_dir}", *TINY, "run.export=false", "run.test=false"]
    assert main([*args, "trainer.max_epochs=1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    expected = choose_precision("auto", "cpu")
    assert first == expected.line()
    assert json.loads((run_dir / "env.json").read_text())["precision"] == expected.record()

    old = tmp_path / "old"  # a run of before `auto`: its config.yaml stores 32-true
    old_args = ["fit", "--config", "vit/digits", f"run.dir={old}", *TINY, "run.export=false", "run.test=false"]
    assert main([*old_args, "trainer.max_epochs=1", "trainer.precision=32-true"]) == 0
    capsys.readouterr()
    assert main(["fit", "--resume", str(old), "trainer.max_epochs=2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "precision 32-true (set explicitly)" and "resuming from" in out

"""Measured choices kept per machine (``vitlab.machine_cache``, issue 45): the same seed on the same machine gives
the same metrics however the timings of ``trainer.attention_path: auto`` and ``trainer.precision: auto`` come out."""

import json
import os

import pytest

from run_fixtures import TINY
from vitlab import machine_cache
from vitlab.acceleration import precision
from vitlab.cli.main import main
from vitlab.layers import attention_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(machine_cache.ENV_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache" / machine_cache.FILE_NAME


def test_the_first_value_is_kept_and_read_back(cache):
    assert machine_cache.remembered("s", "case", lambda: 1) == 1
    assert machine_cache.remembered("s", "case", lambda: 2) == 1  # not measured again
    assert machine_cache.remembered("s", "other", lambda: 2) == 2
    assert len(json.loads(cache.read_text())) == 2


def test_off_measures_every_time(monkeypatch):
    monkeypatch.setenv(machine_cache.ENV_VARIABLE, "off")
    assert [machine_cache.remembered("s", "case", lambda v=v: v) for v in (1, 2)] == [1, 2]


def test_an_unwritable_cache_measures_and_says_so(tmp_path, monkeypatch, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(machine_cache.ENV_VARIABLE, str(blocked))  # a file where the folder should be
    assert machine_cache.remembered("s", "case", lambda: 3) == 3
    assert "measuring in this process only" in caplog.text


def _clock(faster_late: bool):
    """A fake CPU clock: each call ``n`` advances by ``1 / n`` (the later candidate looks faster) or by ``n``."""
    state = {"t": 0.0, "n": 0}

    def clock() -> float:
        state["n"] += 1
        state["t"] += 1 / state["n"] if faster_late else state["n"]
        return state["t"]

    return lambda: clock


def _fit(tmp_path, name, clock, monkeypatch):
    monkeypatch.setattr(attention_path, "cpu_clock", clock)
    monkeypatch.setattr(precision, "cpu_clock", clock)
    attention_path.clear_decisions()  # as in a new process
    precision.bf16_matmul_speedup.cache_clear()
    run = tmp_path / name
    assert main(["fit", "--config", "vit/digits", f"run.dir={run}", "trainer.max_epochs=1", *TINY]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in line.items() if not k.startswith("time/")} for line in lines]  # times differ
    paths = [d["path"] for d in json.loads((run / "attention_paths.json").read_text())["decisions"]]
    return metrics, paths


def test_one_fit_twice_under_other_timings_gives_the_same_metrics_bit_for_bit(tmp_path, cache, monkeypatch):
    first = _fit(tmp_path, "a", _clock(faster_late=True), monkeypatch)
    second = _fit(tmp_path, "b", _clock(faster_late=False), monkeypatch)
    assert first == second
    # without the cache the two timings choose other kernels: the check above is not vacuous
    monkeypatch.setenv(machine_cache.ENV_VARIABLE, "off")
    assert (
        _fit(tmp_path, "c", _clock(faster_late=True), monkeypatch)[1]
        != _fit(tmp_path, "d", _clock(faster_late=False), monkeypatch)[1]
    )
    assert os.path.isfile(cache)

"""The attention kernels of a run: measured (``trainer.attention_path: auto``) or fixed, recorded in the run's
``attention_paths.json``, and taken up again by ``--resume`` so a resumed run rounds as it did before."""

from __future__ import annotations

import json

from run_fixtures import TINY
from vitlab.cli.main import main
from vitlab.layers import attention_path
from vitlab.rundir import ATTENTION_PATHS_FILE


def test_the_config_paths_are_the_layer_paths():
    from vitlab.config import ATTENTION_PATHS

    assert ("auto", *attention_path.PATHS) == ATTENTION_PATHS


def test_a_fixed_path_is_used_for_every_call_and_recorded(tmp_path):
    run = tmp_path / "math"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run}", "trainer.attention_path=math", *TINY]) == 0
    record = json.loads((run / ATTENTION_PATHS_FILE).read_text())
    assert record["forced"] == "math"
    assert attention_path.forced_path() is None  # the process is left as it was


def test_a_bad_path_is_refused_before_any_folder_exists(tmp_path, capsys):
    run = tmp_path / "bad"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run}", "trainer.attention_path=flash", *TINY]) == 2
    assert "trainer.attention_path must be one of auto, sdpa, math, eager, got 'flash'" in capsys.readouterr().err
    assert not run.exists()


def test_a_resumed_run_takes_up_the_paths_it_measured(tmp_path):
    run = tmp_path / "auto"
    assert main(["fit", "--config", "vit/digits", f"run.dir={run}", "trainer.max_epochs=1", *TINY]) == 0
    file = run / ATTENTION_PATHS_FILE
    record = json.loads(file.read_text())
    assert record["forced"] is None and record["decisions"]
    assert {d["path"] for d in record["decisions"]} <= set(attention_path.PATHS)
    # mark the recorded choices: a resume that measured again would write its own timings instead
    for decision in record["decisions"]:
        decision["path"], decision["seconds"] = "eager", {"recorded": 1.0}
    file.write_text(json.dumps(record))
    attention_path.clear_decisions()  # as in a fresh process
    assert main(["fit", "--resume", str(run), "trainer.max_epochs=2"]) == 0
    resumed = {(*tuple(d["shape"]), d["backward"]): d for d in json.loads(file.read_text())["decisions"]}
    for decision in record["decisions"]:
        again = resumed[(*tuple(decision["shape"]), decision["backward"])]
        assert again["path"] == "eager" and again["seconds"] == {"recorded": 1.0}

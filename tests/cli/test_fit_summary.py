"""The lines ``vitlab fit`` prints when a run ends: the data path named when the training waited for it."""

from __future__ import annotations

import json

import pytest

from vitlab.cli.main import DATA_WAIT_NOTE, _print_summary


@pytest.mark.parametrize(("share", "said"), [(0.33, True), (DATA_WAIT_NOTE, True), (0.05, False), (None, False)])
def test_the_summary_names_a_data_path_that_held_the_training_back(tmp_path, capsys, share, said):
    if share is not None:
        (tmp_path / "timing.json").write_text(json.dumps({"data_wait_share": share, "epochs": 2}))
    _print_summary(tmp_path)
    out = capsys.readouterr().out
    assert out.startswith(f"run directory: {tmp_path}")
    line = [text for text in out.splitlines() if text.startswith("data: ")]
    assert bool(line) is said
    if said:
        assert f"{share:.0%} of its epochs" in line[0] and "data.num_workers=1" in line[0]

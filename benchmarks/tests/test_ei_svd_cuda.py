"""benchmarks/micro/ei_svd_cuda.py: the four ways to the assignment matrices' singular values agree, and its dry run
writes its record on the CPU."""

import json

import pytest
import torch

from benchmarks.micro import ei_svd_cuda


@pytest.mark.parametrize("way", list(ei_svd_cuda.WAYS))
def test_every_way_gives_the_singular_values_and_their_gradient(way):
    S = ei_svd_cuda.assignment(3, 40, 8, torch.Generator().manual_seed(0)).float()
    weight = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    error = ei_svd_cuda.errors(ei_svd_cuda.WAYS[way], S, weight)
    assert error["values"] < 1e-5 and error["gradient"] < 1e-3
    assert torch.allclose(S.sum(-1), torch.ones(3, 40))  # row-stochastic, three slots a token
    assert ((S > 0).sum(-1) == 3).all()


def test_the_dry_run_writes_a_record_and_refuses_to_overwrite_it(tmp_path):
    out = tmp_path / "ei_svd.json"
    assert ei_svd_cuda.main(["--dry-run", "--out", str(out), "--tokens", "64", "--slots", "8"]) == 0
    record = json.loads(out.read_text())
    assert [r["way"] for r in record["rows"]] == list(ei_svd_cuda.WAYS)
    assert record["environment"]["hardware"] and all(r["ms_median"] > 0 for r in record["rows"])
    with pytest.raises(SystemExit, match="exists"):
        ei_svd_cuda.main(["--dry-run", "--out", str(out)])

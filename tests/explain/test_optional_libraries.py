"""Every explanation method with its optional library hidden (the ``explain`` extra: captum, pytorch-grad-cam): it
works without it, or it is refused with one ``MissingLibraryError`` line that names the install, never a raw
ImportError; ``vitlab explain`` then exits 2 with that line."""

from __future__ import annotations

import sys

import pytest
import torch

import vitlab
from run_fixtures import make_run, write_png
from vitlab.cli.main import main
from vitlab.errors import MissingLibraryError
from vitlab.explain import explain
from vitlab.explain.adapters import CAPTUM_METHODS, METHODS

#: method -> the library of the ``explain`` extra it needs (by import name); the other methods need none
NEEDS = {"gradcam": "pytorch_grad_cam", **dict.fromkeys(CAPTUM_METHODS, "captum")}
OPTIONAL = set(NEEDS.values())


@pytest.fixture
def hidden(monkeypatch):
    """The optional libraries made unimportable (``None`` in ``sys.modules``), submodules already imported too."""
    for name in [m for m in sys.modules if m.split(".")[0] in OPTIONAL] + list(OPTIONAL):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("method", METHODS)
def test_each_method_works_or_is_refused_in_one_line_without_its_library(method, hidden):
    torch.manual_seed(0)
    model = vitlab.create_model("vit_pico", img_size=8, patch_size=2, in_chans=1, num_classes=3).eval()
    images = torch.randn(2, 1, 8, 8)
    if method not in NEEDS:
        assert explain(model, images, method=method).maps.shape[0] == 2
        return
    with pytest.raises(MissingLibraryError) as error:
        explain(model, images, method=method)
    assert str(error.value) == f"this explanation method needs {NEEDS[method]}; pip install 'vitlab[explain]'"


def test_the_command_refuses_a_method_whose_library_is_missing_in_one_line(hidden, tmp_path, capsys):
    run = make_run(tmp_path)
    write_png(tmp_path / "a.png", shape=(8, 8))
    args = ["explain", str(run), str(tmp_path / "a.png"), "--method", "integrated_gradients"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("vitlab explain: error: this explanation method needs captum; pip install 'vitlab[explain]'"), err
    assert not (tmp_path / "out").exists()

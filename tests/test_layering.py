"""The import-time promises of the layering (the contracts themselves are import-linter's, in pyproject.toml and
checked by `make lint`): the configuration, the run directory and the command's parser load no deep-learning
library, and every registered model builds on the meta device (the sizing code's way of counting parameters)."""

import pytest
import torch

from process_fixtures import loaded_after
from vitlab.models.builder import create_model
from vitlab.testing import builtin_presets


def test_config_rundir_and_the_parser_load_no_deep_learning_library():
    assert loaded_after("import vitlab, vitlab.config, vitlab.rundir, vitlab.data.config") == []
    code = "import vitlab.cli.main as m\nparser, _ = m.build_parser(['--help'])\nparser.format_help()"
    assert loaded_after(code) == []
    assert "torch" in loaded_after("import vitlab\nvitlab.create_model")  # the lazy names do load on use


@pytest.mark.parametrize("name", builtin_presets())
def test_every_preset_builds_on_the_meta_device(name):
    with torch.device("meta"):
        model = create_model(name)
    assert all(p.is_meta for p in model.parameters())

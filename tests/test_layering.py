"""The import-time promises of the layering (the contracts themselves are import-linter's, in pyproject.toml and
checked by `make lint`): the configuration, the run directory and the command's parser load no deep-learning
library, every registered model builds on the meta device (the sizing code's way of counting parameters), and the
library's tests import no benchmark (issue 62): what a test needs is library code, or the test is a benchmark's own
smoke test and lives in benchmarks/tests."""

import ast
from pathlib import Path

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


def imported_packages(source: str) -> set[str]:
    """The top-level packages a module imports (``import a.b``, ``from a.b import c``; relative imports left out)."""
    packages = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            packages |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.partition(".")[0])
    return packages


def test_no_library_test_imports_the_benchmark_suite():
    tests = Path(__file__).parent
    offenders = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if "benchmarks" in imported_packages(path.read_text())
    )
    assert not offenders, f"move what they import into src, or them into benchmarks/tests: {offenders}"


def test_the_import_check_sees_every_form_of_import():
    source = "import os, benchmarks.micro as m\nfrom benchmarks.x import y\nfrom . import z\ndef f():\n    import torch"
    assert imported_packages(source) == {"os", "benchmarks", "torch"}

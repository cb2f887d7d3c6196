"""Installing a plug-in family the way pip does, for a fresh interpreter: a ``*.dist-info`` folder whose
``entry_points.txt`` names the package in the group ``vitlab.families``, on the ``PYTHONPATH`` of that interpreter."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).parents[1]
#: the toy MLP-Mixer family (tests/plugins/vitlab_toy_mixer)
PLUGINS = ROOT / "tests" / "plugins"


def install_plugin(site: Path, dist: str, entry_point: str, value: str, files: dict[str, str] | None = None) -> Path:
    """Declare ``entry_point = value`` of the distribution ``dist`` in ``site`` and write ``files`` (path relative to
    ``site`` -> source) beside it; returns ``site``."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vitlab.families]\n{entry_point} = {value}\n")
    for path, source in (files or {}).items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(source)
    return site


def plugin_env(site: Path, **extra: str) -> dict[str, str]:
    """The environment of a Python that sees this tree's vitlab, ``site`` and the toy plug-ins' sources."""
    path = os.pathsep.join([str(ROOT / "src"), str(site), str(PLUGINS)])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def toy_mixer_env(tmp_path: Path) -> dict[str, str]:
    """A Python whose site holds the toy MLP-Mixer's distribution."""
    return plugin_env(install_plugin(tmp_path / "site", "vitlab-toy-mixer", "toy_mixer", "vitlab_toy_mixer"))

"""Test-suite settings: tiny models gain nothing from threads, and on a shared 2-core machine a second OpenMP
thread waiting for a busy core makes small ops dozens of times slower (see docs/benchmarks.md). Each test runs in
its own temporary folder, so a run folder (`runs/...`), a report (`./report.html`) or a dataset a test writes
never lands in the repository."""

import os

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
torch.set_num_threads(1)
os.environ.setdefault("VITLAB_TEST", "1")
# measured choices are timed in each process, as without the cache (vitlab.machine_cache): a test that forces a
# timing must not meet another test's kept choice, nor write into the user's cache; tests of the cache set a folder
os.environ.setdefault("VITLAB_CACHE_DIR", "off")


@pytest.fixture(autouse=True)
def _in_own_folder(tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))

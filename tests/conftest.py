"""Test-suite settings: tiny models gain nothing from threads, and on a shared 2-core machine a second OpenMP
thread waiting for a busy core makes small ops dozens of times slower (see docs/benchmarks.md)."""

import os

import matplotlib
import torch

matplotlib.use("Agg")
torch.set_num_threads(1)
os.environ.setdefault("VITLAB_TEST", "1")

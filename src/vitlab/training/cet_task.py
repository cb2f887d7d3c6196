"""The CET-ViT task: moved to its family, :mod:`vitlab.families.cet_vit.task`;
this path names the same module (old imports keep working)."""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("vitlab.families.cet_vit.task")

"""The ViTCAE generative tasks: moved to its family, :mod:`vitlab.families.vitcae.generative`;
this path names the same module (old imports keep working)."""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("vitlab.families.vitcae.generative")

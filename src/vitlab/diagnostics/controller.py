"""The attention-dynamics controller: moved to its own package, :mod:`vitlab.dynamics`; this path names the same
module (old imports keep working)."""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("vitlab.dynamics")

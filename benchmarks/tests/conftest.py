"""The library suite's settings (one thread, the Agg backend, no machine cache, each test in its own folder) for the
benchmarks' smoke tests too."""

from tests.conftest import _in_own_folder  # noqa: F401

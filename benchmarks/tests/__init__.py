"""The benchmark suite's own smoke tests: each script, driver and report generator of ``benchmarks`` on a test's
size. The library's tests (``tests/``) never import ``benchmarks``; pytest runs both (pyproject.toml, testpaths)."""

"""The benchmark suite: micro-benchmarks, experiment drivers and the reports made from their results files.

- ``benchmarks.micro``: timings of one piece (a layer, a step, a solver) on this machine, one results file each.
- ``benchmarks.experiments``: drivers that train or evaluate runs, and the per-run records they keep.
- ``benchmarks.reports``: tables, pages and claims computed from the results files, without training.
- ``benchmarks.tests``: the suite's own smoke tests, on a test's size (pytest runs them with the library's).

Each script runs as ``python -m benchmarks.<kind>.<name>`` or ``python benchmarks/<kind>/<name>.py`` from the
repository root; results go to ``benchmarks/results/<kind>/``."""

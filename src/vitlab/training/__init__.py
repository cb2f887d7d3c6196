"""Lightning tasks (``tasks``), callbacks and the fit/evaluate orchestration (``run``). The families' tasks live in
their packages (``vitlab.families``)."""

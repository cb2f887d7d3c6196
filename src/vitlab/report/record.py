"""What a report reads of a run directory: :class:`RunRecord`, loaded once, for the run's page and comparisons."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.config import RunConfig
from vitlab.report.page import PNG_SIGNATURE
from vitlab.rundir import (
    CONFIG_FILE,
    ENV_FILE,
    EVALUATION_DIR,
    EVALUATION_FILE,
    GENERATE_DIR,
    GENERATE_METRICS_FILE,
    METRICS_FILE,
    STEPS_FILE,
    TEST_METRICS_FILE,
    RunDir,
)


@dataclass
class RunRecord:
    """What a report reads from one run directory (each entry None or empty when the run does not have it)."""

    path: Path
    config: RunConfig
    config_text: str
    env: dict[str, Any] | None
    metrics: list[dict[str, Any]]
    test_metrics: dict[str, float] | None
    steps: list[dict[str, Any]]
    generate_metrics: dict[str, float] | None
    evaluation: dict[str, Any] | None
    final_metrics: dict[str, float] = field(default_factory=dict)
    stale_evaluation: bool = False
    name: str = ""
    used_files: set[Path] = field(default_factory=set)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        run = RunDir(run_dir)
        record = cls(
            path=run.path,
            config=run.config(),
            config_text=run.config_file.read_text(),
            env=run.env(),
            metrics=run.metrics(),
            test_metrics=run.test_metrics(),
            steps=run.steps(),
            generate_metrics=run.generate_metrics(),
            evaluation=run.current_evaluation(),  # one of an earlier model of the run is labelled, not shown
            stale_evaluation=run.current_evaluation() is None and run.evaluation() is not None,
            final_metrics=run.final_metrics(),
            name=run.path.resolve().name,
        )
        record.use(CONFIG_FILE, ENV_FILE, METRICS_FILE, STEPS_FILE, TEST_METRICS_FILE)
        record.use(f"{GENERATE_DIR}/{GENERATE_METRICS_FILE}", f"{EVALUATION_DIR}/{EVALUATION_FILE}")
        return record

    def use(self, *relative: str | Path) -> None:
        """Mark files as shown, so that the 'other outputs' section does not show them again."""
        self.used_files.update((self.path / r).resolve() for r in relative)

    def png(self, relative: str | Path) -> bytes | None:
        """The bytes of a PNG in the run directory (marked as shown), or None if the file is absent or no PNG."""
        file = self.path / relative
        if not file.is_file():
            return None
        self.use(relative)
        data = file.read_bytes()
        if not data.startswith(PNG_SIGNATURE):
            warnings.warn(f"report: {file} left out: not a PNG file (no PNG signature)", stacklevel=2)
            return None
        return data

    @property
    def model_name(self) -> str:
        return str(self.config.model.get("name", "?"))

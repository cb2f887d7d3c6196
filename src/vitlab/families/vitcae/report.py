"""The ViTCAE family's section of the run report: the grids and numbers of ``vitlab generate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.report.page import Facts, Figure, Figures, Section
from vitlab.report.record import RunRecord
from vitlab.rundir import GENERATE_DIR

#: the ViTCAE grids of ``generate/`` (the files of ``vitlab.families.vitcae.pieces.GRID_FILES``) and their captions
GRID_CAPTIONS = {
    "reconstruction": "Reconstruction: test images and their reconstructions.",
    "conditional": "Class-conditional samples, one row per class.",
    "interpolation": "Interpolation of the class latent between two test images of different classes.",
    "inpainting": "Inpainting of randomly masked patches.",
}


def generate_section(run: RunRecord) -> Section | None:
    from vitlab.families.vitcae.pieces import GRID_FILES

    figures = []
    for task, file in GRID_FILES.items():
        png = run.png(Path(GENERATE_DIR) / file)
        if png:
            figures.append(Figure(GRID_CAPTIONS.get(task, task), png=png, wide=task == "reconstruction"))
    if not figures and not run.generate_metrics:
        return None
    blocks: list[Any] = [Facts(dict(run.generate_metrics))] if run.generate_metrics else []
    return Section("generate", "Generative tasks", [*blocks, Figures(figures)])

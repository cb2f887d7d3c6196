"""The data of a report page: blocks (plots, figures, text, facts, tables, details), sections and the page. Plain
dataclasses; :mod:`vitlab.report.collect` fills them from run directories, :mod:`vitlab.report.render` renders them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ATTENTION_IMAGES = 4  # test images whose attention maps and segment maps are shown
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_JSON_BYTES = 100_000  # discovered JSON files up to this size are shown in full
SKIPPED_DIRS = frozenset({"tb", "checkpoints", "export", "lightning_logs"})
#: metrics whose best value is the largest (bold in the comparison table); ``LOWER_IS_BETTER`` the smallest
HIGHER_IS_BETTER = ("acc", "accuracy", "top1", "top5", "psnr", "ssim", "psnr_gain", "mean_corrupted")
LOWER_IS_BETTER = ("loss", "nll", "ece", "mse")
#: final metrics left out of the comparison table (per-severity corruption numbers, the validation halves)
DETAIL_METRICS = ("eval/corruptions/", "eval/calibration/")
DYNAMICS_CAPTIONS = {
    "dynamics.png": "Drift d of each head's CLS attention between epochs (top) and consensus clusters (bottom).",
    "temperature.png": "Temperature tau of every head over the epochs.",
    "frozen.png": "Epoch at which each head was frozen.",
    "comparison.png": "Baseline (left) and this run (right).",
}


@dataclass
class Plot:
    """A figure to draw: ``kind`` names a drawing of :data:`vitlab.report.figures.DRAWINGS`, ``data`` its input."""

    kind: str
    data: dict[str, Any]


@dataclass
class Figure:
    """One image: ``png`` (bytes of a file in the run) or ``plot`` (drawn when the page is rendered)."""

    caption: str = ""
    png: bytes | None = None
    plot: Plot | None = None
    wide: bool = True  # full width, or in a two-column grid with the other narrow figures of its block


@dataclass
class Text:
    """Text: a paragraph, a ``heading`` of a part of a section, or ``pre``-formatted (a file's content)."""

    kind: ClassVar[str] = "text"

    text: str
    style: str = "paragraph"  # paragraph | heading | pre


def Heading(text: str) -> Text:  # a block constructor, read like the classes beside it
    return Text(text, "heading")


def Pre(text: str) -> Text:
    return Text(text, "pre")


@dataclass
class Facts:
    """Name/value pairs; ``one_column`` for text values (the environment)."""

    kind: ClassVar[str] = "facts"

    values: dict[str, Any]
    one_column: bool = False


@dataclass
class Table:
    """``rows`` of cells under ``header``; ``bold`` holds ``(row, column)`` cells (the best value of a metric)."""

    kind: ClassVar[str] = "table"

    header: list[str]
    rows: list[tuple[Any, ...]]
    bold: set[tuple[int, int]] = field(default_factory=set)


@dataclass
class Figures:
    kind: ClassVar[str] = "figures"

    figures: list[Figure]


@dataclass
class Details:
    """A folded part: ``summary`` shown, ``blocks`` when opened."""

    kind: ClassVar[str] = "details"

    summary: str
    blocks: list[Any]
    open: bool = False


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Any]

    def find(self, kind: type) -> list[Any]:
        """Every block of type ``kind`` in the section, folded ones included, in order."""
        found = []
        for block in self.blocks:
            if isinstance(block, kind):
                found.append(block)
            if isinstance(block, Details):
                found += Section("", "", block.blocks).find(kind)
        return found

    @property
    def figures(self) -> list[Figure]:
        return [figure for block in self.find(Figures) for figure in block.figures]

    @property
    def text(self) -> str:
        """All the section's text, folded-part titles, table cells, fact names and values and figure captions, one
        string (for searching)."""
        parts = [b.text for b in self.find(Text)]
        parts += [details.summary for details in self.find(Details)]
        for facts in self.find(Facts):
            parts += [f"{k} {v}" for k, v in facts.values.items()]
        for table in self.find(Table):
            parts += [" ".join(map(str, table.header))] + [" ".join(map(str, row)) for row in table.rows]
        parts += [figure.caption for figure in self.figures]
        return "\n".join(parts)


@dataclass
class Page:
    title: str
    subtitle: str
    sections: list[Section]
    cards: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def section_ids(self) -> list[str]:
        return [section.id for section in self.sections]

    def section(self, section_id: str) -> Section:
        for section in self.sections:
            if section.id == section_id:
                return section
        raise KeyError(f"the page has no section {section_id!r}; it has {', '.join(self.section_ids)}")

"""Render a report: the page data of :mod:`vitlab.report.collect`, the figures of :mod:`vitlab.report.figures` and
the Jinja2 template ``templates/page.html.j2`` (autoescape on, the stylesheet ``templates/style.css`` inlined, every
image a base64 ``data:`` URI), so one HTML file holds the whole report and needs no network."""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from vitlab.report.collect import collect, fmt
from vitlab.report.page import ATTENTION_IMAGES, PNG_SIGNATURE, Figures, Page
from vitlab.rundir import REPORT_FILE, check_outputs, write_output
from vitlab.version import __version__

TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class Image:
    uri: str
    caption: str
    wide: bool


def png_uri(data: bytes) -> str:
    """PNG bytes -> a ``data:image/png;base64,...`` URI. Raises ``ValueError`` on bytes that are not a PNG."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file (its first bytes are not the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def images(block: Figures) -> list[Image]:
    """The images of a figures block: the run's PNGs as they are, the plots drawn (one plot may give several)."""
    from vitlab.report.figures import draw
    from vitlab.report.page import DYNAMICS_CAPTIONS

    out = []
    for figure in block.figures:
        if figure.png is not None:
            out.append(Image(png_uri(figure.png), figure.caption, figure.wide))
            continue
        drawn = draw(figure.plot)
        for name, data in drawn:
            caption = figure.caption or (DYNAMICS_CAPTIONS.get(name, "") if len(drawn) > 1 else "")
            wide = figure.wide and (len(drawn) == 1 or name in ("dynamics.png", "comparison.png"))
            out.append(Image(png_uri(data), caption, wide))
    return out


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["fmt"] = fmt
    env.globals.update(images=images, version=__version__, stylesheet=(TEMPLATES / "style.css").read_text())
    return env


def render(page: Page) -> str:
    """The HTML document of ``page``."""
    return environment().get_template("page.html.j2").render(page=page) + "\n"


def report_path(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Where :func:`write_report` writes: ``out`` (a folder: its ``report.html``), else ``<run>/report.html`` for
    one run, ``./report.html`` for several."""
    default = Path(run_dirs[0]) / REPORT_FILE if len(run_dirs) == 1 else Path.cwd() / REPORT_FILE
    path = Path(out) if out is not None else default
    return path / REPORT_FILE if path.is_dir() else path


def write_report(
    run_dirs: Sequence[str | Path],
    out: str | Path | None = None,
    *,
    attention_images: int = ATTENTION_IMAGES,
    force: bool = False,
) -> Path:
    """Write the HTML report of one run (default ``<run>/report.html``) or the comparison of several (default
    ``./report.html``); ``out`` names another file. ``attention_images``: test images whose attention maps (and
    CET-ViT segment maps) are computed, 0 for none. Returns the written path.

    A run's own ``report.html`` is replaced; any other existing file is refused unless ``force``
    (:func:`vitlab.rundir.check_outputs`), before anything is computed.
    """
    path = report_path(run_dirs, out)
    check_outputs([path], force=force or (out is None and len(run_dirs) == 1))
    page = collect(run_dirs, attention_images)
    return write_output(path, render(page), force=True)

"""Run reports: one self-contained HTML page per run, or per comparison of runs (``vitlab report``).

``collect`` (run directories in, plain page data out), ``figures`` (matplotlib), ``templates/`` (Jinja2 with
autoescape, and the stylesheet) and ``render`` (the page data and figures through the template into one file).
"""

from vitlab.report.collect import collect
from vitlab.report.page import Page
from vitlab.report.render import render, write_report

__all__ = ["Page", "collect", "render", "write_report"]

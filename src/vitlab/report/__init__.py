"""Run reports: one self-contained HTML page per run, or per comparison of runs (``vitlab report``)."""

from vitlab.report.html import REPORT_FILE, write_report

__all__ = ["REPORT_FILE", "write_report"]

"""The README stays a five-minute read and no docs page grows past what a reader can hold."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))


def test_the_readme_is_short():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160 and len(text.split()) <= 1300


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_docs_page_is_over_700_lines(page):
    assert len(page.read_text().splitlines()) <= 700

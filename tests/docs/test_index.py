"""docs/index.md links every page under docs/ exactly once (issue 62, item 8: one index, pages grouped by kind)."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def linked_pages(index: Path) -> Counter:
    """How often the index links each page under docs/ (anchors dropped; README and outside pages not counted)."""
    pages = Counter()
    for target in LINK.findall(index.read_text()):
        path = (index.parent / target).resolve()
        if path.suffix == ".md" and path.is_relative_to(DOCS.resolve()):
            pages[path.relative_to(DOCS.resolve()).as_posix()] += 1
    return pages


def test_the_index_links_every_docs_page_once():
    index = DOCS / "index.md"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} - {"index.md"}
    linked = linked_pages(index)
    assert sorted(pages - set(linked)) == [], "pages missing from docs/index.md"
    assert sorted(p for p, n in linked.items() if n > 1) == [], "pages linked more than once"
    assert sorted(set(linked) - pages) == []


def test_the_readme_links_the_index_and_the_tutorial():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/index.md)" in readme and "(docs/tutorial.md)" in readme

"""The core names no family: outside ``vitlab/families``, no module imports a family's package and no code (a name,
an attribute, a string that is no docstring) spells a family's name or its model classes'. Docstrings may still cite
a paper by its system's name ("ViTCAE eq. 26"): a citation, not a dependency."""

import ast
import re
from pathlib import Path

from vitlab.family import builtin, families

SRC = Path(__file__).parents[2] / "src" / "vitlab"


def _forbidden() -> re.Pattern:
    words = set()
    for family in filter(builtin, families()):  # vitlab's own: an installed plug-in's names are its own business
        words.add(family.name)
        words.update(ref.rpartition(":")[2] if isinstance(ref, str) else ref.__name__ for ref in family.models)
    return re.compile("|".join(sorted(map(re.escape, words))) + r"|vitlab\.families\.")


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, nodes) and ast.get_docstring(n) is not None}


def _mentions(path: Path, forbidden: re.Pattern) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.ImportFrom):
            text = f"{node.module}."
        elif isinstance(node, ast.Import):
            text = " ".join(f"{alias.name}." for alias in node.names)
        if text is not None and forbidden.search(text):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {text[:60]!r}")
    return found


def test_no_core_module_names_a_family():
    forbidden = _forbidden()
    assert forbidden.search("vitlab.families.cet_vit") and forbidden.search("ViTCAE")  # the scan can fail
    core = [p for p in SRC.rglob("*.py") if "families" not in p.relative_to(SRC).parts]
    assert len(core) > 100
    mentions = [m for path in core for m in _mentions(path, forbidden)]
    assert not mentions, "\n".join(mentions)

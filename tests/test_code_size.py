"""The size limits of ``src`` (issue 45, docs/architecture.md, "Size"): no module over 500 lines, no function over
60 (counted with ``ast`` from its ``def`` to its last line: signature and docstring included)."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "vitlab"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules by responsibility: {long}"


def long_functions(source: str) -> dict[str, int]:
    """``name:line -> length`` of every function (methods and nested ones too) over the limit."""
    return {
        f"{node.name}:{node.lineno}": node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }


def test_no_function_is_over_60_lines():
    long = {f"{p.relative_to(SRC)} {name}": n for p in _modules() for name, n in long_functions(p.read_text()).items()}
    assert not long, f"split these functions: {long}"


def test_the_count_finds_a_long_method_and_spares_one_at_the_limit():
    body = "\n".join(f"        x{i} = {i}" for i in range(59))
    source = f"class A:\n    def at_limit(self):\n{body}\n\n    def over(self):\n{body}\n        x = 0\n"
    assert long_functions(source) == {"over:63": 61}

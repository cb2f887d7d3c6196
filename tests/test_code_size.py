"""The size limits of ``src`` (docs/architecture.md, "Size"): no module over 450 lines, no function over 50 (counted
with ``ast`` from its ``def`` to its last line: signature and docstring included) unless its docstring says why, in a
sentence that starts "Long because"."""

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "vitlab"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 50
REASON = "Long because"


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules by subject: {long}"


def long_functions(source: str) -> dict[str, int]:
    """``name:line -> length`` of every function (methods and nested ones too) over the limit whose docstring does
    not say why it is long."""
    return {
        f"{node.name}:{node.lineno}": node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        and REASON not in (ast.get_docstring(node) or "")
    }


def test_no_function_is_over_50_lines_without_a_reason():
    long = {f"{p.relative_to(SRC)} {name}": n for p in _modules() for name, n in long_functions(p.read_text()).items()}
    assert not long, f'split these functions by subject, or say in the docstring "{REASON} ...": {long}'


def test_the_count_finds_a_long_method_and_spares_one_at_the_limit():
    body = "\n".join(f"        x{i} = {i}" for i in range(49))
    source = f"class A:\n    def at_limit(self):\n{body}\n\n    def over(self):\n{body}\n        x = 0\n"
    assert long_functions(source) == {"over:53": 51}


def test_a_long_function_with_a_reason_is_spared_and_one_with_another_docstring_is_not():
    body = "\n".join(f"    x{i} = {i}" for i in range(49))
    reasoned = f'def reasoned():\n    """Steps.\n\n    {REASON} it lists the steps."""\n{body}\n'
    other = f'def other():\n    """Steps, and long."""\n{body}\n'
    assert long_functions(reasoned + "\n\n" + other) == {f"other:{reasoned.count(chr(10)) + 3}": 51}

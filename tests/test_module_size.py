"""Issue 12's house rule, pinned: no module in ``src`` over 400 lines, no function over 60.

A module that outgrows 400 lines does more than one job (split it: ``core/_solve.py`` took the
speed model's normal equations when ``core/speed.py`` reached 438); a function over 60 lines
is several steps that want names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MODULES = sorted(SRC.rglob("*.py"))


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method over ``MAX_FUNCTION_LINES`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append((node.name, lines))
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES
    assert long_functions(source) == []


def test_the_scan_sees_the_package_and_catches_a_long_function() -> None:
    assert len(MODULES) > 100
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def long():\n{body}\n") == [("long", MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"async def fine():\n{body[: body.rindex(chr(10))]}\n") == []

"""The size rules, as tests: short functions, classes of one job, a core/ grouped by role.

A function over 60 lines or a class over 300 does more than one thing and
hides it; more than a handful of modules flat in core/ means a subsystem
has not been given its folder. Counted on the source with `ast` (a
function's lines from its `def` to its last statement, docstring included).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.support.source import parsed

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("api", "cli", "core", "storage")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300
MAX_FLAT_CORE_MODULES = 6


def definitions(root: Path = ROOT) -> list[tuple[str, ast.AST]]:
    """(path:line name, node) for every function and class in the package's folders."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = parsed(path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.append((f"{path.relative_to(root)}:{node.lineno} {node.name}", node))
    return found


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def over(kind: type | tuple[type, ...], limit: int, root: Path = ROOT) -> list[str]:
    return [f"{where} ({lines(node)} lines)" for where, node in definitions(root)
            if isinstance(node, kind) and lines(node) > limit]


def test_no_function_is_over_60_lines():
    offenders = over((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)
    assert not offenders, "over 60 lines: " + "; ".join(offenders)


def test_no_class_is_over_300_lines():
    offenders = over(ast.ClassDef, MAX_CLASS_LINES)
    assert not offenders, "over 300 lines: " + "; ".join(offenders)


def test_core_keeps_at_most_6_modules_flat():
    flat = sorted(p.name for p in (ROOT / "core").glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= MAX_FLAT_CORE_MODULES, f"{len(flat)} modules flat in core/: {flat}"


def test_no_two_public_classes_share_a_name():
    places = defaultdict(list)
    for where, node in definitions():
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            places[node.name].append(where)
    shared = {name: found for name, found in places.items() if len(found) > 1}
    assert not shared, f"one name, several classes: {shared}"


def test_the_rules_catch_what_they_are_for(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert over(ast.FunctionDef, MAX_FUNCTION_LINES, tmp_path) == ["core/long.py:1 long (61 lines)"]
    assert over(ast.FunctionDef, 61, tmp_path) == []

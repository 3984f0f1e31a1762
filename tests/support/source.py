"""The package's source, parsed once per test process for the tests that read it (import rules, sizes)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


def parsed(path: Path) -> ast.Module:
    """The module at `path`; parsed again only when its text changed."""
    return _parse(path.read_text(), str(path))


@cache
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename=filename)

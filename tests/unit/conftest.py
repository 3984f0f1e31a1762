"""Unit tests are pure: grammars compile in this process (the isolated worker pool is a process of
its own, tested in tests/integration/test_grammar_isolation.py)."""

from __future__ import annotations

import pytest

from fsched.core.grammar.compiler import GrammarCompiler, set_default_compiler
from fsched.core.grammar.llg import compiled_text


@pytest.fixture(autouse=True, scope="session")
def grammars_in_process():
    set_default_compiler(GrammarCompiler(compiled_text))
    yield
    set_default_compiler(None)

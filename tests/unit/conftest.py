"""tests/unit is pure: a unit test that opens a socket, starts a subprocess, sleeps or opens a
database fails (tests/support/purity.py). What needs those belongs in tests/integration. Grammars
compile in this process (the isolated worker pool is a process of its own, tested in
tests/integration/test_grammar_isolation.py)."""

from __future__ import annotations

import pytest

from fsched.core.grammar.compiler import GrammarCompiler, set_default_compiler
from fsched.core.grammar.llg import compiled_text
from tests.support.purity import PurityGuard

_guard = PurityGuard()
_patch = pytest.MonkeyPatch()


@pytest.fixture(autouse=True, scope="session")
def grammars_in_process():
    set_default_compiler(GrammarCompiler(lambda source, _tenant: compiled_text(source)))
    yield
    set_default_compiler(None)

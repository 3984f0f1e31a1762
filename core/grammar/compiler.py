"""The one door to a compiled grammar: limits, then the verdict cache by content, then the worker.

`compile_grammar(source)` returns a `CompiledGrammar` (the handle the runners build matchers from) or
raises `GrammarError` naming the subject (`response_format`, or a tool) and why. A refusal is cached
as well as a success: a hostile schema sent again costs a dictionary lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from fsched.core.grammar.cache import VerdictCache
from fsched.core.grammar.limits import GrammarLimits
from fsched.core.grammar.source import GrammarBusy, GrammarError, GrammarSource


@dataclass(slots=True, frozen=True)
class CompiledGrammar:
    key: str  # the source's content name
    grammar: str  # llguidance's grammar text, known to compile


@dataclass(slots=True, frozen=True)
class _Refused:
    reason: str


class GrammarCompiler:
    """Limits, cache and a backend (`text_of(source, tenant) -> grammar text`, raising GrammarError):
    the isolated pool in a server (which takes the tenants in turn), the in-process compile in a pure
    test."""

    def __init__(self, backend: Callable[[GrammarSource, str], str], limits: GrammarLimits = GrammarLimits(),
                 cache_size: int = 512):
        self.backend = backend
        self.limits = limits
        self.cache: VerdictCache[CompiledGrammar | _Refused] = VerdictCache(cache_size)

    def compile(self, source: GrammarSource, tenant: str = "") -> CompiledGrammar:
        """`tenant`: whose request it is (the pool serves the tenants in turn)."""
        key = source.key
        verdict = self.cache.get(key)
        if verdict is None:
            verdict = self._verdict(source, key, tenant)
            self.cache.put(key, verdict)
        if isinstance(verdict, _Refused):
            raise GrammarError(verdict.reason, source.subject)
        return verdict

    def _verdict(self, source: GrammarSource, key: str, tenant: str) -> CompiledGrammar | _Refused:
        try:
            self.limits.check(source)
            return CompiledGrammar(key, self.backend(source, tenant))
        except GrammarBusy as exc:  # says nothing of the grammar: not cached
            raise GrammarBusy(exc.reason, source.subject) from None
        except GrammarError as exc:
            return _Refused(str(exc))


_default: GrammarCompiler | None = None
_default_lock = threading.Lock()


def default_compiler() -> GrammarCompiler:
    """The process's compiler: the isolated worker pool, started on first use."""
    global _default
    with _default_lock:
        if _default is None:
            from fsched.core.grammar.pool import WorkerPool

            _default = GrammarCompiler(WorkerPool().compile)
        return _default


def set_default_compiler(compiler: GrammarCompiler | None) -> None:
    """Use `compiler` from now on (None: the isolated pool again, on next use)."""
    global _default
    with _default_lock:
        _default = compiler


def compile_grammar(source: GrammarSource, tenant: str = "") -> CompiledGrammar:
    """`source` compiled by the process's compiler (see `default_compiler`) for `tenant`'s request, or
    GrammarError."""
    return default_compiler().compile(source, tenant)

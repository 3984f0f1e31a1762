"""Grammars for structured output: a source named by its content, size limits checked before any
work, and compiled in an isolated worker process within a CPU, memory, stack and wall-clock budget.

`compile_grammar(source)` is the one door: limits (pure, `limits.py`), then the verdict cache by content
(`cache.py`), then the worker pool (`pool.py`, `worker.py`). Whatever goes wrong in the grammar library
(a crash, an overrun, an error) is a `GrammarError` naming why; the worker that failed is replaced.
The daemon builds its matchers from the same llguidance text (`llg.py`).
"""

from fsched.core.grammar.compiler import CompiledGrammar, GrammarCompiler, compile_grammar, default_compiler
from fsched.core.grammar.limits import GrammarLimits
from fsched.core.grammar.source import GrammarError, GrammarSource, SourceKind

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarLimits", "GrammarSource",
           "SourceKind", "compile_grammar", "default_compiler"]

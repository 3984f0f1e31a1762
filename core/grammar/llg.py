"""A grammar source as llguidance's grammar text, and the check that it compiles.

llguidance (a Rust library, no Python dependencies, one abi3 wheel) compiles a JSON schema into an
incremental parser that computes a token mask in tens of microseconds; docs/http.md gives the
figures. Runs where a crash costs nothing: in the isolated worker (`worker.py`), and in the daemon
only for a source that passed the worker (the daemon's compile thread has a larger stack).

The JSON is compact: no whitespace between tokens outside strings. A model that may write free
whitespace can write it forever (a random or weak model does), and compact JSON is what parsers want.
"""

from __future__ import annotations

import json

from fsched.core.grammar.source import GrammarError, GrammarSource, SourceKind

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                "whitespace_pattern": ""}


def grammar_text(source: GrammarSource) -> str:
    """llguidance's grammar for `source` (its JSON text); GrammarError when it cannot be built."""
    from llguidance import LLMatcher

    try:
        if source.kind is SourceKind.LARK:
            return LLMatcher.grammar_from_lark(source.text)
        return LLMatcher.grammar_from_json_schema(json.loads(source.text), overrides=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"the {source.kind.label} cannot be used: {exc}") from None


def compiled_text(source: GrammarSource) -> str:
    """The grammar text, once llguidance has compiled it without error (the worker's job)."""
    from llguidance import LLMatcher

    grammar = grammar_text(source)
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"the {source.kind.label} cannot be used: {error}")
    return grammar

"""Structured output's grammars, with llguidance: a response format compiled and checked.

A request with `response_format` is generated under a grammar: at each step
the grammar says which tokens may come next (a mask over the vocabulary)
and the sampler draws only among them, so the text is valid JSON (against
the schema, when one is given) whenever it ends by the grammar's own end.
llguidance (a Rust library, no Python dependencies, one abi3 wheel) compiles
a JSON schema into an incremental parser that computes a mask in tens of
microseconds; docs/http.md gives the measured figures and the choice.

The JSON is compact: no whitespace between tokens outside strings. A model
that may write free whitespace can write it forever (a random or weak
model does), and compact JSON is what parsers want anyway.

No torch here: checking a response format at submit time, and the remote
runner's checks, run without it. The masks on tensors are in
core/runners/hf/grammar.py (the runners use this module, and the parsers check a
format with it before anything is stored).
"""

from __future__ import annotations

import json
from functools import lru_cache

from fsched.core.types import ResponseFormat, ResponseFormatType

# Compact JSON, and no free whitespace: see the module's docstring.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                "whitespace_pattern": ""}
ANY_OBJECT = {"type": "object"}


class GrammarError(ValueError):
    """A response format the grammar library cannot compile; the message says why."""


@lru_cache(maxsize=256)
def grammar_of(response_format: ResponseFormat) -> str:
    """The llguidance grammar (its JSON text) that `response_format` asks for; GrammarError if none."""
    from llguidance import LLMatcher

    schema = response_format.schema if response_format.type is ResponseFormatType.JSON_SCHEMA else None
    source = ANY_OBJECT if schema is None else json.loads(schema)
    try:
        grammar = LLMatcher.grammar_from_json_schema(source, overrides=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"the JSON schema cannot be used: {exc}") from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"the JSON schema cannot be used: {error}")
    return grammar


def check_response_format(response_format: ResponseFormat | None) -> None:
    """Raise GrammarError when the format's grammar does not compile (a submit's 400)."""
    if response_format is not None:
        grammar_of(response_format)

"""Size limits on a grammar's source, checked in pure Python before the grammar library sees it.

The grammar library (llguidance, Rust) resolves `$ref` chains recursively and builds a parser row
per object whose size grows with its optional properties: a long enough chain overflows its stack
(a segfault: about 3,000 links), and an object with more than about 500 optional properties
exceeds its own 2,000-items-a-row limit at the object's first token. These limits refuse such a
source at once, with a message naming the limit; the isolated worker (`pool.py`) still bounds
whatever passes them. Every walk here is iterative: no schema can exhaust Python's stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from fsched.core.grammar.source import GrammarError, GrammarSource, SourceKind

_DEF_PREFIXES = ("#/$defs/", "#/definitions/")


@dataclass(slots=True, frozen=True)
class GrammarLimits:
    # 256 KiB: OpenAI's own caps on a schema (5,000 properties, 120,000 characters of names and
    # enum values) fit in about that; the grammar library's compile time grows with the size.
    max_bytes: int = 256 * 1024
    # OpenAI's limit on properties in one schema, all objects together.
    max_properties: int = 5_000
    # The grammar library allows 2,000 items in a parser row and an optional property takes 4.
    max_optional_properties: int = 400
    # Nested objects and arrays in the schema's JSON: deeper than any hand-written schema.
    max_depth: int = 64
    # `$ref`s in all, and the longest chain of definitions reached one through another.
    max_refs: int = 1_000
    max_ref_chain: int = 64

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_properties", "max_optional_properties", "max_depth", "max_refs",
                     "max_ref_chain"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    def check(self, source: GrammarSource) -> None:
        """GrammarError naming the first limit `source` is over."""
        size = len(source.text.encode())
        if size > self.max_bytes:
            raise GrammarError(f"the {source.kind.label} is {size} bytes; at most {self.max_bytes} are taken")
        if source.kind is SourceKind.JSON_SCHEMA:
            self._check_schema(json.loads(source.text))

    def _check_schema(self, schema: object) -> None:
        properties = refs = 0
        for node, depth in _nodes(schema):
            if depth > self.max_depth:
                raise GrammarError(f"the JSON schema nests deeper than {self.max_depth} levels")
            if not isinstance(node, dict):
                continue
            props = node.get("properties")
            if isinstance(props, dict) and node.get("type", "object") == "object":
                properties += len(props)
                self._check_object(props, node.get("required"))
            refs += isinstance(node.get("$ref"), str)
        if properties > self.max_properties:
            raise GrammarError(f"the JSON schema has {properties} properties; at most {self.max_properties}")
        if refs > self.max_refs:
            raise GrammarError(f"the JSON schema has {refs} $refs; at most {self.max_refs}")
        chain = ref_chain(schema)
        if chain > self.max_ref_chain:
            raise GrammarError(f"the JSON schema's $refs chain {chain} definitions deep; at most "
                               f"{self.max_ref_chain}")

    def _check_object(self, props: dict, required: object) -> None:
        needed = set(required) if isinstance(required, list) else set()
        optional = sum(1 for name in props if name not in needed)
        if optional > self.max_optional_properties:
            raise GrammarError(f"an object of the JSON schema has {optional} optional properties; at most "
                               f"{self.max_optional_properties} (list the others in `required`)")


def _nodes(value: object) -> Iterator[tuple[object, int]]:
    """Every value inside `value` with its depth, iteratively."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _targets(value: object) -> set[str]:
    """The local definitions `value` refers to."""
    found = set()
    for node, _ in _nodes(value):
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith(_DEF_PREFIXES):
            found.add(ref.split("/", 2)[2])
    return found


def ref_chain(schema: object) -> int:
    """The longest chain of definitions, each reached by a `$ref` from the one before (a cycle, a
    recursive schema, counts once round)."""
    if not isinstance(schema, dict):
        return 0
    defs: dict = {}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update(schema[key])
    edges = {name: _targets(body) & defs.keys() for name, body in defs.items()}
    depth: dict[str, int] = {}
    for root in edges:
        _longest_from(root, edges, depth)
    return max(depth.values(), default=0)


def _longest_from(root: str, edges: dict[str, set[str]], depth: dict[str, int]) -> None:
    """Fill `depth[name]` (definitions on the longest chain from `name`), depth-first without recursion."""
    on_path: set[str] = set()
    stack: list[tuple[str, bool]] = [(root, False)]
    while stack:
        name, done = stack.pop()
        if done:
            on_path.discard(name)
            depth[name] = 1 + max((depth.get(t, 0) for t in edges[name] if t not in on_path), default=0)
            continue
        if name in depth or name in on_path:
            continue
        on_path.add(name)
        stack.append((name, True))
        stack.extend((t, False) for t in edges[name] if t not in depth and t not in on_path)

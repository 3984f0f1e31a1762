"""A grammar's source, named by its content: what a compiled grammar and a verdict are cached by."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from fsched.core.types import ResponseFormat, ResponseFormatType

ANY_OBJECT = '{"type":"object"}'  # json_object: any JSON object


class GrammarError(ValueError):
    """A grammar that cannot be used; the message names what the client sent it as (`subject`) and
    says why (`reason`): a request's 400."""

    def __init__(self, reason: str, subject: str | None = None):
        super().__init__(f"{subject}: {reason}" if subject else reason)
        self.reason = reason


class GrammarBusy(GrammarError):
    """Not a verdict on the grammar: the sender has its most checks waiting already (never cached)."""


class SourceKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # canonical JSON text of a JSON schema
    LARK = "lark"  # llguidance's Lark dialect (tool-call syntax wrapping a schema, say)

    @property
    def label(self) -> str:
        """The kind in a refusal's words."""
        return "JSON schema" if self is SourceKind.JSON_SCHEMA else "grammar"


@dataclass(slots=True, frozen=True)
class GrammarSource:
    kind: SourceKind
    text: str  # canonical: equal texts are the same grammar
    subject: str = "response_format"  # what the client sent it as, named in a refusal

    @property
    def key(self) -> str:
        """The content's name: sha256 of the kind and the text."""
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode()).hexdigest()

    @classmethod
    def of(cls, response_format: ResponseFormat) -> GrammarSource:
        """A response format's grammar source (json_object: the schema of any object)."""
        if response_format.type is ResponseFormatType.JSON_SCHEMA:
            return cls(SourceKind.JSON_SCHEMA, response_format.schema or ANY_OBJECT)
        return cls(SourceKind.JSON_SCHEMA, ANY_OBJECT)

"""What every door says of an input it refuses, and the text rules it checks strings with.

`InputError` is the one error a refused input raises, whatever refused it (a
value checker, a body parser, a file's line): what is wrong, in words fit for
a user, and where (`field`, a path such as "messages[0].role", when known).
Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

# What a stored string may not hold: a NUL (PostgreSQL's text refuses it) or a
# lone surrogate (JSON's "\ud800" escape: not Unicode, so not storable as UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
SHOWN_CHARS = 80  # a value quoted in an error is cut to this many characters


class InputError(ValueError):
    """An input fsched refuses: `message` says what is wrong, `field` where (None: the input as a whole;
    "" or a relative path such as "[2].text" when raised inside one value, before its field is known)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def within(self, prefix: str) -> InputError:
        """The same refusal, its field a path under `prefix` ("logit_bias" + ".5")."""
        return InputError(self.message, prefix + (self.field or ""))

    def named(self) -> str:
        """The message with its field first, so a client that shows only the message sees which."""
        return f"{printable(self.field)}: {self.message}" if self.field else self.message


class JobFileError(InputError):
    """A submitted file (or a request body) is not acceptable; nothing of it may be stored."""

    def __init__(self, source: str, message: str, line: int | None = None, field: str | None = None):
        super().__init__(message, field)
        self.source = source
        self.line = line
        # File and field names come from the user: one line, no terminal escapes.
        where = printable(source, 200) if line is None else f"{printable(source, 200)}, line {line}"
        if field is not None:
            where += f", field '{printable(field)}'"
        self.args = (f"{where}: {printable(message, 1000)}",)


def printable(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` fit for one line of an error: control characters escaped, cut to `limit`."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(value: Any) -> str:
    """A JSON value quoted in an error message, cut short."""
    return printable(repr(value))


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def storable(text: str, where: str = "") -> str:
    """`text` unless it holds a character no database column takes."""
    bad = _UNSTORABLE.search(text)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "a lone surrogate (not valid Unicode)"
        raise InputError(f"contains {what}: \\u{ord(bad.group()):04x} at character {bad.start() + 1}", where)
    return text

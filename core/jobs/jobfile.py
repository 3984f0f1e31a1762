"""A submitted JSONL file, read a piece at a time, by the rules every file follows before anything is stored.

The file's own rules: its size, its encoding (UTF-8, a byte order mark
skipped), each line's size, blank lines skipped, the number of requests, one
JSON object a line (read by `jsontext.loads_object`'s rules), each `custom_id`
once, at least one request. What a line says is read by the parser the caller
gives (the OpenAI protocol's line forms: `core/openai/batchfile.py`).

Every problem raises JobFileError naming the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from fsched.core.jobs.inputs import InputError, JobFileError, printable, shown
from fsched.core.jobs.jsontext import loads_object
from fsched.core.jobs.limits import InputLimits
from fsched.core.types import RequestSpec

__all__ = ["JobFileError", "LineParser", "load_json_object", "parse_lines", "printable"]

# A line's object, its line number and its place among the file's requests -> its requests (one per
# choice, all with the line's custom_id), or InputError naming the field.
LineParser = Callable[[dict, int, int], tuple[RequestSpec, ...]]


def parse_lines(pieces: Iterable[bytes], source: str, limits: InputLimits, parse_line: LineParser
                ) -> tuple[RequestSpec, ...]:
    """Every request of a JSONL file given in pieces (read as they come: never more than a line and a
    piece held), each line read by `parse_line`, or JobFileError."""
    requests: list[RequestSpec] = []
    seen_ids: dict[str, int] = {}
    lines = 0
    for line_no, raw in enumerate(_lines(pieces, source, limits), start=1):
        text = _decoded_line(raw, source, line_no, limits)
        if not text.strip():
            continue
        if len(requests) >= limits.max_lines:
            raise JobFileError(source, f"more than {limits.max_lines:,} requests in one file", line_no)
        lines += 1
        try:
            specs = parse_line(loads_object(text, limits.max_depth), line_no, lines)
        except InputError as exc:
            raise JobFileError(source, exc.message, line_no, exc.field) from None
        custom_id = specs[0].custom_id
        if custom_id in seen_ids:
            raise JobFileError(
                source,
                f"duplicate custom_id {shown(custom_id)} (first on line {seen_ids[custom_id]})",
                line_no,
                "custom_id",
            )
        seen_ids[custom_id] = line_no
        requests.extend(specs)
    if not requests:
        raise JobFileError(source, "file has no requests (it is empty or blank)")
    return tuple(requests)


def _lines(pieces: Iterable[bytes], source: str, limits: InputLimits) -> Iterator[bytes]:
    """The file's lines (a UTF-8 byte order mark skipped, as editors on Windows write), its size and a
    line's checked as they come."""
    held, size, line_no, head = b"", 0, 1, b""
    for piece in pieces:
        size += len(piece)
        if size > limits.max_bytes:
            raise JobFileError(source, f"file is over the limit of {limits.max_bytes:,} bytes")
        if head is not None:  # the file's first bytes, until it is known whether they are a BOM
            head, piece = head + piece, b""
            if len(head) < 3:
                continue
            piece, head = head.removeprefix(b"\xef\xbb\xbf"), None
        *whole, held = (held + piece).split(b"\n")
        yield from whole
        line_no += len(whole)
        if len(held) > limits.max_line_bytes:  # the line's end has not come: it is over already
            _decoded_line(held, source, line_no, limits)
    yield held + (head or b"").removeprefix(b"\xef\xbb\xbf")


def _decoded_line(raw: bytes, source: str, line_no: int, limits: InputLimits) -> str:
    if len(raw) > limits.max_line_bytes:
        raise JobFileError(
            source, f"line is {len(raw):,} bytes, over the limit of {limits.max_line_bytes:,}", line_no
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(source, f"not valid UTF-8 (byte {exc.start + 1} of the line)", line_no) from None


def load_json_object(text: str, max_depth: int) -> dict:
    """One JSON object by the job file's rules (finite numbers, unique keys, bounded depth).

    Raises JobFileError (source "<body>", the offending field when known).
    """
    try:
        return loads_object(text, max_depth)
    except InputError as exc:
        raise JobFileError("<body>", exc.message, field=exc.field) from None

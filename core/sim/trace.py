"""Request traces for the simulator: public CSV traces, the Mooncake JSONL and fsched's JSONL.

CSV, recognised by its header's column names (case and surrounding spaces
aside, other columns ignored): Azure's LLM inference traces
(`TIMESTAMP,ContextTokens,GeneratedTokens`, CRLF; the 2025 multimodal one
adds `NumImages`) and BurstGPT's (`Timestamp`, `Request tokens`, `Response
tokens`). A timestamp is seconds (a number) or a date and time (ISO 8601, a
space or a `T` between them, any digits of fraction, an offset or `Z`; one
without an offset is read as UTC). Arrival times are made relative to the
first request. fsched JSONL: one object a line with
`arrival_s`, `prompt_tokens`, `output_tokens` and optionally `tenant`,
`class`, `priority`. Mooncake JSONL (the FAST'25 trace release): one object
a line with `timestamp` (milliseconds), `input_length`, `output_length`
(other fields, such as `hash_ids`, are ignored); recognised line by line by
its `timestamp` field. Requests longer than an engine can hold are kept:
the simulator refuses them one by one and counts them. A public trace's row
with no prompt or no output tokens (BurstGPT logs its failed requests so)
is skipped, and their number given in one `TraceWarning`; in fsched's own
JSONL such a row is an error.

Tenants and classes a trace lacks are drawn from a `random.Random(seed)`
in file order: tenants uniformly (so the offered load is equal and the
weights alone decide the shares), classes by the mix's probabilities.
`rate_scale` multiplies the arrival rate: arrival times are divided by it.
"""

from __future__ import annotations

import csv
import json
import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fsched.core.types import RequestClass

DEFAULT_MIX: dict[RequestClass, float] = {
    RequestClass.REALTIME: 0.1,
    RequestClass.STREAMING: 0.2,
    RequestClass.BATCH: 0.7,
}


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


class TraceWarning(UserWarning):
    """A trace read with rows left out (the message says how many, and why)."""


# A public CSV trace's columns by its header's names (lower case): the arrival, the prompt, the output.
CSV_COLUMNS = (("timestamp", "contexttokens", "generatedtokens"),  # Azure LLM inference traces
               ("timestamp", "request tokens", "response tokens"))  # BurstGPT


@dataclass(slots=True, frozen=True)
class TraceRequest:
    arrival_s: float
    tenant: str
    request_class: RequestClass
    prompt_tokens: int
    output_tokens: int
    priority: int = 5


@dataclass(slots=True, frozen=True)
class _Raw:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str | None = None
    request_class: RequestClass | None = None
    priority: int = 5


def load_trace(
    path: str | Path,
    *,
    tenants: Sequence[str] = ("default",),
    mix: Mapping[RequestClass, float] | None = None,
    rate_scale: float = 1.0,
    limit: int | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """Read a trace, assign missing tenants and classes, scale, sort by arrival."""
    if not rate_scale > 0:
        raise ValueError("rate_scale must be > 0")
    if not tenants:
        raise ValueError("at least one tenant is needed")
    mix = dict(mix or DEFAULT_MIX)
    if any(p < 0 for p in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError("class mix needs non-negative probabilities with a positive sum")
    path = Path(path)
    raws = _read_jsonl(path, limit) if path.suffix in (".jsonl", ".json") else _read_csv(path, limit)
    if not raws:
        raise TraceError(f"{path}: no requests")
    rng = random.Random(seed)
    classes = list(mix)
    probs = [mix[c] for c in classes]
    out: list[TraceRequest] = []
    t0 = min(r.arrival_s for r in raws)
    for raw in raws:
        tenant = raw.tenant if raw.tenant is not None else rng.choice(list(tenants))
        request_class = raw.request_class if raw.request_class is not None else rng.choices(classes, probs)[0]
        out.append(
            TraceRequest(
                arrival_s=(raw.arrival_s - t0) / rate_scale,
                tenant=tenant,
                request_class=request_class,
                prompt_tokens=raw.prompt_tokens,
                output_tokens=raw.output_tokens,
                priority=raw.priority,
            )
        )
    out.sort(key=lambda r: r.arrival_s)
    return out


def _read_csv(path: Path, limit: int | None) -> list[_Raw]:
    raws: list[_Raw] = []
    skipped = 0
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # past a byte order mark (a spreadsheet's)
            reader = csv.reader(f)
            at, prompt, output = _csv_columns(path, next(reader, None))
            for lineno, row in enumerate(reader, start=2):
                if limit is not None and len(raws) >= limit:
                    break
                if not row:
                    continue
                try:
                    raw = _Raw(_seconds(row[at]), _tokens(row[prompt], 0), _tokens(row[output], 0))
                except (ValueError, IndexError) as exc:
                    raise TraceError(f"{path}: line {lineno}: {exc}") from None
                if raw.prompt_tokens and raw.output_tokens:
                    raws.append(raw)
                else:
                    skipped += 1
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    _warn_skipped(path, skipped)
    return raws


def _csv_columns(path: Path, header: list[str] | None) -> tuple[int, int, int]:
    """The places of the arrival, prompt and output columns, by the header's names."""
    names = [name.strip().lower() for name in header or ()]
    for wanted in CSV_COLUMNS:
        if all(name in names for name in wanted):
            at, prompt, output = (names.index(name) for name in wanted)
            return at, prompt, output
    raise TraceError(f"{path}: line 1: expected header TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or "
                     "Timestamp,...,Request tokens,Response tokens (BurstGPT), in any order")


def _warn_skipped(path: Path, skipped: int) -> None:
    if skipped:
        warnings.warn(TraceWarning(f"{path}: {skipped:,} rows with no prompt or no output tokens skipped"),
                      stacklevel=4)


def _seconds(stamp: str) -> float:
    """A timestamp as seconds: a number as it is; a date and time (ISO 8601, any digits of fraction, an
    offset or none for UTC) as seconds since the epoch."""
    text = stamp.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"timestamp {text!r} is not a time")
        return seconds
    at = datetime.fromisoformat(text)
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp()


def _tokens(text: str, minimum: int) -> int:
    value = int(str(text).strip())
    if value < minimum:
        raise ValueError(f"token count {value} < {minimum}")
    return value


def _read_jsonl(path: Path, limit: int | None) -> list[_Raw]:
    raws: list[_Raw] = []
    skipped = 0
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    for lineno, line in enumerate(lines, start=1):
        if limit is not None and len(raws) >= limit:
            break
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("expected a JSON object")
            if "timestamp" in obj and "arrival_s" not in obj:
                raw = _mooncake(obj)
                if raw is None:
                    skipped += 1
                else:
                    raws.append(raw)
                continue
            arrival = float(obj["arrival_s"])
            if not arrival >= 0:
                raise ValueError("arrival_s must be >= 0")
            request_class = obj.get("class")
            priority = int(obj.get("priority", 5))
            if not 0 <= priority <= 9:
                raise ValueError("priority must be within 0..9")
            raws.append(
                _Raw(
                    arrival_s=arrival,
                    prompt_tokens=_tokens(obj["prompt_tokens"], 1),
                    output_tokens=_tokens(obj["output_tokens"], 1),
                    tenant=None if obj.get("tenant") is None else str(obj["tenant"]),
                    request_class=None if request_class is None else RequestClass(request_class),
                    priority=priority,
                )
            )
        except KeyError as exc:
            raise TraceError(f"{path}: line {lineno}: missing field {exc.args[0]!r}") from None
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}: line {lineno}: {exc}") from None
    _warn_skipped(path, skipped)
    return raws


def _mooncake(obj: dict) -> _Raw | None:
    """One Mooncake record: `timestamp` in ms, `input_length`, `output_length`; None for one with no
    prompt or no output tokens."""
    arrival = float(obj["timestamp"]) / 1000.0
    if not 0 <= arrival < math.inf:
        raise ValueError("timestamp must be >= 0")
    prompt, output = _tokens(obj["input_length"], 0), _tokens(obj["output_length"], 0)
    return _Raw(arrival, prompt, output) if prompt and output else None


def parse_assignments(text: str, what: str) -> dict[str, float]:
    """'a=3,b=1' -> {'a': 3.0, 'b': 1.0}; the error names `what`."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{what}: expected NAME=NUMBER, got {part.strip()!r}")
        if name in out:
            raise ValueError(f"{what}: {name!r} given twice")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{what}: {name}={value.strip()!r} is not a number") from None
        if not number >= 0 or number == float("inf"):
            raise ValueError(f"{what}: {name} must be a finite number >= 0")
        out[name] = number
    return out


def parse_mix(text: str) -> dict[RequestClass, float]:
    """'realtime=0.05,streaming=0.15,batch=0.8', or realtime/streaming/batch weights: '5/15/80'."""
    if "=" not in text and "/" in text:
        text = _slashed_mix(text)
    raw = parse_assignments(text, "--mix")
    mix: dict[RequestClass, float] = {}
    for name, p in raw.items():
        try:
            mix[RequestClass(name)] = p
        except ValueError:
            known = ", ".join(c.value for c in RequestClass)
            raise ValueError(f"--mix: unknown class {name!r} (known: {known})") from None
    if sum(mix.values()) <= 0:
        raise ValueError("--mix: the probabilities must not all be 0")
    return mix


def _slashed_mix(text: str) -> str:
    parts = [p.strip() for p in text.split("/")]
    if len(parts) != len(RequestClass):
        order = "/".join(c.value for c in RequestClass)
        raise ValueError(f"--mix: expected {order} (e.g. 5/15/80) or CLASS=P,..., got {text!r}")
    return ",".join(f"{c.value}={p}" for c, p in zip(RequestClass, parts, strict=True))

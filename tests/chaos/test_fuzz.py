"""Fuzzing `fsched submit`'s input: every file is taken whole or refused whole, clearly.

Inputs: arbitrary bytes, and JSONL files bent every way — deep nesting,
NaN/Infinity, huge and overflowing numbers, a BOM, CRLF, invalid UTF-8,
lone surrogates (escaped and raw), NUL bytes and escapes, lines at and over
the size limits, duplicated keys, wrong types in every field, mixed forms.

What must hold for each case:
- the parser returns a whole file of requests, one per non-blank line, each
  equal to what a plain `json.loads` of its line says (a differential
  check), with only storable text; or it raises JobFileError with one
  printable line naming the file, the line (whose prefix is a valid file on
  its own) and, for a single wrong field, exactly that field;
- no other exception (a crash), and no case over CASE_LIMIT_S (a hang);
- through the real SqlJobStore on SQLite, a submit changes the job table
  by exactly its jobs and requests or not at all — also when the store
  refuses it (queue limit, bad tenant) or fails mid-insert;
- through the `fsched submit` command in a subprocess (a sample), the exit
  status, the stderr line and the table agree with the in-process parse.

Case counts are fixed and derandomised (the same cases on every CI run):
FSCHED_FUZZ_EXAMPLES (default 1,000) examples for each parser property, a
quarter of that through the store, a 200th (at least 6) through the command.
Each test adds a line to a "fuzz cases" section of pytest's terminal summary:
cases run, accepted/rejected, time, slowest parse (CPU). A long run (about
100,000 parser cases; docs/reliability.md has its figures):

    FSCHED_FUZZ_EXAMPLES=33334 .venv/bin/pytest tests/chaos/test_fuzz.py -q

Hypothesis rather than atheris: it runs on every Python here without a
compiled extension, shrinks a failure to a minimal file, and replays the
same cases on every CI run; the oracle is what matters, and it is shared.
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsched.core.jobs.jobfile import JobFileError
from fsched.core.jobs.limits import MIB, InputLimits
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.openai.messages import CHAT_ROLES
from fsched.core.ports.records import JobSubmission, QueueFull
from fsched.core.types import MAX_SEED, RequestClass, RequestSpec
from fsched.storage import submit as submit_module
from fsched.storage.jobstore import SqlJobStore

FUZZ_EXAMPLES = int(os.environ.get("FSCHED_FUZZ_EXAMPLES", "1000"))
STORE_EXAMPLES = max(20, FUZZ_EXAMPLES // 4)
CLI_EXAMPLES = max(6, FUZZ_EXAMPLES // 200)
Parsed = tuple[RequestSpec, ...]  # a file parse_job_file accepted: its requests
# CPU time for one parse of one case (CPU, not wall: other processes' load does not count), so a
# hang or a blow-up fails while the largest valid file (50,000 lines, ~0.5 s) passes with room.
CASE_LIMIT_S = 2.0
CASE_LIMIT_S_PER_MIB = 4.0
FSCHED = str(Path(sys.executable).parent / "fsched")
BOM = b"\xef\xbb\xbf"

# Small limits make "at and over every limit" cheap to reach; default ones are the real thing.
SMALL = InputLimits(
    max_lines=6,
    max_bytes=3_000,
    max_line_bytes=400,
    max_depth=8,
    max_tokens=5_000,
    default_max_tokens=100,
    max_custom_id_chars=16,
    max_stop_sequences=2,
)
LIMITS = st.sampled_from([SMALL, InputLimits()])


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


# -- the tally: how many cases ran, printed in pytest's terminal summary -------------------


@dataclass
class Tally:
    rows: list[str] = field(default_factory=list)
    total: int = 0

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.rows:
            return
        terminalreporter.section("fuzz cases")
        for row in self.rows:
            terminalreporter.write_line(row)
        terminalreporter.write_line(f"total: {self.total:,} cases (FSCHED_FUZZ_EXAMPLES={FUZZ_EXAMPLES:,})")


@dataclass
class Run:
    name: str
    outcomes: Counter = field(default_factory=Counter)
    slowest_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def cases(self) -> int:
        return sum(self.outcomes.values())

    def line(self) -> str:
        parts = ", ".join(f"{k} {v:,}" for k, v in sorted(self.outcomes.items()))
        return (
            f"{self.name}: {self.cases:,} cases ({parts}) in {time.perf_counter() - self.started:.1f} s, "
            f"slowest parse {self.slowest_s * 1000:.1f} ms of CPU"
        )


@pytest.fixture(scope="session")
def tally(request) -> Tally:
    plugin = Tally()
    request.config.pluginmanager.register(plugin, "fsched-fuzz-tally")
    return plugin


@pytest.fixture
def run(request, tally, record_property):
    current = Run(request.node.name.removeprefix("test_"))
    yield current
    tally.rows.append(current.line())
    tally.total += current.cases
    record_property("fuzz_cases", current.cases)


# -- strategies ---------------------------------------------------------------------------

NASTY = st.sampled_from(
    ["é", "a\nb", "\t", "\r", "\u2028", "\ufeff", "\x1b[2J", "😀", "\\", '"', "", "\x00", "\ud800", "\udfff"]
)
TEXT = st.one_of(st.text(max_size=12), NASTY, st.builds(str.__add__, st.text(max_size=6), NASTY))
FIELD_NAMES = st.sampled_from(
    ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "custom_id",
     "method", "url", "body", "model", "n", "stream", "user", "max_completion_tokens", "role", "content",
     "type", "text"]
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2, 2**63 - 1, 2**63, 10**30, 1e308, 5e-324, 0.5, 1.0, 2.0000001, -0.0]),
)
LEAF = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
ANY_JSON = st.recursive(
    LEAF,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(FIELD_NAMES | TEXT, kids, max_size=4),
    max_leaves=12,
)

STORABLE_CHARS = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
GOOD_TEXT = st.text(STORABLE_CHARS, min_size=1, max_size=24)
CONTENT = GOOD_TEXT | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": GOOD_TEXT}), min_size=1, max_size=2
)
MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(sorted(CHAT_ROLES)), "content": CONTENT}),
    min_size=1,
    max_size=3,
)
SAMPLING = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 6_000),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "top_k": st.integers(0, 50),
        "seed": st.integers(0, MAX_SEED) | st.none(),
        "stop": GOOD_TEXT | st.lists(GOOD_TEXT, min_size=1, max_size=3),
    },
)
CUSTOM_ID = st.text(STORABLE_CHARS, min_size=1, max_size=18)


@st.composite
def simple_request(draw) -> dict:
    obj = draw(SAMPLING)
    obj.update(draw(st.sampled_from([{"prompt": draw(GOOD_TEXT)}, {"messages": draw(MESSAGES)}])))
    if draw(st.booleans()):
        obj["custom_id"] = draw(CUSTOM_ID)
    return obj


@st.composite
def openai_request(draw) -> dict:
    body = draw(SAMPLING)
    chat = draw(st.booleans())
    body.update({"messages": draw(MESSAGES)} if chat else {"prompt": draw(GOOD_TEXT)})
    extras = st.fixed_dictionaries(
        {},
        optional={
            "model": GOOD_TEXT,
            "n": st.just(1),
            "stream": st.just(False),  # a batch line is answered whole: only the neutral value
            "presence_penalty": st.floats(-2, 2),
            "logit_bias": st.dictionaries(st.integers(0, 5000).map(str), st.floats(-100, 100), max_size=3),
            "user": GOOD_TEXT,
        },
    )
    body.update(draw(extras))
    if "max_tokens" in body and draw(st.booleans()):
        body["max_completion_tokens"] = body.pop("max_tokens")
    url = "/v1/chat/completions" if chat else "/v1/completions"
    return {"custom_id": draw(CUSTOM_ID), "method": "POST", "url": url, "body": body}


def paths(obj, prefix: str = "") -> list[tuple[tuple, str]]:
    """Every (key path, field name as errors spell it) within a request object."""
    found = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for key, value in items:
        if isinstance(key, str):
            name = f"{prefix}.{key}" if prefix else key
        else:
            name = f"{prefix}[{key}]"
        found.append(((key,), name))
        if isinstance(value, dict | list):
            found += [((key, *sub), sub_name) for sub, sub_name in paths(value, name)]
    return found


def get_at(obj, path: tuple):
    for key in path:
        obj = obj[key]
    return obj


def replace_at(obj, path: tuple, value):
    if len(path) == 1:
        obj[path[0]] = value
    else:
        replace_at(obj[path[0]], path[1:], value)


@st.composite
def wrong_typed(draw) -> tuple[dict, str]:
    """A valid request with one field, anywhere in it, replaced by any JSON value."""
    obj = draw(simple_request() | openai_request())
    path, name = draw(st.sampled_from(paths(obj)))
    replace_at(obj, path, draw(ANY_JSON))
    return obj, name


def encode(obj, ensure_ascii: bool) -> bytes:
    # surrogatepass: a lone surrogate with ensure_ascii=False becomes raw (invalid) UTF-8 bytes
    return json.dumps(obj, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


PAYLOADS = st.sampled_from(
    [b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", BOM, b"\r", b"\n", b"NaN", b"Infinity", b"-Infinity",
     b"1e400", b"9" * 5000, b"[" * 70, b'"', b"\\", b"\\ud800", b"\\u0000", b",", b"}", b"{", b" ",
     b'"prompt": "dup", ', b'"custom_id": "dup", ', b"\xe2\x80\xa8"]
)


@st.composite
def mutated(draw, line: bytes) -> bytes:
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(line)))
        if draw(st.booleans()):
            line = line[:at] + draw(PAYLOADS) + line[at:]
        else:
            line = line[:at] + line[at + draw(st.integers(1, 8)) :]
    return line


@st.composite
def sized_line(draw) -> bytes:
    """A valid line of exactly a limit's size, or one byte either side of it."""
    limit = draw(st.sampled_from([SMALL.max_line_bytes, InputLimits().max_line_bytes]))
    size = limit + draw(st.integers(-1, 1))
    return b'{"prompt": "' + b"x" * (size - 14) + b'"}'


@st.composite
def a_line(draw, form: str) -> bytes:
    kinds = ["valid"] * 5 + ["wrong_type", "any_json", "bytes", "deep", "sized", "blank"]
    kind = draw(st.sampled_from(kinds))
    if kind == "blank":
        return draw(st.sampled_from([b"", b" ", b"\t", b"\r", b"  \r"]))
    if kind == "bytes":
        return draw(st.binary(max_size=60))
    if kind == "deep":
        depth = draw(st.integers(1, 200))
        return b'{"prompt": "a", "stop": ' + b"[" * depth + b'"x"' + b"]" * depth + b"}"
    if kind == "sized":
        return draw(sized_line())
    if kind == "any_json":
        obj = draw(ANY_JSON | st.dictionaries(FIELD_NAMES, ANY_JSON, max_size=5))
    elif kind == "wrong_type":
        obj, _ = draw(wrong_typed())
    else:
        obj = draw(simple_request() if form == "simple" else openai_request())
    line = encode(obj, draw(st.booleans()))
    return draw(mutated(line)) if draw(st.integers(0, 3)) == 0 else line


@st.composite
def job_file(draw, max_lines: int = 6) -> bytes:
    form = draw(st.sampled_from(["simple", "simple", "openai"]))
    lines = draw(st.lists(a_line(form), min_size=1, max_size=max_lines))
    data = b""
    for line in lines:
        data += line + draw(st.sampled_from([b"\n", b"\r\n"]))
    if not draw(st.booleans()):
        data = data.rstrip(b"\n")
    return (BOM if draw(st.integers(0, 5)) == 0 else b"") + data


FREE_TEXT = {"prompt", "content", "text", "stop", "custom_id", "model", "user"}
# As likely as not a character no database column takes: the store must never be handed one.
UNSTORABLE_OR_NASTY = st.integers(0, 3).flatmap(
    lambda kind: [NASTY, st.just("\x00"), st.sampled_from(["\ud800", "\udbff", "\udc00"]), GOOD_TEXT][kind]
)


@st.composite
def mostly_valid_file(draw) -> bytes:
    """Files the store gets to see: usually accepted, sometimes not."""
    form = draw(st.sampled_from(["simple", "openai"]))
    request = simple_request() if form == "simple" else openai_request()
    objs = draw(st.lists(request, min_size=1, max_size=4))
    for obj in objs:
        if draw(st.integers(0, 3)) == 0:  # a nasty string (NUL, lone surrogate, escape) in free text
            free = [p for p, _ in paths(obj) if FREE_TEXT & set(p) and isinstance(get_at(obj, p), str)]
            if free:
                replace_at(obj, draw(st.sampled_from(free)), draw(UNSTORABLE_OR_NASTY) + draw(GOOD_TEXT))
    lines = [encode(obj, draw(st.booleans())) for obj in objs]
    if draw(st.integers(0, 5)) == 0:
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = draw(mutated(lines[at]) | a_line(form))
    return b"\n".join(lines) + b"\n"


# -- the oracle -----------------------------------------------------------------------------


def physical_lines(data: bytes) -> list[bytes]:
    return (data[3:] if data.startswith(BOM) else data).split(b"\n")


def is_blank(line: bytes) -> bool:
    try:
        return not line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False


def timed_parse(run: Run, data: bytes, source: str, limits: InputLimits) -> Parsed | JobFileError:
    # The parser's own time: no collection of the test process's heap (hypothesis keeps a large
    # one on long runs; a collection landing in a parse cost it 0.4 s of CPU there).
    gc.disable()
    start = time.process_time()
    try:
        result = parse_job_file(data, source, limits)
    except JobFileError as error:
        result = error
    # Anything else (TypeError, RecursionError, UnicodeError, ...) propagates: the test fails.
    finally:
        gc.enable()
    elapsed = time.process_time() - start
    run.slowest_s = max(run.slowest_s, elapsed)
    limit = CASE_LIMIT_S + CASE_LIMIT_S_PER_MIB * len(data) / MIB
    assert elapsed < limit, f"one parse of {len(data):,} bytes took {elapsed:.2f} s of CPU"
    return result


def storable(text: str) -> bool:
    text.encode("utf-8")  # strict: a lone surrogate raises
    return "\x00" not in text


def check_accepted(parsed: Parsed, data: bytes) -> None:
    """A non-blank line's requests, one a choice (a completions line's prompts, an array of strings or
    one string, times its `n`), each what plain json.loads reads in that line; one custom id a line."""
    lines = [line for line in physical_lines(data) if not is_blank(line)]
    specs = list(parsed)
    ids = []
    for raw in lines:
        obj = json.loads(raw.decode("utf-8"))
        body = obj["body"] if "body" in obj else obj  # an accepted line has a body in the OpenAI form only
        prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [body.get("prompt")]
        n = body.get("n") or 1
        mine, specs = specs[: len(prompts) * n], specs[len(prompts) * n :]
        assert len(mine) == len(prompts) * n, "a line was dropped or split"
        assert [spec.choice for spec in mine] == list(range(len(prompts) * n))
        for spec in mine:
            check_spec(spec, obj, body, prompts[spec.choice // n])
        assert len({spec.custom_id for spec in mine}) == 1
        ids.append(mine[0].custom_id)
    assert not specs, "a line was dropped or split"
    assert len(set(ids)) == len(ids)


def check_spec(spec: RequestSpec, obj: dict, body: dict, prompt: str | None = None) -> None:
    if "prompt" in body:
        assert spec.prompt == prompt and not spec.messages
    else:
        assert spec.prompt is None
        assert [m.role for m in spec.messages] == [m["role"] for m in body["messages"]]
        for message, wanted in zip(spec.messages, body["messages"], strict=True):
            content = wanted["content"]
            if content is None:  # an assistant turn may hold tool calls instead of text
                assert message.role == "assistant" and message.content == ""
                continue
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            assert message.content == text
    if "custom_id" in obj:
        assert spec.custom_id == obj["custom_id"]
    asked = body.get("max_tokens")
    if asked is None and body is not obj:  # the OpenAI form's newer name
        asked = body.get("max_completion_tokens")
    if asked is None:
        assert spec.params.max_tokens_is_default
    else:
        assert spec.params.max_tokens == asked and not spec.params.max_tokens_is_default
    texts = [spec.custom_id, spec.prompt or "", spec.model or "", *spec.params.stop]
    texts += [m.content for m in spec.messages]
    assert all(storable(t) for t in texts), "accepted text that no database column takes"


def check_rejected(run: Run, error: JobFileError, data: bytes, source: str, limits: InputLimits) -> None:
    message = str(error)
    assert message.isprintable() and len(message) < 1_500, message[:300]
    assert message.startswith(source)
    lines = physical_lines(data)
    if error.line is None:
        assert any(s in message for s in ("no requests", "over the limit")), message
        return
    assert 1 <= error.line <= len(lines)
    assert error.field is None or error.field or "empty name" in message
    # The reported line is the first bad one: the lines before it make a valid file ...
    bom = BOM if data.startswith(BOM) else b""
    prefix = bom + b"\n".join(lines[: error.line - 1])
    if any(not is_blank(line) for line in lines[: error.line - 1]):
        assert isinstance(timed_parse(run, prefix, source, limits), tuple), message
    # ... and adding it brings back the same error.
    again = timed_parse(run, bom + b"\n".join(lines[: error.line]), source, limits)
    assert isinstance(again, JobFileError) and str(again) == message


def check_case(run: Run, data: bytes, limits: InputLimits, source: str = "fuzz.jsonl"):
    result = timed_parse(run, data, source, limits)
    if isinstance(result, tuple):
        check_accepted(result, data)
        run.outcomes["accepted"] += 1
    else:
        check_rejected(run, result, data, source, limits)
        run.outcomes["rejected"] += 1
    return result


# -- the parser ---------------------------------------------------------------------------


def test_parser_arbitrary_bytes(run):
    @fuzz_settings(FUZZ_EXAMPLES)
    @given(st.binary(max_size=400) | st.binary(max_size=400).map(lambda b: b'{"prompt": "' + b), LIMITS)
    def case(data, limits):
        check_case(run, data, limits)

    case()


def test_parser_bent_jsonl_files(run):
    @fuzz_settings(FUZZ_EXAMPLES)
    @given(job_file(), LIMITS)
    def case(data, limits):
        check_case(run, data, limits)

    case()


CROSS_FIELD_RULES = ("not both", "missing", "form", "differs", "unknown field")


def test_parser_wrong_type_in_every_field(run):
    """One field, anywhere, replaced by any JSON value: accepted, or refused naming that field."""

    @fuzz_settings(FUZZ_EXAMPLES)
    @given(wrong_typed(), st.booleans())
    def case(bent, ensure_ascii):
        obj, name = bent
        # Default limits: the request around the bent field is valid under them.
        result = check_case(run, encode(obj, ensure_ascii) + b"\n", InputLimits())
        if isinstance(result, JobFileError) and result.field is not None:
            field = result.field
            related = field == name or any(
                a.startswith(b + sep) for a, b in ((field, name), (name, field)) for sep in ".["
            )
            # A changed value can also break a rule about its neighbours (prompt and messages
            # together, url against body) or land in a new form; then the field it names differs.
            cross = any(s in result.message for s in CROSS_FIELD_RULES)
            assert related or cross, f"{name} was bent; the error names {field}: {result}"

    case()


ENORMOUS = {
    "a line of exactly 1 MiB": b'{"prompt": "' + b"x" * (MIB - 14) + b'"}',
    "a line of 1 MiB + 1": b'{"prompt": "' + b"x" * (MIB - 13) + b'"}',
    "50,000 lines": b'{"prompt": "p"}\n' * 50_000,
    "50,001 lines": b'{"prompt": "p"}\n' * 50_001,
    "nesting 300,000 deep": b'{"prompt": "a", "stop": ' + b"[" * 300_000 + b"]" * 300_000 + b"}",
    "1 MiB of [": b"[" * (MIB - 1),
    "a 1,000,000-digit integer": b'{"prompt": "a", "seed": ' + b"7" * 1_000_000 + b"}",
    "a 1,000,000-digit fraction": b'{"prompt": "a", "top_p": 0.' + b"1" * 1_000_000 + b"}",
    "a 1,000,000-digit float (overflows)": b'{"prompt": "a", "temperature": ' + b"1" * 1_000_000 + b".5}",
    "170,000 lone surrogates": b'{"prompt": "' + b"\\ud800" * 170_000 + b'"}',
    "60,000 keys, the last one twice": b'{"prompt": "a", '
    + b", ".join(b'"k%d": 1' % i for i in range(60_000))
    + b', "k1": 2}',
    "100,000 empty arrays": b'{"prompt": "a", "stop": [' + b"[], " * 100_000 + b"[]]}",
    "an over-size file": b" " * (200 * MIB + 1),
}


@pytest.mark.parametrize("name", list(ENORMOUS))
def test_parser_enormous_inputs(name, run):
    run.name = f"enormous input: {name}"
    result = check_case(run, ENORMOUS[name], InputLimits())
    valid = ("a line of exactly 1 MiB", "50,000 lines", "a 1,000,000-digit fraction")
    assert isinstance(result, tuple) == (name in valid)


# -- the store and the command: all or nothing --------------------------------------------


class InjectedFault(RuntimeError):
    """Raised from the submit's crash point: a failure midway through its transaction."""


def dump(path: Path) -> dict[str, list]:
    conn = sqlite3.connect(path)
    try:
        return {
            t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall()
            for t in ("tenants", "jobs", "requests")
        }
    finally:
        conn.close()


def check_stored(path: Path, before: dict, new_ids: list[int], parsed: list[Parsed]) -> None:
    """The table holds everything it held, plus exactly these jobs and their requests."""
    after = dump(path)
    for table in before:
        assert set(before[table]) <= set(after[table]), f"{table}: a row changed or vanished"
    assert len(after["jobs"]) - len(before["jobs"]) == len(parsed)
    conn = sqlite3.connect(path)
    try:
        for job_id, p in zip(new_ids, parsed, strict=True):
            (num,) = conn.execute("SELECT num_requests FROM jobs WHERE id = ?", (job_id,)).fetchone()
            rows = conn.execute(
                "SELECT idx, custom_id, prompt, messages, params, state FROM requests "
                "WHERE job_id = ? ORDER BY idx",
                (job_id,),
            ).fetchall()
            assert num == len(rows) == len(p)
            for (idx, custom_id, prompt, messages, params, state), (i, spec) in zip(
                rows, enumerate(p), strict=True
            ):
                assert (idx, custom_id, prompt, state) == (i, spec.custom_id, spec.prompt, "queued")
                wanted = [{"role": m.role, "content": m.content} for m in spec.messages] or None
                assert (json.loads(messages) if messages else None) == wanted
                params = json.loads(params)
                assert params["max_tokens"] == spec.params.max_tokens
                assert params["max_tokens_is_default"] == spec.params.max_tokens_is_default
    finally:
        conn.close()
    added = sum(len(p) for p in parsed)
    assert len(after["requests"]) - len(before["requests"]) == added


def test_store_takes_a_submit_whole_or_not_at_all(run, tmp_path, monkeypatch):
    path = tmp_path / "fsched.db"
    store = SqlJobStore(f"sqlite:///{path}")
    fault = {"at": None, "seen": 0}

    def crash_point(name: str) -> None:
        if name == "mid_submit":
            fault["seen"] += 1
            if fault["seen"] == fault["at"]:
                raise InjectedFault(f"injected at chunk {fault['seen']}")

    monkeypatch.setattr(submit_module, "crash_point", crash_point)

    @fuzz_settings(STORE_EXAMPLES)
    @given(
        st.lists(mostly_valid_file(), min_size=1, max_size=3),
        st.sampled_from(["alice", "bob", "carol", "not a tenant!"]),
        st.sampled_from([1_000_000, 1_000_000, 12]),
        st.sampled_from([None, 1, 2]),  # fail at the n-th file's insert
    )
    def case(files, tenant, queue_limit, fail_at):
        before = dump(path)
        parsed = [timed_parse(run, data, f"f{i}.jsonl", InputLimits()) for i, data in enumerate(files)]
        if any(isinstance(p, JobFileError) for p in parsed):
            run.outcomes["refused by the parser"] += 1  # the command stops here: nothing to store
            return
        fault.update(at=fail_at, seen=0)
        submissions = [JobSubmission(p, tenant, RequestClass.BATCH, 5, f"f{i}") for i, p in enumerate(parsed)]
        try:
            submitted = store.submit(submissions, max_queued_per_tenant=queue_limit)
        except (QueueFull, InjectedFault, ValueError) as refused:
            # Only these refusals are expected: a UnicodeEncodeError (a ValueError too) is a bug.
            if not isinstance(refused, QueueFull | InjectedFault):
                assert type(refused) is ValueError and tenant == "not a tenant!", repr(refused)
            assert dump(path) == before, f"refused ({refused}) but the table changed"
            run.outcomes[f"refused by the store ({type(refused).__name__})"] += 1
            return
        assert tenant != "not a tenant!"
        assert fail_at is None or fail_at > len(files), "the fault was injected but the submit went through"
        check_stored(path, before, [job.job_id for job in submitted], parsed)
        run.outcomes["stored whole"] += 1

    case()
    store.db.dispose()
    # Every kind of outcome happened at least once, so each check above was exercised.
    assert {"stored whole", "refused by the parser"} <= set(run.outcomes)
    assert any("InjectedFault" in k for k in run.outcomes) and any("QueueFull" in k for k in run.outcomes)


def test_command_takes_a_submit_whole_or_not_at_all(run, tmp_path):
    """`fsched submit` in a subprocess agrees with the in-process parse, and the table with it."""
    path = tmp_path / "state" / "fsched.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
    env.update(FSCHED_DB=f"sqlite:///{path}", USER="fuzzer", LOGNAME="fuzzer")
    env.update({f"FSCHED_{f.name.upper()}": str(getattr(SMALL, f.name)) for f in fields(SMALL)})
    SqlJobStore(f"sqlite:///{path}").db.dispose()
    counter = iter(range(10**9))

    @fuzz_settings(CLI_EXAMPLES)
    @given(st.lists(mostly_valid_file() | job_file(), min_size=1, max_size=2))
    def case(files):
        names = []
        for data in files:
            names.append(str(tmp_path / f"case{next(counter)}.jsonl"))
            Path(names[-1]).write_bytes(data)
        expected = [timed_parse(run, data, name, SMALL) for data, name in zip(files, names, strict=True)]
        before = dump(path)
        proc = subprocess.run([FSCHED, "submit", *names, "--json"], capture_output=True, env=env, timeout=60)
        errors = [e for e in expected if isinstance(e, JobFileError)]
        if errors:
            assert proc.returncode == 1 and proc.stdout == b""
            assert proc.stderr.decode() == f"fsched: error: {errors[0]}\n"
            assert dump(path) == before
            run.outcomes["refused"] += 1
        else:
            assert proc.returncode == 0, proc.stderr.decode()
            out = [json.loads(line) for line in proc.stdout.decode().splitlines()]
            assert [o["num_requests"] for o in out] == [len(p) for p in expected]
            check_stored(path, before, [o["job_id"] for o in out], expected)
            run.outcomes["stored whole"] += 1

    case()

"""fsched's front for vLLM's engine core: token ids in and out, one line a batch of news, no HTTP.

vLLM's API server spends most of a streamed token's CPU on HTTP, server-sent
events and its per-request output queues, even with `--tokens-only`. This
program takes its place in front of the engine core: it runs in vLLM's own
environment (it imports the standard library and vLLM, nothing of fsched, so
it runs as a file by vLLM's python), starts the engine core as vLLM's API
server does (vLLM's own engine arguments, `--model DIR ...`), and serves
fsched's daemons on one TCP port. What a daemon sends and receives is lines
of JSON (`encode` and `decode` below are the one definition of them):

- first, each side one line: the daemon `{"hello": PROTOCOL}`, the front
  `{"protocol", "model", "max_model_len", "max_num_seqs", "kv_tokens",
  "engine"}`, or `{"error": ...}` when the versions differ;
- the daemon: `["add", ID, BODY]` (BODY as the token interface's:
  `{"token_ids", "sampling_params"}` in vLLM's names) and `["abort", ID]`;
- the front: one line for every engine iteration that made news for the
  connection's requests, `[[ID, TOKENS, FINISH, LOGPROBS, ERROR], ...]`:
  the new token ids, the finish reason once it ends (`stop`, `length`),
  the tokens' logprobs as the token interface writes them, or an error
  (the engine refused the request, or failed it).

A connection that closes aborts its requests, as a client that leaves an
HTTP stream does. A request's `stream_interval` (batch work) sends its
tokens that many at a time, its first and last at once, as vLLM's API
server does: the engine's news still comes once an iteration, in one line.
`Core` is what the server needs of an engine; `VllmCore` is vLLM's engine
core through its own client (the tests run the server over a stand-in).
With `--metrics-port`, `MetricsServer` answers Prometheus' scrapes: the
front's counts and the engine core's figures, the latter under the names
vLLM's API server exports them by.

    python vllm_front.py --port 8200 [--metrics-port 8201] --model DIR [vLLM's engine arguments]
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

PROTOCOL = 1
TESTED_VLLM = "0.32"
# A daemon that has not read this much of its news (stopped, or stuck) is dropped: its requests are
# aborted in the engine and it resumes them from its table once it reads again (its connection gone).
MAX_UNREAD = 64 << 20
MAX_LINE = 64 << 20  # a line from a daemon at most (a prompt of a million tokens is about 7 MB)
log = logging.getLogger("fsched.vllm_front")

# One iteration's news for one request: (id, new token ids, finish reason, logprobs object, error).
News = tuple[str, list[int], str | None, dict | None, str | None]


# -- the wire ---------------------------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line of the wire."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Any:
    return json.loads(line)


class EngineRefused(Exception):
    """The engine refuses a request (its message goes to the daemon; retrying would not help)."""


class Core(Protocol):
    """An engine behind the front: requests added and aborted by id, its news an iteration at a time."""

    def info(self) -> dict: ...

    async def add(self, key: str, token_ids: list[int], sampling: dict) -> None: ...

    async def abort(self, keys: list[str]) -> None: ...

    async def news(self) -> list[News]: ...

    def figures(self) -> dict[int, dict]: ...  # /metrics: each engine's figures (`EngineFigures`' fields)


# -- the server --------------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class _Request:
    conn: _Conn
    id: str  # the daemon's
    interval: int = 1
    sent: bool = False  # its first tokens went
    held: list[int] = field(default_factory=list)  # made, held back until `interval` of them
    held_logprobs: list[dict] = field(default_factory=list)


class _Conn(asyncio.Protocol):
    def __init__(self, front: FrontServer, number: int):
        self.front, self.number = front, number
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.greeted = False
        self.keys: dict[str, str] = {}  # the daemon's id -> the engine's key
        self.closed = False
        self.failed = False  # told why it is closed: what it sends from then on is not read

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.front.gone(self)

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return
        self.buf += data
        if b"\n" not in data:
            if len(self.buf) > MAX_LINE:
                self.fail(f"a line over {MAX_LINE} bytes")
            return
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            try:
                message = decode(line)
            except (ValueError, RecursionError):
                self.fail("a line that is not JSON")
                return
            if self.failed:
                return
            if not self.greeted:
                self.hello(message)
            elif isinstance(message, list) and len(message) >= 2 and isinstance(message[1], str):
                self.front.commands.put_nowait((self, message))
            else:
                self.fail("a line that is neither an add nor an abort")
                return

    def hello(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("hello") != PROTOCOL:
            self.fail(f"this front speaks protocol {PROTOCOL}; the daemon sent {str(message)[:80]}")
            return
        self.greeted = True
        self.transport.write(encode({"protocol": PROTOCOL, **self.front.core.info()}))

    def fail(self, error: str, drop: bool = False) -> None:
        """Say why and close the connection (`drop`: at once, what is unsent lost: a daemon that does not
        read would hold it open)."""
        if self.transport is not None and not self.closed and not self.failed:
            self.failed = True
            self.transport.write(encode({"error": error}))
            (self.transport.abort if drop else self.transport.close)()


class FrontServer:
    """Serves one `Core` to any number of daemons on `host:port`."""

    def __init__(self, core: Core, max_unread: int = MAX_UNREAD):
        self.core = core
        self.max_unread = max_unread
        self.commands: asyncio.Queue = asyncio.Queue()
        self._requests: dict[str, _Request] = {}  # by engine key
        self._conns = 0
        self._live: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self.counts = FrontCounts()

    async def start(self, host: str, port: int) -> int:
        """Listen; the port (0 picks one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port)
        self._tasks = [asyncio.create_task(self._run_commands()), asyncio.create_task(self._pump())]
        return self._server.sockets[0].getsockname()[1]

    async def wait(self) -> None:
        """Until the engine fails (its error raised here: the program ends, and the daemons see their
        connections close and wait for the engine to come back)."""
        await asyncio.gather(*self._tasks)

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for conn in list(self._live):
            conn.transport.abort()

    @property
    def daemons(self) -> int:
        """Connections open now."""
        return len(self._live)

    @property
    def in_flight(self) -> int:
        """Requests in the engine through the front now."""
        return len(self._requests)

    def _accept(self) -> _Conn:
        self._conns += 1
        conn = _Conn(self, self._conns)
        self._live.add(conn)
        return conn

    def gone(self, conn: _Conn) -> None:
        self._live.discard(conn)
        if conn.keys:
            self.commands.put_nowait((conn, ["gone", ""]))

    async def _run_commands(self) -> None:
        """The daemons' adds and aborts, one at a time in the order they came (an abort after its add)."""
        while True:
            conn, message = await self.commands.get()
            try:
                await self._command(conn, message)
            except Exception as exc:  # an engine that cannot take it: that request's error, not the front's
                log.exception("command %s failed", message[:2])
                if message[0] == "add" and not conn.closed:
                    conn.transport.write(encode([[message[1], [], None, None, f"the front failed: {exc}"]]))

    async def _command(self, conn: _Conn, message: list) -> None:
        op, rid = message[0], message[1]
        if op == "add":
            body = message[2] if len(message) > 2 else None
            if conn.closed:
                return
            key = f"{conn.number}-{rid}"
            try:
                if rid in conn.keys:
                    raise EngineRefused(f"request id {rid} is in use on this connection")
                token_ids, sampling = _request_body(body)
                await self.core.add(key, token_ids, sampling)
            except EngineRefused as exc:
                self.counts.refused += 1
                conn.transport.write(encode([[rid, [], None, None, str(exc)]]))
                return
            self.counts.added += 1
            conn.keys[rid] = key
            self._requests[key] = _Request(conn, rid, max(1, int(sampling.get("stream_interval") or 1)))
        elif op == "abort":
            if (key := conn.keys.pop(rid, None)) is not None:
                self._requests.pop(key, None)
                self.counts.aborted += 1
                await self.core.abort([key])
        elif op == "gone":
            keys = list(conn.keys.values())
            conn.keys.clear()
            for key in keys:
                self._requests.pop(key, None)
            self.counts.aborted += len(keys)
            if keys:
                await self.core.abort(keys)
        else:
            conn.fail(f"unknown operation {op!r}")

    async def _pump(self) -> None:
        """Each iteration's news, one line to each connection it concerns."""
        requests, counts = self._requests, self.counts
        while True:
            news = await self.core.news()
            lines: dict[_Conn, list] = {}
            for key, tokens, finish, logprobs, error in news:
                r = requests.get(key)
                if r is None:
                    continue  # aborted meanwhile
                ended = finish is not None or error is not None
                if r.interval > 1 and r.sent and not ended:
                    r.held += tokens
                    if logprobs:
                        r.held_logprobs.append(logprobs)
                    if len(r.held) < r.interval:
                        continue
                    tokens, logprobs = r.held, _joined(r.held_logprobs)
                    r.held, r.held_logprobs = [], []
                elif r.held:
                    tokens = r.held + tokens
                    logprobs = _joined([*r.held_logprobs, *([logprobs] if logprobs else [])])
                    r.held, r.held_logprobs = [], []
                if not tokens and not ended:
                    continue
                r.sent = True
                lines.setdefault(r.conn, []).append([r.id, tokens, finish, logprobs, error])
                counts.tokens += len(tokens)
                if ended:
                    how = finish or "error"
                    counts.ended[how] = counts.ended.get(how, 0) + 1
                    del requests[key]
                    r.conn.keys.pop(r.id, None)
            for conn, entries in lines.items():
                if not conn.closed:
                    conn.transport.write(encode(entries))
                    if conn.transport.get_write_buffer_size() > self.max_unread:
                        log.warning("a daemon left over %d bytes of its news unread: dropped",
                                    self.max_unread)
                        counts.dropped += 1
                        conn.fail("news left unread past the front's bound", drop=True)


def _request_body(body: Any) -> tuple[list[int], dict]:
    if not isinstance(body, dict):
        raise EngineRefused("an add carries a body: {\"token_ids\", \"sampling_params\"}")
    token_ids, sampling = body.get("token_ids"), body.get("sampling_params")
    if not isinstance(token_ids, list) or not token_ids or not all(isinstance(t, int) for t in token_ids):
        raise EngineRefused("token_ids must be a non-empty list of token ids")
    if not isinstance(sampling, dict):
        raise EngineRefused("sampling_params must be an object")
    return token_ids, sampling


def _joined(parts: Sequence[dict]) -> dict | None:
    """Several iterations' logprobs objects as one (their entries in order)."""
    if not parts:
        return None
    return {"content": [entry for part in parts for entry in part.get("content") or ()]}


# -- figures for Prometheus --------------------------------------------------------------------------
@dataclass(slots=True)
class FrontCounts:
    """What the front did since it started (its own `fsched_front_*` metrics)."""

    added: int = 0  # requests the engine took
    refused: int = 0  # requests refused (by the engine's checks, or an id in use)
    aborted: int = 0  # requests the daemons ended early (an abort, or their connection gone)
    tokens: int = 0  # tokens sent to the daemons
    ended: dict[str, int] = field(default_factory=dict)  # requests that ran to their end: stop, length, error
    dropped: int = 0  # daemons dropped for leaving their news unread


@dataclass(slots=True)
class EngineFigures:
    """The engine core's own figures, as vLLM's API server exports them on its /metrics (the same names
    and meanings, so a dashboard made for vLLM reads the front's): from the scheduler's figures that come
    with each iteration's outputs, and from the outputs themselves."""

    running: int = 0  # vllm:num_requests_running
    waiting: int = 0  # vllm:num_requests_waiting (deferred ones included, as vLLM counts them)
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0 to 1
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found
    preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (cached ones not)
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by vLLM's finish reason


# name, type, help, and the field read (of the front's counts or the engine's figures; None: counted now)
_FRONT_METRICS = (
    ("fsched_front_daemons", "gauge", "Daemons connected.", None),
    ("fsched_front_requests", "gauge", "Requests in the engine through the front.", None),
    ("fsched_front_requests_added_total", "counter", "Requests the engine took.", "added"),
    ("fsched_front_requests_refused_total", "counter", "Requests refused, each with its reason.", "refused"),
    ("fsched_front_requests_aborted_total", "counter", "Requests the daemons ended early.", "aborted"),
    ("fsched_front_tokens_total", "counter", "Tokens sent to the daemons.", "tokens"),
    ("fsched_front_daemons_dropped_total", "counter", "Daemons dropped for news left unread.", "dropped"),
)
_ENGINE_METRICS = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "running"),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "waiting"),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
    ("vllm:prefix_cache_queries_total", "counter",
     "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
     "prefix_cache_hits"),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
     "preemptions"),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
     "generation_tokens"),
)


def metrics_text(front: FrontServer, model: str) -> str:
    """Prometheus' text format: the front's counts, and the engine's figures labelled as vLLM labels them
    (`model_name`, `engine`)."""
    counts = front.counts
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.extend((f"# HELP {name} {help_}", f"# TYPE {name} {kind}"))
        out.extend(f"{name}{labels} {value!r}" for labels, value in samples)

    live = {"fsched_front_daemons": front.daemons, "fsched_front_requests": front.in_flight}
    for name, kind, help_, attr in _FRONT_METRICS:
        metric(name, kind, help_, [("", live[name] if attr is None else getattr(counts, attr))])
    metric("fsched_front_requests_ended_total", "counter", "Requests that ran to their end, by how it came.",
           [(f'{{reason="{_label(reason)}"}}', n) for reason, n in sorted(counts.ended.items())])
    # One set of figures an engine core (several with vLLM's data parallelism), each labelled with its index.
    engines = [(f'model_name="{_label(model)}",engine="{index}"', figures)
               for index, figures in sorted(front.core.figures().items())]
    for name, kind, help_, attr in _ENGINE_METRICS:
        metric(name, kind, help_, [(f"{{{labels}}}", figures[attr]) for labels, figures in engines])
    metric("vllm:request_success_total", "counter", "Count of successfully processed requests.",
           [(f'{{{labels},finished_reason="{_label(reason)}"}}', n)
            for labels, figures in engines for reason, n in sorted(figures["finished"].items())])
    return "\n".join(out) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsServer:
    """`GET /metrics` (Prometheus' text format) and `GET /health` on a port of their own: HTTP/1.1, one
    request a connection, a request's head within `timeout_s` and 16 KiB, at most `max_connections`
    open at once (more are answered 503 and closed: a port often opened wider than the daemons' must not
    let idle connections take the process's file descriptors, which the daemons' connections need)."""

    def __init__(self, front: FrontServer, model: str, timeout_s: float = 10.0, max_connections: int = 64):
        self.front, self.model, self.timeout_s = front, model, timeout_s
        self.max_connections = max_connections
        self.open = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _MetricsConn(self), host, port)
        return self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def answer(self, head: bytes) -> tuple[str, str, str]:
        """A request's head -> its status line, content type and body."""
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", "text/plain", "not an HTTP request\n"
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if path not in (b"/metrics", b"/health"):
            return "404 Not Found", "text/plain", "the front serves /metrics and /health\n"
        if method not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", "text/plain", "GET or HEAD\n"
        if path == b"/health":
            return "200 OK", "text/plain", "ok\n"
        return "200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics_text(self.front, self.model)


class _MetricsConn(asyncio.Protocol):
    def __init__(self, server: MetricsServer):
        self.server = server
        self.buf = b""
        self.transport = None
        self.timer = None
        self.answered = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.server.open >= self.server.max_connections:
            self._send("503 Service Unavailable", "text/plain", "too many connections\n")
            return
        self.server.open += 1
        self.timer = asyncio.get_running_loop().call_later(self.server.timeout_s, transport.abort)

    def connection_lost(self, exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.server.open -= 1

    def data_received(self, data: bytes) -> None:
        if self.answered:  # one request a connection: what follows is read and dropped
            return
        self.buf += data
        if b"\r\n\r\n" not in self.buf and b"\n\n" not in self.buf:
            if len(self.buf) > 16 << 10:
                self._send("431 Request Header Fields Too Large", "text/plain", "header over 16 KiB\n")
            return
        status, kind, body = self.server.answer(self.buf)
        self._send(status, kind, body, self.buf.startswith(b"HEAD "))

    def eof_received(self) -> bool:
        return False  # the client is done: the transport closes

    def _send(self, status: str, kind: str, body: str, head_only: bool = False) -> None:
        """The answer, then this side's end of the connection; what the client still sends (a body, say)
        is read and dropped until it closes or a second passes: closed with bytes unread, the kernel would
        reset the connection, and the client could lose the answer."""
        self.answered = True
        data = body.encode()
        self.transport.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\n"
                             f"Connection: close\r\n\r\n".encode() + (b"" if head_only else data))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(1.0, self.transport.close)


# -- vLLM's engine core ---------------------------------------------------------------------------------
class VllmCore:
    """vLLM's engine core through vLLM's own client (the one its API server uses), without the output
    processor: news is read as the engine core sends it, an iteration at a time."""

    def __init__(self, engine_args):
        self.engine_args = engine_args
        self.llm = None
        self._tasks: tuple = ()
        self.engines: dict[int, EngineFigures] = {}  # by the engine core's index (data parallelism)
        self._preempted = None  # vLLM's event type for a preemption, once started

    async def start(self) -> None:
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM

        if not vllm.__version__.startswith(TESTED_VLLM):
            log.warning("vLLM %s: this front was built and tested against vLLM %s.x", vllm.__version__,
                        TESTED_VLLM)
        self.llm = AsyncLLM.from_engine_args(self.engine_args)
        if self.llm.output_handler is not None:  # its output processor's reader: the front reads instead
            self.llm.output_handler.cancel()
        self._tasks = await self.llm.get_supported_tasks()
        try:
            from vllm.v1.engine import EngineCoreEventType

            self._preempted = EngineCoreEventType.PREEMPTED
        except (ImportError, AttributeError) as exc:
            log.warning("no engine figures for /metrics under this vLLM (%s)", exc)

    def info(self) -> dict:
        config = self.llm.vllm_config
        cache = config.cache_config
        blocks = cache.num_gpu_blocks or 0
        model = config.model_config
        name = model.served_model_name
        return {"model": (name[0] if isinstance(name, list) else name) or model.model,
                "max_model_len": model.max_model_len,
                "max_num_seqs": config.scheduler_config.max_num_seqs,
                "kv_tokens": blocks * cache.block_size if blocks else None,
                "engine": f"vLLM {__import__('vllm').__version__}"}

    async def add(self, key: str, token_ids: list[int], sampling: dict) -> None:
        import msgspec
        from vllm.exceptions import VLLMClientError
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        try:
            params = msgspec.convert(sampling, SamplingParams, strict=False)
            params.output_kind = RequestOutputKind.DELTA
            # vLLM's own checks of a request (its parameters, the prompt's ids against the vocabulary,
            # its length against the context) are the API server's; they raise the request's error.
            request = self.llm.input_processor.process_inputs(key, tokens_input(token_ids), params,
                                                              supported_tasks=self._tasks)
        except (VLLMClientError, ValueError, TypeError, msgspec.ValidationError) as exc:
            raise EngineRefused(str(exc)) from None
        await self.llm.engine_core.add_request_async(request)

    async def abort(self, keys: list[str]) -> None:
        await self.llm.engine_core.abort_requests_async(keys)

    def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()

    def figures(self) -> dict[int, dict]:
        engines = self.engines or {0: EngineFigures()}
        return {index: {name: getattr(e, name) for name in EngineFigures.__slots__}
                for index, e in engines.items()}

    async def news(self) -> list[News]:
        outputs = await self.llm.engine_core.get_output_async()
        if self._preempted is not None:
            self._record(outputs)
        out = []
        for o in outputs.outputs:
            finish = error = None
            if o.finish_reason is not None:
                reason = str(o.finish_reason)
                if reason in ("stop", "length"):
                    finish = reason
                else:  # abort or error: the engine ended it on its own
                    error = f"the engine ended the request ({reason})"
            out.append((o.request_id, o.new_token_ids,
                        finish, _logprobs(o.new_logprobs) if o.new_logprobs is not None else None, error))
        return out

    def _record(self, outputs) -> None:
        """The iteration's figures (vLLM's scheduler sends its own with the outputs, as its logger reads
        them). Under a vLLM whose outputs differ, the figures stop, not the front."""
        try:
            figures = self.engines.get(outputs.engine_index)
            if figures is None:
                figures = self.engines[outputs.engine_index] = EngineFigures()
            if (stats := outputs.scheduler_stats) is not None:
                figures.running = stats.num_running_reqs
                figures.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
                figures.kv_cache_usage = stats.kv_cache_usage
                figures.prefix_cache_queries += stats.prefix_cache_stats.queries
                figures.prefix_cache_hits += stats.prefix_cache_stats.hits
            for o in outputs.outputs:
                figures.generation_tokens += len(o.new_token_ids)
                if o.prefill_stats is not None:
                    figures.prompt_tokens += o.prefill_stats.num_computed_tokens
                if o.events:
                    figures.preemptions += sum(event.type == self._preempted for event in o.events)
                if o.finish_reason is not None:
                    reason = str(o.finish_reason)
                    figures.finished[reason] = figures.finished.get(reason, 0) + 1
        except AttributeError as exc:
            log.warning("the engine's figures stop here (this vLLM's outputs differ: %s)", exc)
            self._preempted = None


def _logprobs(lists) -> dict:
    """vLLM's logprobs lists (a row a token: the sampled token, then the `logprobs` likeliest, which may
    hold it again) as the token interface's logprobs object: the sampled token, and the likeliest as its
    alternatives, all of them (vLLM's HTTP interface cuts them to `logprobs` with the sampled one)."""
    ids, values = lists.logprob_token_ids.tolist(), lists.logprobs.tolist()
    return {"content": [
        {"token_id": row_ids[0], "logprob": row[0],
         "top_logprobs": [{"token_id": t, "logprob": v} for t, v in zip(row_ids[1:], row[1:], strict=True)]}
        for row_ids, row in zip(ids, values, strict=True)]}


def main(argv: list[str] | None = None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="fsched's front for vLLM's engine core")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve GET /metrics (Prometheus) and /health on this port")
    parser.add_argument("--metrics-host", default=None, help="the metrics' address (default: --host)")
    AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def serve() -> None:
        stop = stop_on_signals()  # from the start: a SIGTERM while the engine starts stops it too
        core = VllmCore(AsyncEngineArgs.from_cli_args(args))
        try:
            await core.start()
            front = FrontServer(core)
            port = await front.start(args.host, args.port)
            model = core.info()["model"]
            metrics = None
            if args.metrics_port is not None:
                metrics = MetricsServer(front, model)
                host = args.metrics_host or args.host
                print(f"metrics on http://{host}:{await metrics.start(host, args.metrics_port)}/metrics",
                      flush=True)
            print(f"fsched's vLLM front serves {model} on front://{args.host}:{port}", flush=True)
            try:
                await until_stopped(front, stop)
            finally:
                if metrics is not None:
                    metrics.close()
        finally:
            core.shutdown()  # the engine core's processes end with the front's

    asyncio.run(serve())


def stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set from now on (in the running loop), instead of ending the process."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def until_stopped(front: FrontServer, stop: asyncio.Event) -> None:
    """Serve until `stop` is set (then stop serving) or until the engine fails (its error raised)."""
    failed, stopped = asyncio.ensure_future(front.wait()), asyncio.ensure_future(stop.wait())
    await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if failed.done():
        await front.stop()
        failed.result()
    else:
        failed.cancel()
        await front.stop()


if __name__ == "__main__":
    sys.exit(main())

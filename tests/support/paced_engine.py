"""A paced stand-in engine: an OpenAI-compatible server that computes nothing, at a fixed pace.

What the throughput and latency benchmarks put in front of fsched, and
what a direct client is measured against: `slots` streams run at once, each
gets one token per iteration (`step_s`, e.g. 20 ms, so 50 tok/s a stream
and slots / step_s tok/s in all), and requests beyond the slots wait their
turn first come, first served, as an engine's batch does. A request joins
the next iteration and gets its first token at that iteration's end.

It speaks what fsched asks of an engine (`/v1/completions` with token-id
prompts, `stream: true`, `return_token_ids`, chunked server-sent events
ending with `data: [DONE]`, as vLLM sends them), streamed and whole
`/v1/chat/completions` (for a direct SDK client), `/health`, `/v1/models`
and `/metrics` (its batch as `max_num_seqs`). Its tokens are the fake
engine's (`fake_token`, greedy or sampled), so outputs are checkable with
`expected_tokens`; a stream stops at EOS (unless `ignore_eos`), at a stop
token or at max_tokens; a client that goes away frees its slot. A request's
`stream_interval` (vLLM's, in the body) sends its tokens that many to a
chunk, the first and the last at once.

One asyncio loop serves every connection and writes every stream's token
in one pass per iteration; nothing runs per stream but its own bytes, so
it keeps its pace at 1,024 slots x 20 ms (51,200 tok/s) on one core.

Run alone: `python -m tests.support.paced_engine --port 8012 --slots 1024 --step-ms 20`
(prints its URL). In a test: `with PacedEngine(slots=4) as engine: engine.url`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from fsched.core import stamps
from fsched.core.runners.standin import STANDIN_EOS, standin_encode
from fsched.core.runners.vllm_front import EngineRefused, FrontServer
from tests.support.fake_engine import draw_seed, fake_token


@dataclass(slots=True, eq=False)
class _Stream:
    conn: _Conn
    context: list[int]
    max_tokens: int
    seed: int | None
    greedy: bool
    stops: frozenset[int]
    min_tokens: int
    chat: bool
    streamed: bool
    head: bytes  # the event's JSON up to the choice's fields
    include_usage: bool = False
    prompt_tokens: int = 0
    interval: int = 1  # tokens a chunk carries (vLLM's `stream_interval`): the first and last go at once
    n: int = 0
    out: list[int] = field(default_factory=list)  # a whole (not streamed) answer's tokens
    unsent: list[int] = field(default_factory=list)  # made, waiting for its interval's chunk
    gone: bool = False
    key: str | None = None  # a request that came through the front (`front_port`): its key there


class _Conn(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests parsed from bytes, keep-alive."""

    def __init__(self, engine: PacedEngine):
        self.engine = engine
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.stream: _Stream | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.stream is not None:
            self.stream.gone = True
            self.engine.aborted += 1
            self.stream = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.stream is None and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            length = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            method, path = (head[0].split(" ") + ["", ""])[:2]
            if stamps.enabled():  # a benchmark's client tagged its request: when it got here
                stamps.stamp_tagged("client_engine_arrived", headers.get(stamps.TAG_HEADER))
            self.engine.handle(self, method, path, body)

    def reply(self, status: int, payload, content_type: str = "application/json") -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
        self.transport.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def start_events(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _event(s: _Stream, tokens: list[int], finish: bytes) -> bytes:
    """The HTTP chunk of one event carrying `tokens` (chat's delta, or completions' text and ids)."""
    text = b"".join([b" w%d" % t for t in tokens])
    if s.chat:
        choice = b'"delta":{"content":"%s"}' % text
    else:
        choice = b'"text":"%s","token_ids":[%s]' % (text, b",".join([b"%d" % t for t in tokens]))
    return _chunk(b'data: %s%s,"finish_reason":%s}]}\n\n' % (s.head, choice, finish))


class PacedEngine:
    """The server, on its own thread and event loop; `close()` stops it."""

    def __init__(self, slots: int = 256, step_s: float = 0.02, port: int = 0, model: str = "paced-engine",
                 context: int = 8192, vocab: int | None = None, eos: int = STANDIN_EOS,
                 front_port: int | None = None):
        self.slots, self.step_s, self.model = slots, step_s, model
        self.context, self.vocab, self.eos = context, vocab, eos
        self.running: list[_Stream] = []
        self.waiting: deque[_Stream] = deque()
        self.tokens_sent = 0
        self.requests = 0
        self.aborted = 0
        self.max_running = 0
        self.late_ticks = 0  # iterations that started more than one step late (the engine fell behind)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._port = port
        self._front_port = front_port
        self._front: _PacedCore | None = None
        self._front_server: FrontServer | None = None
        self._thread = threading.Thread(target=self._serve, name="paced-engine", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def front_url(self) -> str | None:
        """fsched's vLLM front over this engine's iterations (given `front_port`), else None."""
        return None if self._front_port is None else f"front://127.0.0.1:{self._front_port}"

    def __enter__(self) -> PacedEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            if self._front_server is not None:
                asyncio.run_coroutine_threadsafe(self._front_server.stop(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def wait(self) -> None:
        self._thread.join()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(self._loop.create_server(
            lambda: _Conn(self), "127.0.0.1", self._port, backlog=4096))
        self._port = server.sockets[0].getsockname()[1]
        if self._front_port is not None:
            self._front = _PacedCore(self)
            self._front_server = FrontServer(self._front)
            self._front_port = self._loop.run_until_complete(self._front_server.start("127.0.0.1",
                                                                                     self._front_port))
        self._loop.call_soon(self._tick, time.monotonic())
        self._ready.set()
        self._loop.run_forever()
        server.close()

    # -- requests --------------------------------------------------------------------
    def handle(self, conn: _Conn, method: str, path: str, body: bytes) -> None:
        if method == "GET":
            return self._get(conn, path)
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return conn.reply(400, {"error": {"message": "invalid JSON"}})
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return conn.reply(404, {"error": {"message": "not found"}})
        stream = self._stream_of(conn, request, chat=path == "/v1/chat/completions")
        if isinstance(stream, str):
            return conn.reply(400, {"error": {"message": stream}})
        self.requests += 1
        conn.stream = stream
        if stream.streamed:
            conn.start_events()
            if stream.chat:
                role = b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
                conn.transport.write(_chunk(b"data: " + stream.head + role))
        self.waiting.append(stream)

    def _get(self, conn: _Conn, path: str) -> None:
        if path == "/health":
            conn.reply(200, "", "text/plain")
        elif path == "/v1/models":
            conn.reply(200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "max_model_len": self.context}]})
        elif path == "/metrics":
            conn.reply(200, f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{1 << 20}",'
                            f'max_num_seqs="{self.slots}"}} 1.0\n', "text/plain")
        else:
            conn.reply(404, {"error": {"message": "not found"}})

    def _stream_of(self, conn: _Conn, body: dict, chat: bool) -> _Stream | str:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return "messages must be a non-empty list"
            prompt = standin_encode(messages=[{"role": m.get("role"), "content": str(m.get("content"))}
                                              for m in messages])
        else:
            prompt = body.get("prompt")
            if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
                return "prompt must be a list of token ids"
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        if len(prompt) + max_tokens > self.context:
            return (f"This model's maximum context length is {self.context} tokens. However, you requested "
                    f"{len(prompt) + max_tokens} tokens.")
        kind = "chat.completion.chunk" if chat else "text_completion"
        prefix = "chatcmpl" if chat else "cmpl"
        head = (f'{{"id":"{prefix}-{self.requests}","object":"{kind}","created":{int(time.time())},'
                f'"model":{json.dumps(self.model)},"choices":[{{"index":0,').encode()
        stops = frozenset(body.get("stop_token_ids") or ()) | (
            frozenset() if body.get("ignore_eos") else frozenset({self.eos}))
        interval = body.get("stream_interval") or 1
        if not isinstance(interval, int) or interval < 1:
            return "stream_interval must be an integer >= 1"
        return _Stream(conn, list(prompt), max_tokens, body.get("seed"),
                       float(body.get("temperature", 1.0)) == 0, stops, int(body.get("min_tokens") or 0),
                       chat, bool(body.get("stream")), head,
                       bool((body.get("stream_options") or {}).get("include_usage")), len(prompt), interval)

    # -- iterations ------------------------------------------------------------------
    def _tick(self, due: float) -> None:
        """One iteration: every running stream's next token, then the waiting take the free slots."""
        running = []
        for s in self.running:
            if not s.gone and self._advance(s):
                running.append(s)
        while self.waiting and len(running) < self.slots:
            s = self.waiting.popleft()
            if not s.gone:
                running.append(s)
        self.running = running
        self.max_running = max(self.max_running, len(running))
        if self._front is not None and self._front.made:
            self._front.iteration()
        now = time.monotonic()
        due += self.step_s
        if due < now - self.step_s:
            self.late_ticks += 1
            due = now
        self._loop.call_at(due, self._tick, due)

    def _advance(self, s: _Stream) -> bool:
        """Send `s` its next token; whether it runs on."""
        seed = s.seed if s.greedy else draw_seed(s.seed, s.n)
        token = fake_token(seed, s.context, self.vocab, self.eos)
        if s.n < s.min_tokens and token in s.stops:
            token = (token + 1) % (self.vocab or 50_000) or 1
        s.context.append(token)
        s.n += 1
        self.tokens_sent += 1
        ended = token in s.stops
        done = ended or s.n >= s.max_tokens
        finish = (b'"stop"' if ended else b'"length"') if done else b"null"
        if s.key is not None:
            end = ("stop" if ended else "length") if done else None
            self._front.made.append((s.key, [token], end, None, None))
        elif not s.streamed:
            s.out.append(token)
        else:
            s.unsent.append(token)
            if done or s.n == 1 or len(s.unsent) >= s.interval:
                s.conn.transport.write(_event(s, s.unsent, finish))
                s.unsent = []
        if done:
            self._end(s, finish)
        return not done

    def _end(self, s: _Stream, finish: bytes) -> None:
        if s.key is not None:
            self._front.ended(s.key)
            return
        s.conn.stream = None
        usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.n,
                 "total_tokens": s.prompt_tokens + s.n}
        if not s.streamed:
            s.conn.reply(200, self._whole(s, finish.decode().strip('"'), usage))
        else:
            if s.include_usage:
                s.conn.transport.write(_chunk(b"data: " + s.head[: s.head.index(b'"choices"')]
                                              + b'"choices":[],"usage":' + json.dumps(usage).encode()
                                              + b"}\n\n"))
            s.conn.transport.write(_DONE)
        if s.conn.buf:  # a pipelined request waited for this one
            s.conn.data_received(b"")

    def _whole(self, s: _Stream, finish: str, usage: dict) -> dict:
        text = "".join(f" w{t}" for t in s.out)
        base = json.loads(s.head.decode() + '"x":0}]}')
        choice = {"index": 0, "finish_reason": finish}
        if s.chat:
            base["object"] = "chat.completion"
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, token_ids=s.out)
        return {**base, "choices": [choice], "usage": usage}


class _PacedCore:
    """The engine's iterations as fsched's vLLM front's `Core` (core/runners/vllm_front.py): a request
    added there waits and runs in the same slots as the HTTP ones, and each iteration's tokens for the
    front's requests go to it at once, as vLLM's engine core sends an iteration's outputs."""

    def __init__(self, engine: PacedEngine):
        self.engine = engine
        self.made: list = []  # this iteration's news
        self.by_key: dict[str, _Stream] = {}
        self.queue: asyncio.Queue = asyncio.Queue()

    def info(self) -> dict:
        e = self.engine
        return {"model": e.model, "max_model_len": e.context, "max_num_seqs": e.slots,
                "kv_tokens": 16 << 20, "engine": "paced stand-in"}

    async def add(self, key: str, token_ids: list[int], sampling: dict) -> None:
        e = self.engine
        max_tokens = int(sampling.get("max_tokens") or 16)
        if len(token_ids) + max_tokens > e.context:
            raise EngineRefused(f"This model's maximum context length is {e.context} tokens. However, you "
                                f"requested {len(token_ids) + max_tokens} tokens.")
        stops = frozenset(sampling.get("stop_token_ids") or ()) | (
            frozenset() if sampling.get("ignore_eos") else frozenset({e.eos}))
        s = _Stream(None, list(token_ids), max_tokens, sampling.get("seed"),  # type: ignore[arg-type]
                    float(sampling.get("temperature", 1.0)) == 0, stops, int(sampling.get("min_tokens") or 0),
                    False, True, b"", prompt_tokens=len(token_ids), key=key)
        e.requests += 1
        self.by_key[key] = s
        e.waiting.append(s)

    async def abort(self, keys: list[str]) -> None:
        for key in keys:
            if (s := self.by_key.pop(key, None)) is not None:
                s.gone = True
                self.engine.aborted += 1

    def ended(self, key: str) -> None:
        self.by_key.pop(key, None)

    def iteration(self) -> None:
        self.queue.put_nowait(self.made)
        self.made = []

    async def news(self) -> list:
        return await self.queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8012)
    parser.add_argument("--front-port", type=int, default=None,
                        help="also serve the engine's iterations to fsched daemons through fsched's vLLM "
                             "front on this port (0: any free one; its front:// URL is printed second)")
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=None)
    args = parser.parse_args()
    engine = PacedEngine(args.slots, args.step_ms / 1000, args.port, context=args.context, vocab=args.vocab,
                         front_port=args.front_port)
    print(engine.url, flush=True)
    if engine.front_url is not None:
        print(engine.front_url, flush=True)
    engine.wait()


if __name__ == "__main__":
    main()

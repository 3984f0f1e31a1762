"""A stand-in OpenAI-compatible engine: what the quick tests run instead of vLLM.

It serves `/v1/completions` the way vLLM does for what fsched asks of it
(token-id prompts, `stream: true`, `return_token_ids: true`, server-sent
events ending with `data: [DONE]`), plus `/health`, `/v1/models` and
`/metrics`. Its tokens are a pure function of (seed, context, position):
- greedy (temperature 0): the stand-in model's token after the context
  (`standin_token(seed, context)`), so resuming from prompt + generated
  continues exactly, and outputs equal the built-in stand-in runner's;
- sampled: the seed is mixed with the draw's index within the stream, as an
  engine whose per-request generator restarts with every request does.

A stream stops at EOS (unless `ignore_eos`; not before `min_tokens`), at a
stop token (`stop_token_ids`), at max_tokens, or when the client disconnects
(the request is then aborted, as vLLM does). With `logprobs: k` each chunk
carries vLLM's completions `logprobs` object, tokens written `token_id:N` (what
`return_tokens_as_token_ids` asks): made-up values, a pure function of the
context. Given a `tokenizer` (a model folder), it honours `response_format`
as vLLM does, with llguidance: its token is the hashed one when the grammar
allows it, else one of the allowed ones chosen by the same hash, and the
stream ends when the grammar is complete. Given a `script` (prompt ids -> the answer's ids, or None),
a request without response_format writes that answer, then EOS: a scripted model that decides to call
a tool. A prompt that is an earlier scripted prompt plus the start of its answer (a resume) goes on
with that answer where it stopped. Faults: `restart(down_s)` drops every
connection and stops listening for a while; `refuse` makes chosen requests
fail with HTTP 400; a prompt plus max_tokens over `context` is refused with
vLLM's kind of message.

It serves vLLM's token interface too (`POST /inference/v1/generate`, as
`vllm serve --tokens-only` does): `{"token_ids", "sampling_params", "stream"}`
in, events whose one choice carries `token_ids` out, logprobs as integer ids
(the sampled token first, then the others, `max(k, 1)` in all), the same
tokens as the completions stream for the same request. `bodies` records
every request in the completions shape (the token interface's
`sampling_params` at the top, `token_ids` as `prompt`, `structured_outputs`
as `response_format`), `apis` which interface each came by. With
`token_interface=False` that path answers 404, as an engine without it does.
A request's `stream_interval` (vLLM's: in the body, or in `sampling_params`)
sends its tokens that many to an event, the first and the last at once;
`chunk_sizes` records how many tokens each event carried.

Run alone: `python -m tests.support.fake_engine --port 8011`.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fsched.core.runners.standin import STANDIN_EOS, _hash, standin_token


def fake_token(seed: int | None, context: list[int], vocab: int | None, eos: int) -> int:
    """The token after `context`; the built-in stand-in's when `vocab` is None."""
    if vocab is None:
        return standin_token(seed, context)
    digest = _hash(f"{seed}|{len(context)}|{context[-1] if context else 0}")
    return eos if digest % 500 == 0 else 3 + digest % (vocab - 3)


def draw_seed(seed: int | None, index: int) -> int:
    return _hash(f"draw|{seed}|{index}") % (2**31)


def expected_tokens(prompt: list[int], max_tokens: int, seed: int | None, vocab: int | None = None,
                    eos: int = STANDIN_EOS, temperature: float = 0.0) -> list[int]:
    """What one uninterrupted stream returns (tests compare against it)."""
    context, out = list(prompt), []
    while len(out) < max_tokens:
        s = seed if temperature == 0 else draw_seed(seed, len(out))
        token = fake_token(s, context, vocab, eos)
        context.append(token)
        out.append(token)
        if token == eos:
            break
    return out


class _Flight:
    """A stream counted in flight (`FakeEngine.in_flight`) until its last token is made, as an engine frees
    a sequence's slot: the client reads the last event and may open its next stream before this thread
    has written the rest and ended (counted until then, the two overlapped by one)."""

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.landed = False

    def land(self) -> None:
        if not self.landed:
            self.landed = True
            with self.engine._lock:
                self.engine.in_flight -= 1


class FakeEngine:
    def __init__(self, port: int = 0, model: str = "fake-engine", context: int = 8192,
                 vocab: int | None = None,
                 eos: int = STANDIN_EOS, step_s: float = 0.0, kv_tokens: int | None = None,
                 refuse: Callable[[dict], str | None] | None = None, tokenizer: str | None = None,
                 script: Callable[[list[int]], list[int] | None] | None = None, token_interface: bool = True):
        self.model, self.context, self.vocab, self.eos = model, context, vocab, eos
        self.token_interface = token_interface
        self.tokenizer, self.script = tokenizer, script
        self.scripted: dict[tuple[int, ...], list[int]] = {}  # each scripted prompt's answer
        self.step_s, self.kv_tokens, self.refuse = step_s, kv_tokens, refuse
        self.port = port
        self.bodies: list[dict] = []  # every completion request received (in the completions shape)
        self.apis: list[str] = []  # the interface each came by: "completions" or "tokens"
        self.aborted = 0  # streams the client left before their end
        self.in_flight = 0
        self.max_in_flight = 0
        self.tokens_sent = 0
        self.chunk_sizes: list[int] = []  # tokens in each event sent
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening and drop every connection (streams end mid-way, as in a crash)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restart(self, down_s: float) -> None:
        """Crash now and come back after `down_s` seconds (in the background)."""
        self.stop()
        timer = threading.Timer(down_s, self.start)
        timer.daemon = True
        timer.start()

    # -- serving -------------------------------------------------------------------------
    def generate(self, handler: BaseHTTPRequestHandler, request: dict) -> None:
        """The token interface: the same stream as `completion`, asked and answered in its shape."""
        sampling, tokens = request.get("sampling_params"), request.get("token_ids")
        if not isinstance(sampling, dict) or not isinstance(tokens, list) or not tokens:
            return handler.reply(422, {"detail": [{"msg": "token_ids and sampling_params are required"}]})
        if not request.get("stream"):
            return handler.reply(400, {"error": {"message": "this stand-in engine only streams"}})
        body = {**sampling, "model": request.get("model"), "prompt": tokens, "stream": True}
        wanted = sampling.get("structured_outputs")
        if wanted is not None:
            body["response_format"] = ({"type": "json_object"} if wanted.get("json_object") else
                                       {"type": "json_schema", "json_schema": {"schema": wanted["json"]}})
        self.completion(handler, body, api="tokens")

    def completion(self, handler: BaseHTTPRequestHandler, body: dict, api: str = "completions") -> None:
        prompt, max_tokens = body.get("prompt"), int(body.get("max_tokens") or 16)
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return handler.reply(400, {"error": {"message": "prompt must be a list of token ids"}})
        if len(prompt) + max_tokens > self.context:
            return handler.reply(400, {"error": {"message": (
                f"This model's maximum context length is {self.context} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.")}})
        if self.refuse is not None and (message := self.refuse(body)) is not None:
            return handler.reply(400, {"error": {"message": message}})
        with self._lock:
            self.bodies.append(body)
            self.apis.append(api)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        flight = _Flight(self)
        try:
            self._stream(handler, prompt, max_tokens, body, api == "tokens", flight)
        except OSError:
            with self._lock:
                self.aborted += 1
        finally:
            flight.land()

    def _stream(self, handler, prompt: list[int], max_tokens: int, body: dict, tokens_api: bool,
                flight: _Flight) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        seed, temperature = body.get("seed"), float(body.get("temperature", 1.0))
        context, n, finish = list(prompt), 0, "length"
        grammar = self._grammar(body.get("response_format"))
        answer = self._answer(prompt) if grammar is None and self.script is not None else None
        stops = set(body.get("stop_token_ids") or ()) | ({self.eos} if not body.get("ignore_eos") else set())
        interval = int(body.get("stream_interval") or 1)
        unsent: list[tuple[int, dict | None]] = []  # tokens made and their logprobs, not yet sent
        while n < max_tokens:
            if self.step_s and select.select([handler.connection], [], [], self.step_s)[0]:
                raise ConnectionAbortedError("the client went away")  # EOF while it waited: abort
            s = seed if temperature == 0 else draw_seed(seed, n)
            token = fake_token(s, context, self.vocab, self.eos)
            if answer is not None:
                start, tokens = answer
                token = tokens[len(context) - start] if len(context) - start < len(tokens) else self.eos
            if n < int(body.get("min_tokens") or 0) and token in stops:
                token = (token + 1) % (self.vocab or 50_000) or 1
            if grammar is not None:
                token = grammar.choose(token)
            context.append(token)
            n += 1
            ended = token in stops or (grammar is not None and grammar.done)
            done = ended or n >= max_tokens
            finish = "stop" if ended else "length"
            logprobs = None
            if body.get("logprobs") is not None:
                logprobs = (fake_generate_logprobs if tokens_api else fake_logprobs)(token, context,
                                                                                     int(body["logprobs"]))
            unsent.append((token, logprobs))
            if done:
                flight.land()  # its last token made: the client that reads it may open its next stream
            if done or n == 1 or len(unsent) >= interval:
                self._send(handler, unsent, finish if done else None, tokens_api)
                unsent = []
            if done:
                break
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()

    def _send(self, handler, made: list[tuple[int, dict | None]], finish: str | None, tokens_api: bool
              ) -> None:
        """One event carrying the tokens `made` (and their logprobs, the lists of each joined)."""
        tokens = [token for token, _ in made]
        logprobs = None
        if made[0][1] is not None:
            logprobs = {key: [x for _, lp in made for x in lp[key]] for key in made[0][1]}
        if tokens_api:
            handler.event({"request_id": "generate-tokens-fake", "usage": None, "output_mode": "tokens",
                           "choices": [{"index": 0, "finish_reason": finish, "stop_reason": None,
                                        "token_ids": tokens, "logprobs": logprobs}]})
        else:
            choice = {"index": 0, "text": "".join(f" w{t}" for t in tokens), "token_ids": tokens,
                      "finish_reason": finish}
            if logprobs is not None:
                choice["logprobs"] = logprobs
            handler.event({"id": "cmpl-fake", "object": "text_completion", "model": self.model,
                           "choices": [choice]})
        with self._lock:  # counted once written: a test that sees the count can read the tokens
            self.tokens_sent += len(tokens)
            self.chunk_sizes.append(len(tokens))

    def _answer(self, prompt: list[int]) -> tuple[int, list[int]] | None:
        """(where the answer starts in `prompt`'s context, its ids) for a scripted prompt or its resume."""
        with self._lock:
            for first, tokens in self.scripted.items():
                k = len(first)
                if tuple(prompt[:k]) == first and prompt[k:] == tokens[:len(prompt) - k]:
                    return k, tokens
        tokens = self.script(prompt)
        if tokens is None:
            return None
        with self._lock:
            self.scripted[tuple(prompt)] = tokens
        return len(prompt), tokens

    def _grammar(self, response_format: dict | None):
        if response_format is None:
            return None
        if self.tokenizer is None:
            raise ValueError("this stand-in engine was given no tokenizer: it cannot honour response_format")
        return _Grammar(self.tokenizer, self.vocab, response_format)

    def metrics(self) -> str:
        if self.kv_tokens is None:
            return "# no cache metrics\n"
        return f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{self.kv_tokens // 16}"}} 1.0\n'


def fake_logprobs(token: int, context: list[int], k: int) -> dict:
    """vLLM's completions `logprobs` object for one token (ids as `token_id:N`), made up from the context."""
    digest = _hash(f"lp|{len(context)}|{token}")
    chosen = -(digest % 1000) / 1000
    top = {f"token_id:{token}": chosen}
    for i in range(1, k + 1):  # vLLM sends the k likeliest and the chosen one
        top[f"token_id:{1 + (digest + i * 7919) % 1999}"] = chosen - i
    return {"tokens": [f"token_id:{token}"], "token_logprobs": [chosen], "top_logprobs": [top],
            "text_offset": [0]}


def fake_generate_logprobs(token: int, context: list[int], k: int) -> dict:
    """The token interface's `logprobs` object for one token: the values of `fake_logprobs` as integer
    ids, the sampled token first, `max(k, 1)` entries in all (as vLLM cuts them)."""
    top = fake_logprobs(token, context, k)["top_logprobs"][0]
    entries = [{"token_id": int(t.removeprefix("token_id:")), "logprob": lp} for t, lp in top.items()]
    return {"content": [{"token_id": token, "logprob": top[f"token_id:{token}"],
                         "top_logprobs": entries[: max(k, 1)]}]}


class _Grammar:
    """One stream's grammar: the stand-in engine's tokens, bent to what the grammar allows."""

    def __init__(self, tokenizer: str, vocab: int | None, response_format: dict):
        import llguidance
        import llguidance.hf
        from transformers import AutoTokenizer

        from fsched.core.grammar import GrammarSource
        from fsched.core.grammar.llg import grammar_text
        from fsched.core.types import ResponseFormat, ResponseFormatType

        hf = AutoTokenizer.from_pretrained(tokenizer)
        self.vocab = vocab or len(hf)
        kind = ResponseFormatType(response_format["type"])
        fmt = (ResponseFormat.json_schema(response_format["json_schema"]["schema"])
               if kind is ResponseFormatType.JSON_SCHEMA else ResponseFormat(kind))
        lltok = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab)
        self.matcher = llguidance.LLMatcher(lltok, grammar_text(GrammarSource.of(fmt)), log_level=0)

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped()

    def choose(self, token: int) -> int:
        mask = self.matcher.compute_bitmask()
        allowed = [t for t in range(self.vocab) if mask[t // 8] >> (t % 8) & 1]
        if token not in allowed:
            token = allowed[token % len(allowed)]
        self.matcher.consume_token(token)
        return token


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a daemon opens its whole batch at once (the default backlog is 5)


def _handler(engine: FakeEngine):
    class Handler(BaseHTTPRequestHandler):
        def setup(self) -> None:
            super().setup()
            with engine._lock:
                engine._conns.add(self.connection)

        def finish(self) -> None:
            with engine._lock:
                engine._conns.discard(self.connection)
            try:
                super().finish()
            except OSError:
                pass

        def log_message(self, *args) -> None:  # quiet
            pass

        def reply(self, status: int, payload, content_type: str = "application/json") -> None:
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def event(self, payload: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, "", "text/plain")
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [
                    {"id": engine.model, "object": "model", "max_model_len": engine.context}]})
            elif self.path == "/metrics":
                self.reply(200, engine.metrics(), "text/plain")
            else:
                self.reply(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.reply(400, {"error": {"message": "invalid JSON"}})
            if self.path == "/inference/v1/generate" and engine.token_interface:
                return engine.generate(self, body)
            if self.path != "/v1/completions":
                return self.reply(404, {"error": {"message": "not found"}})
            engine.completion(self, body)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--eos", type=int, default=STANDIN_EOS)
    parser.add_argument("--step-ms", type=float, default=0.0)
    args = parser.parse_args()
    engine = FakeEngine(args.port, context=args.context, vocab=args.vocab, eos=args.eos,
                        step_s=args.step_ms / 1000)
    print(engine.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()

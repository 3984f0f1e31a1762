"""fsched's vLLM front (core/runners/vllm_front.py, its real server) over a stand-in engine core.

What the quick tests run instead of vLLM's engine core behind the front: the
server's code is the front's own, and `FakeCore` makes the tokens the
stand-in HTTP engine makes (tests/support/fake_engine.py) for the same
request, so `--model standin --engine front://...` stores exactly what the
built-in stand-in stores: greedy tokens are the stand-in model's, sampled
ones mix the seed with the draw's index; a request ends at a stop token
(`stop_token_ids`; not before `min_tokens`) or at max_tokens; logprobs
are the stand-in engine's token-interface objects. An iteration every
`step_s` makes one token for every request in it (none: as fast as the
loop goes). A prompt plus max_tokens over `context` is refused with the
engine's kind of message, and `refuse(body)` refuses chosen requests.

`FakeFront` serves it on a loopback port from a thread of its own:
`bodies` records each request in the completions shape (as the stand-in
engine's does), `apis` is "front" for each; `stop()` drops every connection
and stops listening, `restart(down_s)` comes back after a while.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from fsched.core.runners.standin import STANDIN_EOS
from fsched.core.runners.vllm_front import EngineRefused, FrontServer, News
from tests.support.fake_engine import draw_seed, fake_generate_logprobs, fake_token


@dataclass(slots=True, eq=False)
class _Sequence:
    key: str
    context: list[int]
    max_tokens: int
    min_tokens: int
    seed: int | None
    temperature: float
    stops: frozenset[int]
    logprobs: int | None
    made: int = 0
    out: list[int] = field(default_factory=list)


class FakeCore:
    """A stand-in engine core: the stand-in engine's tokens, one a request an iteration."""

    def __init__(self, front: FakeFront):
        self.front = front
        self.running: dict[str, _Sequence] = {}
        self.woken = asyncio.Event()

    def figures(self) -> dict[int, dict]:
        """Each engine's figures as the real core reports them: engine 0 with this stand-in's own running
        requests and generated tokens, then what `FakeFront.engine_figures` says by engine."""
        zero = {"running": 0, "waiting": 0, "kv_cache_usage": 0.0, "prefix_cache_queries": 0,
                "prefix_cache_hits": 0, "preemptions": 0, "prompt_tokens": 0, "generation_tokens": 0,
                "finished": {}}
        mine = {**zero, "running": len(self.running), "generation_tokens": self.front.tokens_sent}
        overrides = self.front.engine_figures
        return {index: {**(mine if index == 0 else zero), **overrides.get(index, {})}
                for index in sorted({0, *overrides})}

    def info(self) -> dict:
        f = self.front
        return {"model": f.model, "max_model_len": f.context, "max_num_seqs": None, "kv_tokens": f.kv_tokens,
                "engine": "stand-in"}

    async def add(self, key: str, token_ids: list[int], sampling: dict) -> None:
        f = self.front
        max_tokens = int(sampling.get("max_tokens") or 16)
        if len(token_ids) + max_tokens > f.context:
            raise EngineRefused(
                f"This model's maximum context length is {f.context} tokens. However, you requested "
                f"{len(token_ids) + max_tokens} tokens ({len(token_ids)} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.")
        body = {**sampling, "prompt": token_ids, "stream": True}
        if f.refuse is not None and (message := f.refuse(body)) is not None:
            raise EngineRefused(message)
        f.bodies.append(body)
        f.apis.append("front")
        f.max_in_flight = max(f.max_in_flight, len(self.running) + 1)
        stops = frozenset(sampling.get("stop_token_ids") or ())
        lp = sampling.get("logprobs")
        self.running[key] = _Sequence(key, list(token_ids), max_tokens, int(sampling.get("min_tokens") or 0),
                                      sampling.get("seed"), float(sampling.get("temperature", 1.0)), stops,
                                      None if lp is None else int(lp))
        self.woken.set()

    async def abort(self, keys: list[str]) -> None:
        for key in keys:
            if self.running.pop(key, None) is not None:
                self.front.aborted += 1

    async def news(self) -> list[News]:
        while not self.running:
            self.woken.clear()
            await self.woken.wait()
        await asyncio.sleep(self.front.step_s)
        out: list[News] = []
        for s in list(self.running.values()):
            seed = s.seed if s.temperature == 0 else draw_seed(s.seed, s.made)
            token = fake_token(seed, s.context, None, STANDIN_EOS)
            if s.made < s.min_tokens and token in s.stops:
                token = (token + 1) % 50_000 or 1
            s.context.append(token)
            s.made += 1
            ended = token in s.stops
            finish = "stop" if ended else "length" if s.made >= s.max_tokens else None
            logprobs = None if s.logprobs is None else fake_generate_logprobs(token, s.context, s.logprobs)
            out.append((s.key, [token], finish, logprobs, None))
            self.front.tokens_sent += 1
            if finish is not None:
                del self.running[s.key]
        return out


class FakeFront:
    def __init__(self, step_s: float = 0.0, context: int = 8192, kv_tokens: int | None = None,
                 model: str = "fake-front", refuse: Callable[[dict], str | None] | None = None):
        self.step_s, self.context, self.kv_tokens = step_s, context, kv_tokens
        self.model, self.refuse = model, refuse
        self.bodies: list[dict] = []
        self.apis: list[str] = []
        self.aborted = 0
        self.tokens_sent = 0
        self.max_in_flight = 0  # requests in the engine at once, at most
        self.engine_figures: dict[int, dict] = {}  # what `FakeCore.figures` says beyond its own, by engine
        self.port = 0
        self.metrics_port: int | None = None  # `serve_metrics()`: the front's /metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: FrontServer | None = None
        self._metrics = None
        self.start()

    @property
    def url(self) -> str:
        return f"front://127.0.0.1:{self.port}"

    def start(self) -> None:
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def begin() -> None:
                self._server = FrontServer(FakeCore(self))
                self.port = await self._server.start("127.0.0.1", self.port)
                started.set()

            loop.run_until_complete(begin())
            loop.run_forever()
            loop.close()

        threading.Thread(target=run, daemon=True).start()
        if not started.wait(10):
            raise RuntimeError("the stand-in front did not start")

    def serve_metrics(self, timeout_s: float = 10.0, max_connections: int = 64) -> int:
        """Start the front's metrics server (its /metrics and /health) on a port of its own; the port."""
        from fsched.core.runners.vllm_front import MetricsServer

        metrics = self._metrics = MetricsServer(self._server, self.model, timeout_s, max_connections)
        started = asyncio.run_coroutine_threadsafe(metrics.start("127.0.0.1", 0), self._loop)
        self.metrics_port = started.result(10)
        return self.metrics_port

    def stop(self) -> None:
        """Stop listening and drop every connection (a crashed front: its engine's requests are gone)."""
        loop, server = self._loop, self._server
        if loop is None:
            return
        self._loop = self._server = None
        if self._metrics is not None:
            loop.call_soon_threadsafe(self._metrics.close)
            self._metrics = None
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    def restart(self, down_s: float) -> None:
        self.stop()
        timer = threading.Timer(down_s, self.start)
        timer.daemon = True
        timer.start()

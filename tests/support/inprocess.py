"""`fsched serve` and a daemon inside the test's own process, over an in-memory job table.

No socket, no subprocess, no database, and nothing that waits on a clock:
- `SteppedDaemon` is the real daemon loop (core/daemon) with the stand-in
  runner over a `MemoryTable`'s queue, on a fake clock, and it moves only
  when stepped;
- `InProcessServer` is the real app (api/app.py) driven through an ASGI
  transport. Its progress hub reads open requests' progress as fast as it
  can (no poll interval), and each of those reads first takes one daemon
  step (`SteppingServing`): a request that waits for tokens gets them as
  the server looks. Work no request waits on (a batch) runs when the test
  says: `daemon.run_until_idle()`.
- `AsgiCall` is one request whose response is read as it comes, and whose
  client can hang up in the middle (what httpx's ASGI transport cannot do).

The app's store calls still run on worker threads (as in a server); they
wait on each other, never on the clock, and the in-memory table's lock makes
each call atomic beside the daemon's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

import httpx

from fsched.api.app import create_app
from fsched.api.state import Backend
from fsched.core.daemon.engine import Engine
from fsched.core.daemon.loop import Daemon, DaemonConfig
from fsched.core.ports.memory import MemoryTable
from fsched.core.ports.records import FirstTokens, RequestProgress, TenantTotals
from fsched.core.ports.serving import ServingStore
from fsched.core.runners.standin import STANDIN_NAME, StandInRunner
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestStatus
from tests.fakes import FakeClock

TICK_S = 0.001  # the fake clock moves this much at every read: time passes as the daemon works
METRICS_PORT = 9109  # the port the app is told /metrics is on (a scope's, no listening socket)
MAX_STEPS = 200_000  # a daemon still busy after this many steps is stuck: the test fails


class SteppedDaemon:
    """One daemon over the table's queue, stepped by whoever calls `step` (one at a time)."""

    def __init__(self, table: MemoryTable, clock: FakeClock, max_batch: int = 32,
                 runner: StandInRunner | None = None):
        runner = runner or StandInRunner()
        config = SchedulerConfig(max_batch=max_batch, kv_tokens=32_768, step_tokens=512)
        engine = Engine(runner, Scheduler(config, "fsched", table.queue.tenant_weights()),
                        runner.context_length, clock=clock)
        # A long lease: the fake clock moves with every read of it, and a test may read the table
        # many times between two steps; the daemon must not look dead meanwhile.
        self.daemon = Daemon(
            table.queue, engine, lambda c: runner.encode(c.prompt_text, c.messages, c.render),
            DaemonConfig(owner="stepped", host="test", pid=0, device="standin", model=STANDIN_NAME,
                         policy="fsched", until_idle=True, lease_s=3600.0),
            clock=clock, sleep=clock.advance,
        )
        self._lock = threading.Lock()
        self.daemon.start()

    def step(self) -> bool:
        """One pass of the daemon's loop; True when nothing is left to do."""
        with self._lock:
            return self.daemon.step()

    def run_until_idle(self) -> None:
        for _ in range(MAX_STEPS):
            if self.step():
                return
        raise AssertionError(f"the daemon is still busy after {MAX_STEPS} steps")

    def stop(self) -> None:
        """Hand back what it holds and say goodbye (it reads as stopped)."""
        with self._lock:
            self.daemon.shutdown()


class SteppingServing:
    """The table's serving reads, each progress read after one daemon step."""

    def __init__(self, serving: ServingStore, daemon: SteppedDaemon):
        self.serving = serving
        self.daemon = daemon

    def progress(self, job_ids: Sequence[int]) -> dict[int, tuple[RequestProgress, ...]]:
        self.daemon.step()
        return self.serving.progress(job_ids)

    def progress_states(self, job_ids: Sequence[int]) -> dict[int, tuple[tuple[RequestStatus, int], ...]]:
        return self.serving.progress_states(job_ids)

    def tenant_totals(self) -> list[TenantTotals]:
        return self.serving.tenant_totals()

    def first_tokens(self, since: float) -> dict[RequestClass, FirstTokens]:
        return self.serving.first_tokens(since)


class InProcessServer:
    """The HTTP app over `table` (and a stepped daemon, when given), used as `async with`."""

    def __init__(self, table: MemoryTable, daemon: SteppedDaemon | None = None, **options):
        backend = Backend.of(table)
        if daemon is not None:
            backend = replace(backend, serving=SteppingServing(table.serving, daemon))
        options.setdefault("metrics_port", METRICS_PORT)
        self.app = create_app(backend, poll_s=0.0, link=False, **options)
        self.state = self.app.state.fsched
        self._hub: asyncio.Task | None = None

    async def __aenter__(self) -> InProcessServer:
        # The hub alone of the app's background tasks: the others (the charts' sampler, the batch
        # expiry sweep) run on timers; a test calls what they call itself.
        self._hub = asyncio.create_task(self.state.hub.run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._hub.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._hub

    def http(self, key: str | None = None, port: int = 80) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                 base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60)

    def metrics(self) -> httpx.AsyncClient:
        """A client of the metrics listener (the port the app was told)."""
        return self.http(port=METRICS_PORT)

    def openai(self, key: str):
        import openai

        return openai.AsyncOpenAI(api_key=key, base_url="http://127.0.0.1/v1", max_retries=0,
                                  http_client=self.http())

    def call(self, method: str, path: str, key: str | None = None, body: dict | bytes | None = None
             ) -> AsgiCall:
        return AsgiCall(self.app, method, path, key, body)


class AsgiCall:
    """One request to an ASGI app: its response read as it comes, its client free to hang up."""

    def __init__(self, app, method: str, path: str, key: str | None, body: dict | bytes | None):
        headers = [(b"content-type", b"application/json")]
        if key:
            headers.append((b"authorization", f"Bearer {key}".encode()))
        self.body = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
        self.scope = {"type": "http", "http_version": "1.1", "method": method, "path": path,
                      "raw_path": path.encode(), "query_string": b"", "headers": headers, "scheme": "http",
                      "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 50000), "root_path": ""}
        self.messages: asyncio.Queue = asyncio.Queue()
        self._gone = asyncio.Event()
        self._body_sent = False
        self.task = asyncio.ensure_future(app(self.scope, self._receive, self.messages.put))

    async def _receive(self) -> dict:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def status(self) -> int:
        start = await self.messages.get()
        assert start["type"] == "http.response.start", start
        return start["status"]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces as the app sends them, until its last."""
        while True:
            message = await self.messages.get()
            yield message.get("body", b"")
            if not message.get("more_body"):
                return

    async def hang_up(self) -> None:
        """The client goes away: the app hears a disconnect; wait for it to finish."""
        self._gone.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@dataclass
class Served:
    """A server and its daemon over one in-memory table, on one fake clock."""

    table: MemoryTable
    daemon: SteppedDaemon
    server: InProcessServer
    clock: FakeClock

    def key(self, tenant: str, request_class: str = "streaming", admin: bool = False) -> str:
        """A new API key of `tenant` (the key itself, as a client sends it)."""
        return self.table.keys.create_key(tenant, RequestClass(request_class), admin=admin)[1]

    def counts(self) -> dict[str, int]:
        """Rows per table that only an accepted request may add to."""
        rows = self.table.rows
        return {"jobs": len(rows.jobs), "requests": len(rows.requests), "tenants": len(rows.tenants),
                "files": len(rows.files), "batches": len(rows.batches), "api_keys": len(rows.api_keys)}

    def snapshot(self) -> dict[str, list[str]]:
        """Every row of the tables a request may add to (what "the table is unchanged" compares)."""
        rows = self.table.rows
        tables = {"jobs": rows.jobs, "requests": rows.requests, "files": rows.files, "batches": rows.batches}
        return {name: sorted(map(repr, table.values())) for name, table in tables.items()}


@contextlib.asynccontextmanager
async def served(runner: StandInRunner | None = None, **options) -> AsyncIterator[Served]:
    """A server (options: `create_app`'s) with a stepped daemon (over `runner`, the stand-in's by
    default) over a new in-memory table; the clock starts at the wall clock's time, so times a client
    sees read as today's."""
    clock = FakeClock(time.time(), tick=TICK_S)
    table = MemoryTable(clock)
    daemon = SteppedDaemon(table, clock, runner=runner)
    async with InProcessServer(table, daemon, **options) as server:
        yield Served(table, daemon, server, clock)

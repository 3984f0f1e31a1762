"""What serve spends per streamed token between a daemon's link line and the SSE bytes on a client's socket.

    .venv/bin/python bench/serve_path.py [--streams 32] [--tokens 200] [--rounds 5] [--endpoint chat]

In one process, no sockets: `--streams` chat (or completions) streams are
opened as the streaming routes open them (their stream rules, their relay,
their response object, a transport that counts the bytes written), and a
daemon's link is played to the link reader (`api/link.py`) as synthetic
lines, one `Steps` line a step giving every stream one token, then each its
`End`. A step's bytes must all be written before the next line is fed.
Process CPU time per token over the steps, each round on fresh streams; the
median and the best of `--rounds` are printed, so other processes' load
counts little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fsched.api import online as api_online  # noqa: E402
from fsched.api.guard import Guard  # noqa: E402
from fsched.api.hub import ProgressHub  # noqa: E402
from fsched.api.link import LinkClient, _Peer  # noqa: E402
from fsched.api.slowclients import BODY  # noqa: E402
from fsched.core.jobs.apikeys import ApiKey  # noqa: E402
from fsched.core.openai.online import parse_online  # noqa: E402
from fsched.core.ports import link as wire  # noqa: E402
from fsched.core.types import Endpoint, RequestClass, RequestStatus  # noqa: E402

KEY = ApiKey("k1", "alice", RequestClass.REALTIME, "a key", "hash", 0.0)
TOKEN = " word"


class _Transport:
    """Counts what a stream writes (through either of serve's protocol's body extensions); never pauses."""

    def __init__(self) -> None:
        self.bytes = 0
        self.writes = 0

    async def body(self, data: bytes) -> None:
        self.bytes += len(data)
        self.writes += 1

    def now(self, render, *arg) -> bool:  # (render) before the outlet took an argument, (render, arg) since
        data = render(*arg)
        self.bytes += len(data)
        self.writes += 1
        return True


class _Writer:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def _state(hub: ProgressHub, link: LinkClient):
    async def call(fn, *args):
        return fn(*args)

    async def live():
        return [object()]

    async def read_key(key_id):
        return KEY

    jobs = SimpleNamespace(cancel_job=lambda job_id: None)
    keys = SimpleNamespace(get_key=lambda key_id: KEY)
    return SimpleNamespace(hub=hub, link=link, guard=Guard(), metrics=None, call=call, live_daemons=live,
                           read_key=read_key, backend=SimpleNamespace(jobs=jobs, keys=keys))


def _body(endpoint: Endpoint) -> str:
    body = {"model": "m", "stream": True, "max_tokens": 10_000}
    if endpoint is Endpoint.CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "A"
    return json.dumps(body)


async def _round(endpoint: Endpoint, streams: int, tokens: int) -> tuple[float, int]:
    hub = ProgressHub(lambda ids: {}, interval_s=3600)
    link = LinkClient(hub)
    state = _state(hub, link)
    never = asyncio.Event()

    async def receive():
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    online = parse_online(_body(endpoint), endpoint, KEY)
    transports, serving = [], []
    for job in range(1, streams + 1):
        link._open[job] = True
        hub.expect_push(job)
        request = SimpleNamespace(receive=receive)
        progress = api_online._updates(state, job, KEY)
        response = await api_online.stream_response(request, state, endpoint, job, online, progress)
        transport = _Transport()
        scope = {"type": "http", "method": "POST", "path": "/", "client": ("b", 1),
                 "extensions": {BODY: transport.body, "fsched.body_now": transport.now}}
        transports.append(transport)
        serving.append(asyncio.ensure_future(response(scope, receive, send)))
    await asyncio.sleep(0)
    reader = asyncio.StreamReader(limit=1 << 26)
    peer = link._peers["bench"] = _Peer("bench", _Writer())
    reading = asyncio.ensure_future(link._read(peer, reader))
    reader.feed_data(wire.encode([wire.Hello(wire.VERSION)]))
    jobs = range(1, streams + 1)
    times = [(1.0, 0.5)] + [None] * tokens  # with a request's first text only, as a daemon sends them
    lines = [wire.encode([wire.Steps([wire.StepText(j, str(j), step * len(TOKEN), TOKEN, step + 1,
                                                    times[step]) for j in jobs])]) for step in range(tokens)]
    for _ in range(5):
        await asyncio.sleep(0)
    start = time.process_time()
    for line in lines:
        before = sum(t.writes for t in transports)
        reader.feed_data(line)
        while sum(t.writes for t in transports) < before + streams:
            await asyncio.sleep(0)
    used = time.process_time() - start
    text = TOKEN * tokens
    reader.feed_data(wire.encode([wire.End(j, str(j), RequestStatus.FINISHED_STOPPED, text, tokens, 3, None,
                                           "m", 1.0, 0.5, 2.0) for j in jobs]))
    await asyncio.wait_for(asyncio.gather(*serving), 60)
    reader.feed_eof()
    await reading
    return used / (streams * tokens) * 1e6, sum(t.bytes for t in transports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    args = parser.parse_args()
    endpoint = Endpoint.CHAT if args.endpoint == "chat" else Endpoint.COMPLETIONS
    costs = []
    for _ in range(args.rounds):
        cost, written = asyncio.run(_round(endpoint, args.streams, args.tokens))
        costs.append(cost)
    print(f"serve path, {args.endpoint}, {args.streams} streams x {args.tokens} tokens: "
          f"median {statistics.median(costs):.1f} µs/token, best {min(costs):.1f} "
          f"(rounds: {', '.join(f'{c:.1f}' for c in costs)}; {written:,} bytes a round)")


if __name__ == "__main__":
    main()

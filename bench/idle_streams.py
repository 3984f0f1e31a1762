"""What serve's open streams cost by the second: the progress hub and the stream rules alone, in one process.

    .venv/bin/python bench/idle_streams.py [--streams 32] [--step-s 2.0] [--seconds 10]

`--streams` streams follow their jobs as a streaming route follows them
(api/guard.py's rules over the hub, the defaults of `fsched serve`), each
announced on a link; every `--step-s` a daemon's push gives each one token,
which its text sink takes (as a stream's socket write would). The key's and
the daemons' reads go to a worker thread, as serve's do; the linked
requests' table check reads states that never pass the pushes. Prints the
process CPU per second (all threads). To compare two trees, run it with
`PYTHONPATH` pointing at a folder whose `fsched` links to each.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import anyio.to_thread

from fsched.api.guard import Guard, StreamRules, guarded
from fsched.api.hub import ProgressHub
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.ports.records import RequestProgress
from fsched.core.types import RequestClass, RequestStatus

KEY = ApiKey(id="k1", tenant="t", request_class=RequestClass.REALTIME, name="", secret_hash="",
             created_at=0.0)


async def _read_key(key_id: str) -> ApiKey:
    return await anyio.to_thread.run_sync(lambda: KEY)


async def _live() -> int:
    return await anyio.to_thread.run_sync(lambda: 1)


def _progress(job_id: int, text: str) -> tuple[RequestProgress, ...]:
    return (RequestProgress("r", job_id, RequestStatus.RUNNING, text, len(text), 0.0, None, None, None),)


async def run(streams: int, step_s: float, seconds: float) -> float:
    hub = ProgressHub(lambda ids: {}, read_states=lambda ids: {i: ((RequestStatus.RUNNING, 1),) for i in ids})
    guard = Guard(StreamRules())
    poller = asyncio.create_task(hub.run())

    async def follow(job_id: int) -> None:
        hub.expect_push(job_id)
        async for _ in guarded(hub, guard, job_id, KEY, _read_key, _live):
            pass

    tasks = [asyncio.create_task(follow(j)) for j in range(streams)]
    await asyncio.sleep(0.1)
    for j in range(streams):
        hub.attach(j, lambda choices: True, lambda text: True)
    text = ""
    began, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - began < seconds:
        text += "x"
        for j in range(streams):
            hub.push_running(j, text, lambda source, t, j=j: _progress(j, t), None)
        await asyncio.sleep(step_s)
    per_s = (time.process_time() - cpu) / (time.monotonic() - began)
    for task in [*tasks, poller]:
        task.cancel()
    return per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--step-s", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    per_s = asyncio.run(run(args.streams, args.step_s, args.seconds))
    print(f"{args.streams} streams, a token each every {args.step_s:g} s: "
          f"{1e3 * per_s:.2f} ms of CPU a second")


if __name__ == "__main__":
    main()

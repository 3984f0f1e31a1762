"""The online fast path's pieces: the hub's merge of pushed and read progress, what the daemon pushes,
the link's two ends over a real loopback socket, and the bound on a client that stops reading."""

from __future__ import annotations

import asyncio
import select
import socket
import time

import pytest

from fsched.api.hub import ProgressHub, _Watch
from fsched.api.link import LinkClient
from fsched.api.sse import BoundedStream, ClientStalled
from fsched.core.daemon.engine import EngineResult
from fsched.core.daemon.holdings import Holdings
from fsched.core.daemon.link import LinkServer
from fsched.core.daemon.publish import Publisher
from fsched.core.ports.link import VERSION, Claim, Follow, Forget, Hello, Steps, StepText, Wake, Watch, encode
from fsched.core.ports.records import RequestProgress
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestStatus, SamplingParams


def progress(text: str, state: RequestStatus = RequestStatus.RUNNING) -> RequestProgress:
    return RequestProgress(id="r1", job_id=1, status=state, output_text=text, num_output_tokens=len(text),
                           enqueued_at=0.0, first_token_at=None, finished_at=None, error=None)


def claimed(job_id: int = 1, request_id: str = "r1") -> Request:
    return Request.to_run(request_id, [1], SamplingParams(max_tokens=8), "t", RequestClass.STREAMING,
                          job_id=job_id, enqueued_at=1.0)


async def _updates(hub: ProgressHub, job_id: int, n: int, until: str | None = None) -> list:
    seen = []
    async for choices in hub.watch(job_id):
        seen.append(choices[0].output_text)
        if len(seen) == n or seen[-1] == until:
            break
    return seen


def test_the_hub_never_shows_less_than_a_push_did_until_the_request_ends():
    table = {1: (progress("ab"),)}
    hub = ProgressHub(lambda ids: {i: table[i] for i in ids if i in table}, interval_s=0.001)

    async def run():
        poller = asyncio.create_task(hub.run())
        watcher = asyncio.create_task(_updates(hub, 1, 3))
        await asyncio.sleep(0.02)
        assert hub.push(1, (progress("abcdef"),))  # the link is ahead of the table
        await asyncio.sleep(0.02)  # the table still says "ab": not shown again
        table[1] = (progress("abcd", RequestStatus.FINISHED_STOPPED),)  # an end is taken whatever it shows
        seen = await asyncio.wait_for(watcher, 2)
        poller.cancel()
        return seen

    assert asyncio.run(run()) == ["ab", "abcdef", "abcd"]
    assert not hub.push(1, (progress("x"),))  # nobody watches it any more


def test_a_linked_job_is_read_from_the_table_only_every_linked_poll():
    hub = ProgressHub(lambda ids: {}, linked_poll_s=0.25)
    hub._watches[1], hub._watches[2] = _Watch(), _Watch()
    assert hub._due(100.0) == ([1, 2], [])
    hub._watches[1].linked_at = 100.0
    assert hub._due(100.1) == ([2], [])
    assert hub._due(100.3) == ([2], [1])
    hub.unlink([1])
    assert hub._due(100.31) == ([1, 2], [])


def test_a_linked_job_its_daemon_pushes_is_checked_only_every_pushed_poll():
    hub = ProgressHub(lambda ids: {}, linked_poll_s=0.25, pushed_poll_s=1.0)
    hub._watches[1], hub._watches[2] = _Watch(linked_at=99.0), _Watch(linked_at=99.0)
    hub._watches[3] = _Watch(linked_at=99.9)  # announced a moment ago: most are pushed before a check
    assert hub.push(2, (progress("ab"),))  # its daemon pushes it: its end will come the same way
    assert hub._due(100.0) == ([], [1, 2])
    hub._watches.pop(3)
    assert hub._due(100.3) == ([], [1])  # not pushed yet (queued, say): a cancel must reach it soon
    assert hub._pause(100.3) == pytest.approx(0.25)
    hub._watches.pop(1)
    assert hub._pause(100.3) == pytest.approx(0.7)  # nothing due before the pushed ones' check
    assert hub._due(100.6) == ([], [])
    assert hub._due(101.0) == ([], [2])
    hub.unlink([2])  # its link dropped: read at every tick, and checked as unpushed once linked again
    assert hub._due(101.1) == ([2], [])
    hub._watches[2].linked_at = 101.1
    assert hub._due(101.5) == ([], [2])


def test_a_linked_job_is_checked_by_its_states_and_read_in_full_only_once_the_table_is_ahead_or_ended():
    fulls: list[list[int]] = []
    states = {1: ((RequestStatus.RUNNING, 2),), 2: ((RequestStatus.RUNNING, 9),),
              3: ((RequestStatus.FINISHED_CANCELLED, 2),)}

    def read(ids):
        fulls.append(sorted(ids))
        return {}

    hub = ProgressHub(read, linked_poll_s=0.25, read_states=lambda ids: {i: states[i] for i in ids})
    for job_id in (1, 2, 3, 4):
        hub._watches[job_id] = _Watch(latest=(progress("abc"),), linked_at=100.0)  # pushed 3 tokens
    hub._watches[4].linked_at = None  # read from the table alone: in full

    async def run():
        return await hub._read(*hub._due(100.3))  # linked a check ago

    asyncio.run(run())
    # 1 is behind its pushes (read no further), 2 is ahead of them, 3 was cancelled: in full
    assert fulls == [[2, 3, 4]]


def test_a_hub_whose_jobs_are_all_linked_sleeps_until_their_table_check():
    hub = ProgressHub(lambda ids: {}, interval_s=0.001, linked_poll_s=3600)
    passes = []
    due = hub._due
    hub._due = lambda now: passes.append(now) or due(now)

    async def run():
        poller = asyncio.create_task(hub.run())
        hub.expect_push(1)
        watcher = asyncio.create_task(_updates(hub, 1, 1))
        while not passes:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)  # a hundred ticks: a hub polling every tick would pass each
        hub.push(1, (progress("done", RequestStatus.FINISHED_STOPPED),))
        await asyncio.wait_for(watcher, 10)
        poller.cancel()

    asyncio.run(run())
    assert len(passes) <= 3  # its first read, then asleep until the hour's check


def test_a_job_read_from_the_table_alone_wakes_a_hub_asleep_for_its_linked_jobs():
    table = {2: (progress("ab", RequestStatus.FINISHED_STOPPED),)}
    hub = ProgressHub(lambda ids: {i: table[i] for i in ids if i in table}, interval_s=0.001,
                      linked_poll_s=3600)

    async def run():
        poller = asyncio.create_task(hub.run())
        hub.expect_push(1)
        linked = asyncio.create_task(_updates(hub, 1, 1))
        await asyncio.sleep(0.05)  # the hub reads job 1 once, then sleeps for the hour
        seen = await asyncio.wait_for(_updates(hub, 2, 1), 10)  # job 2: no link, read at the next tick
        linked.cancel()
        poller.cancel()
        return seen

    assert asyncio.run(run()) == ["ab"]


class _Link:
    def __init__(self, watched: set[int]):
        self.watched, self.sent = watched, []

    def watcher(self, job_id):
        return "conn" if job_id in self.watched else None

    def send(self, lines):
        for message in lines.get("conn", []):  # a step's texts come in one message
            self.sent += message.texts if isinstance(message, Steps) else [message]


def test_the_publisher_pushes_each_steps_text_from_what_was_settled_and_the_end_with_it():
    holdings = Holdings()
    holdings.add(claimed())
    holdings.add(claimed(job_id=2, request_id="r2"))
    texts = {"r1": "héllo\ufffd", "r2": "unwatched"}
    link = _Link({1})
    pub = Publisher(link, holdings, lambda held: texts[held.id], "m")
    pub.step({"r1": 3, "r2": 3}, [], 0.0)
    assert [(m.start, m.text) for m in link.sent] == [(0, "héllo\ufffd")]
    assert holdings.get("r1").linked and not holdings.get("r2").linked  # r2 is flushed every step
    texts["r1"] = "héllo wörld"
    pub.step({"r1": 4}, [], 0.0)
    assert (link.sent[-1].start, link.sent[-1].text) == (5, " wörld")  # the unsettled tail again
    result = EngineResult(id="r1", tokens=[1, 2, 3, 4], text="héllo wörld",
                          status=RequestStatus.FINISHED_STOPPED, prompt_tokens=2)
    pub.step({"r1": 4}, [result], 8.0)
    end = link.sent[-1]  # with its step's texts: its tokens come out the same after a crash
    assert (end.status, end.text, end.finished_at, end.prompt_tokens) == (
        RequestStatus.FINISHED_STOPPED, "héllo wörld", 8.0, 2)
    pub.written(now=9.0)
    assert link.sent[-1] is end  # pushed once


def test_a_wakeup_makes_the_link_descriptor_readable_until_taken_and_says_what_was_asked():
    server = LinkServer("127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", int(server.address.rpartition(":")[2]))) as sock:
            assert not select.select([server.wake_fd], [], [], 0.05)[0]
            sock.sendall(encode([Hello(VERSION), Claim()]))
            assert select.select([server.wake_fd], [], [], 5)[0]  # a waiting step would end now
            sock.sendall(encode([Wake()]))
            deadline = time.monotonic() + 5
            wants = server.take_wake()
            while not wants.sync and time.monotonic() < deadline:  # the second line may come later
                time.sleep(0.01)
                taken = server.take_wake()
                wants.sync, wants.claim = wants.sync or taken.sync, wants.claim or taken.claim
            assert wants.claim and wants.sync
            assert not select.select([server.wake_fd], [], [], 0.05)[0] and not server.take_wake()
    finally:
        server.close()


def test_the_link_carries_watches_wakeups_and_pushes_over_a_socket():
    server = LinkServer("127.0.0.1", 0)
    try:
        async def run():
            hub = ProgressHub(lambda ids: {}, interval_s=0.01)
            client = LinkClient(hub, refresh_s=0.05)
            runner = asyncio.create_task(client.run(lambda: _addresses(server.address)))
            watcher = asyncio.create_task(_updates(hub, 7, 3, until="hello\x00\udc80"))
            deadline = time.monotonic() + 5
            while not server.take_wake().sync and time.monotonic() < deadline:  # a new link asks for a sync
                await asyncio.sleep(0.01)
            client.announce(7, linkable=True)
            while server.watcher(7) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            wants = server.take_wake()  # a new request: the daemon claims now, and only claims
            assert wants.claim and not wants.sync and not server.take_wake()
            conn = server.watcher(7)
            server.send({conn: [Steps([StepText(7, "r", 0, "he", 1, (1.0, 0.5))])]})
            server.send({conn: [Steps([StepText(7, "r", 2, "llo\x00\udc80", 2)])]})
            seen = await asyncio.wait_for(watcher, 5)
            runner.cancel()
            return seen

        # Pieces joined at their offsets (updates may coalesce); any text crosses, NUL, lone surrogates.
        assert asyncio.run(run())[-1] == "hello\x00\udc80"
    finally:
        server.close()


def test_a_forget_waits_for_the_next_message_that_goes_or_the_refresh():
    """An ended job's `Forget` costs no write of its own (nor a wake-up of the daemon's link thread)."""
    server = LinkServer("127.0.0.1", 0)
    try:
        async def run():
            client, runner = await _linked(ProgressHub(lambda ids: {}, interval_s=0.01), server)
            deadline = time.monotonic() + 5
            (peer,) = client._peers.values()
            writes = []
            write = peer.writer.write
            peer.writer.write = lambda data: writes.append(data) or write(data)
            client.announce(7, linkable=True)
            client.announce(8, linkable=True)
            await asyncio.sleep(0)
            assert writes == [encode([Watch(7), Watch(8)])]  # one write for the loop pass
            client.closed(7)
            await asyncio.sleep(0.05)
            assert len(writes) == 1  # nothing written for the forget alone
            client.announce(9, linkable=True)
            await asyncio.sleep(0)
            assert writes[1] == encode([Forget(7), Watch(9)])  # it went with the next message
            client.closed(8)
            while len(writes) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert writes[2] == encode([Forget(8)])  # or with the refresh
            while server.watcher(8) is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert server.watcher(7) is None and server.watcher(8) is None and server.watcher(9) is not None
            runner.cancel()

        asyncio.run(run())
    finally:
        server.close()


def test_a_job_closed_before_its_handler_watched_leaves_no_expectation_behind():
    """A handler that goes away between its job's announcement and its watch (the group commit announces
    a job before its handler resumes): the hub does not keep the job as expected for ever."""
    server = LinkServer("127.0.0.1", 0)
    try:
        async def run():
            hub = ProgressHub(lambda ids: {}, interval_s=0.01)
            client, runner = await _linked(hub, server)
            client.announce(7, linkable=True)
            client.announce(8, linkable=True)
            client.closed(7)  # its handler gone before it watched
            assert 7 not in hub._expected and 8 in hub._expected
            runner.cancel()

        asyncio.run(run())
    finally:
        server.close()


def test_a_steps_line_for_a_thousand_requests_crosses_whole():
    """One line carries a step's texts for every request a server watches: past asyncio's 64 KiB line."""
    server = LinkServer("127.0.0.1", 0)
    jobs = range(1, 1025)
    try:
        async def run():
            hub = ProgressHub(lambda ids: {}, interval_s=0.01)
            client = LinkClient(hub, refresh_s=0.05)
            runner = asyncio.create_task(client.run(lambda: _addresses(server.address)))
            watchers = [asyncio.create_task(_updates(hub, j, 1)) for j in jobs]
            for j in jobs:
                client.announce(j, linkable=True)
            deadline = time.monotonic() + 5
            while server.watcher(1024) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            texts = [StepText(j, f"r{j}", 0, f"{j:04d}" + "x" * 96, 1, (1.0, 0.5)) for j in jobs]
            assert len(encode([Steps(texts)])) > 100_000
            server.send({server.watcher(1): [Steps(texts)]})
            seen = await asyncio.wait_for(asyncio.gather(*watchers), 5)
            runner.cancel()
            return seen

        seen = asyncio.run(run())
        assert [s[0][:4] for s in seen] == [f"{j:04d}" for j in jobs]
    finally:
        server.close()


def test_a_nudge_asks_the_daemon_to_claim_and_what_it_covers_is_announced_with_a_follow():
    """The group commit's thread nudges the daemons on their second connection; an announcement made after
    a nudge reached a daemon only watches there (its claim is asked for); once that connection fails,
    announcements claim again."""
    server = LinkServer("127.0.0.1", 0)
    try:
        async def run():
            hub = ProgressHub(lambda ids: {}, interval_s=0.01)
            client, runner = await _linked(hub, server, refresh_s=0.05)
            deadline = time.monotonic() + 5
            while not client._nudges and time.monotonic() < deadline:  # opened once the link's hello is in
                await asyncio.sleep(0.01)
            (peer,) = client._peers.values()
            writes = []
            write = peer.writer.write
            peer.writer.write = lambda data: writes.append(data) or write(data)
            while time.monotonic() < deadline and not server.take_wake().sync:  # the new link's sync
                await asyncio.sleep(0.01)
            await asyncio.to_thread(client.nudge)  # as the writer thread does after a commit
            while not (wants := server.take_wake()) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert wants.claim and not wants.sync
            client.announce(7, linkable=True)
            client.announce(8, linkable=False)  # no watch: nothing more to say to that daemon
            while server.watcher(7) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert writes == [encode([Follow(7)])] and not server.take_wake()  # watched, no claim again
            # The daemon's end of the nudge goes away: the next nudge fails, and announcements claim.
            with server._lock:
                nudge_conn = next(c for c in server._conns.values() if not c.jobs)
            server._drop(nudge_conn)
            while client._nudged and time.monotonic() < deadline:
                await asyncio.to_thread(client.nudge)
                await asyncio.sleep(0.01)
            client.announce(9, linkable=True)
            await asyncio.sleep(0)
            assert writes[-1] == encode([Watch(9)])
            runner.cancel()

        asyncio.run(run())
    finally:
        server.close()


async def _addresses(address: str) -> set[str]:
    return {address}


async def _linked(hub: ProgressHub, server: LinkServer, refresh_s: float = 0.3
                  ) -> tuple[LinkClient, asyncio.Task]:
    """A link client of `hub`, its refresh loop running, once it has linked to `server` (within 5 s)."""
    client = LinkClient(hub, refresh_s=refresh_s)
    runner = asyncio.create_task(client.run(lambda: _addresses(server.address)))
    deadline = time.monotonic() + 5
    while not client._peers and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return client, runner


def test_a_client_that_takes_no_bytes_for_the_bound_is_cut_off_and_the_stream_closed():
    closed = []

    async def events():
        try:
            while True:
                yield "data: x\n\n"
        finally:
            closed.append(True)

    async def send(message):
        if message["type"] == "http.response.body":
            await asyncio.sleep(3600)  # a full socket that never drains

    response = BoundedStream(events(), stall_s=0.05)
    with pytest.raises(ClientStalled):
        asyncio.run(response.stream_response(send))
    assert closed == [True]  # the stream's `finally` ran: it cancels the request


def test_a_client_that_reads_slowly_but_within_the_bound_is_never_cut_off():
    async def events():
        for _ in range(8):
            yield "data: x\n\n"

    sent = []

    async def send(message):
        if message["type"] == "http.response.body" and message["body"]:
            # each write waits well under the bound (a sixth: a loaded machine's late wake-ups stay
            # inside it); the whole stream waits longer than the bound
            await asyncio.sleep(0.1)
            sent.append(message["body"])

    asyncio.run(BoundedStream(events(), stall_s=0.6).stream_response(send))
    assert len(sent) == 8


def _scope() -> dict:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("c", 1),
            "extensions": {}}


def test_a_client_that_hangs_up_mid_stream_closes_it_and_leaves_its_handler_uncancelled():
    closed, hang_up = [], None

    async def events():
        try:
            yield "data: a\n\n"
            await asyncio.sleep(3600)  # the engine's next token, which the client does not wait for
            yield "data: b\n\n"
        finally:
            closed.append(True)

    async def receive():
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message.get("body") == b"data: a\n\n":
            hang_up.set()

    async def run():
        nonlocal hang_up
        hang_up = asyncio.Event()
        await asyncio.wait_for(BoundedStream(events(), stall_s=60)(_scope(), receive, send), 10)
        return asyncio.current_task().cancelling()

    assert asyncio.run(run()) == 0  # the hang-up's cancel is taken back: the handler goes on
    assert closed == [True]  # the stream's `finally` ran: it cancels the request


def test_a_server_stop_during_a_hang_up_still_cancels_the_handler():
    hang_up = None
    handler = None

    async def events():
        yield "data: a\n\n"
        await asyncio.sleep(3600)
        yield "data: b\n\n"

    async def receive():
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message.get("body") == b"data: a\n\n":
            hang_up.set()
            handler.cancel()  # the server stopping, at the same moment

    async def run():
        nonlocal hang_up, handler
        hang_up = asyncio.Event()
        handler = asyncio.ensure_future(BoundedStream(events(), stall_s=60)(_scope(), receive, send))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(handler, 10)

    asyncio.run(run())


def test_a_hang_up_after_the_stream_ended_cancels_nothing():
    async def events():
        yield "data: a\n\n"

    sent = []

    async def receive():
        while not sent or sent[-1].get("more_body", True):
            await asyncio.sleep(0)
        return {"type": "http.disconnect"}  # as soon as the last byte went

    async def send(message):
        sent.append(message)

    async def run():
        response = BoundedStream(events(), stall_s=60)
        await response(_scope(), receive, send)
        for _ in range(5):
            await asyncio.sleep(0)  # a cancel left pending on the handler would land here
        return response.ended

    assert asyncio.run(run())


def test_a_push_while_the_handler_waits_goes_to_its_sink_and_an_end_wakes_the_handler():
    hub = ProgressHub(lambda ids: {}, interval_s=3600)
    taken: list[str] = []
    accept = [True]

    def sink(choices) -> bool:
        if accept[0]:
            taken.append(choices[0].output_text)
        return accept[0]

    async def run():
        watcher = asyncio.create_task(_updates(hub, 1, 2))
        await asyncio.sleep(0)
        assert hub.attach(1, sink)
        assert hub.push(1, (progress("ab"),))  # written by the sink: the handler is not woken
        assert hub.delivered_at(1) > 0
        accept[0] = False
        assert hub.push(1, (progress("abc"),))  # declined: the handler gets it
        await asyncio.sleep(0)
        accept[0] = True
        assert hub.push(1, (progress("abcd", RequestStatus.FINISHED_STOPPED),))  # an end: never a sink's
        return await asyncio.wait_for(watcher, 2)

    assert asyncio.run(run()) == ["abc", "abcd"]
    assert taken == ["ab"]


def test_no_keep_alive_while_a_sink_writes_the_tokens():
    from fsched.api.guard import Guard, KeepAlive, StreamRules, guarded
    from fsched.core.jobs.apikeys import ApiKey

    hub = ProgressHub(lambda ids: {}, interval_s=3600)
    guard = Guard(StreamRules(keepalive_s=0.05, key_check_s=60))
    key = ApiKey("k1", "alice", RequestClass.REALTIME, "a key", "hash", 0.0)

    async def read_key(key_id):
        return key

    async def live():
        return 1

    async def run():
        seen = []

        async def follow():
            async for update in guarded(hub, guard, 1, key, read_key, live):
                seen.append(update)

        following = asyncio.create_task(follow())
        await asyncio.sleep(0)
        assert hub.attach(1, lambda choices: True)
        text = ""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # a token every 10 ms: far more often than keep-alives
            text += "a"
            hub.push(1, (progress(text),))
            await asyncio.sleep(0.01)
        hub.push(1, (progress(text, RequestStatus.FINISHED_STOPPED),))
        await asyncio.wait_for(following, 5)
        return seen

    seen = asyncio.run(run())
    assert not any(isinstance(update, KeepAlive) for update in seen)
    assert seen[-1][0].status is RequestStatus.FINISHED_STOPPED


def test_a_sink_that_fails_is_dropped_and_its_handler_gets_the_push():
    hub = ProgressHub(lambda ids: {}, interval_s=3600)

    def sink(choices) -> bool:
        raise RuntimeError("a broken sink")

    async def run():
        watcher = asyncio.create_task(_updates(hub, 1, 2))
        await asyncio.sleep(0)
        assert hub.attach(1, sink)
        assert hub.push(1, (progress("ab"),))  # no exception reaches the link's reader
        await asyncio.sleep(0)
        assert hub.push(1, (progress("abc", RequestStatus.FINISHED_STOPPED),))
        return await asyncio.wait_for(watcher, 2)

    assert asyncio.run(run()) == ["ab", "abc"]


def test_a_pushed_running_text_goes_to_the_text_sink_with_no_progress_made_until_one_is_read():
    hub = ProgressHub(lambda ids: {}, interval_s=3600)
    taken: list[str] = []
    made: list[str] = []
    accept = [True]

    def text_sink(text: str) -> bool:
        if accept[0]:
            taken.append(text)
        return accept[0]

    def make(source: str, text: str):
        made.append(text)
        return (progress(text),)

    async def run():
        watcher = asyncio.create_task(_updates(hub, 1, 2))
        await asyncio.sleep(0)
        assert hub.attach(1, lambda choices: False, text_sink)
        assert hub.push_running(1, "ab", make, "r")  # written by the text sink: no progress, no wake-up
        assert hub.push_running(1, "a", make, "r")  # behind what the client has: ignored
        assert (taken, made) == (["ab"], [])
        assert hub.latest(1)[0].output_text == "ab" and made == ["ab"]  # made once something reads it
        accept[0] = False
        assert hub.push_running(1, "abc", make, "r")  # declined: made, and the handler gets it
        await asyncio.sleep(0)
        assert hub.push(1, (progress("abcd", RequestStatus.FINISHED_STOPPED),))
        assert not hub.push_running(2, "x", make, "r")  # nobody watches job 2
        return await asyncio.wait_for(watcher, 2)

    assert asyncio.run(run()) == ["abc", "abcd"]
    assert taken == ["ab"] and made == ["ab", "abc"]


def test_a_cancel_in_the_table_reaches_a_linked_stream_by_its_states_check(sqlite_url):
    from tests.support.tables import InSql

    table = InSql(sqlite_url)
    job = table.submit(1)
    fulls: list[list[int]] = []

    def read(ids):
        fulls.append(list(ids))
        return table.serving.progress(ids)

    hub = ProgressHub(read, interval_s=0.001, linked_poll_s=0.01, read_states=table.serving.progress_states)

    async def run():
        poller = asyncio.create_task(hub.run())
        hub.expect_push(job)  # announced on a link that never pushes: the table check alone ends it
        seen = []
        async for choices in hub.watch(job):
            seen.append(choices[0].status)
            if len(seen) == 1:
                table.cancel(job)
        poller.cancel()
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), 10))
    assert seen == [RequestStatus.WAITING, RequestStatus.FINISHED_CANCELLED]
    assert fulls == [[job], [job]]  # its first read, then once its states showed it ended

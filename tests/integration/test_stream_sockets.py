"""The engine streams over a real socket: the request as sent, the answer as read, a refused connection.
(The parser and selector on bytes in memory: tests/unit/test_streams.py.)"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from unittest import mock

from fsched.core.runners.streams import Fault, Streams
from tests.support.ports import free_port
from tests.unit.test_streams import CHUNKED


def _serve_once(answer: bytes) -> tuple[int, list[bytes]]:
    """A one-connection server that reads the request and sends `answer`; the request it got."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve():
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                    data.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
                data += conn.recv(65536)
            got.append(data)
            conn.sendall(answer)
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], got


def test_a_stream_over_a_socket_sends_the_request_and_reads_the_answer():
    port, got = _serve_once(CHUNKED)
    streams = Streams("127.0.0.1", port, "/v1/completions")
    stream = streams.open({"prompt": [1, 2], "stream": True}, owner="r1")
    tokens = []
    while not stream.ended:
        for s in streams.poll(1.0):
            assert s is stream and s.owner == "r1"
            tokens += s.take()[0]
    assert tokens == [5, 6, 7, 8] and stream.finish == "length" and len(streams) == 0
    head, _, body = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1") and json.loads(body) == {"prompt": [1, 2],
                                                                                     "stream": True}


def test_an_engine_that_is_not_there_is_unavailable():
    port = free_port()  # nothing listens there, and no client socket takes it meanwhile
    streams = Streams("127.0.0.1", port, "/v1/completions")
    stream = streams.open({"prompt": [1]})
    while not stream.ended:
        streams.poll(1.0)
    assert stream.fault is Fault.UNAVAILABLE and "refused" in stream.error.lower()


def test_a_pause_ends_when_the_wake_descriptor_turns_readable_and_reads_no_stream():
    """The remote step's gather pauses between its slices this way: new work announced (the daemon's
    wake descriptor readable) ends the pause at once, however long it was to last; a stream's bytes do
    not (they wait for the next poll)."""
    port, _ = _serve_once(CHUNKED)
    streams = Streams("127.0.0.1", port, "/v1/completions")
    wake_r, wake_w = socket.socketpair()
    try:
        streams.wake_on(wake_r.fileno())
        stream = streams.open({"prompt": [1, 2], "stream": True}, owner="r1")
        assert not streams.pause(0.01) and not streams.woken  # nothing announced: the whole pause
        wake_w.send(b"x")
        assert streams.pause(3600.0) and streams.woken  # an hour's pause, ended by the announcement
        assert stream.tokens == [] and not stream.ended  # the pause read nothing
        wake_r.recv(16)  # its owner takes the wake-up
        while not stream.ended:
            streams.poll(1.0)
        assert stream.tokens and not streams.woken
    finally:
        streams.close()
        wake_r.close()
        wake_w.close()


class _KeepAliveServer:
    """An HTTP/1.1 server of one answer per request, keeping each connection for further requests
    unless told to close it after `close_after` answers; it records what each connection received."""

    def __init__(self, answer: bytes = CHUNKED, close_after: int | None = None, split_last: bool = False):
        self.answer, self.close_after, self.split_last = answer, close_after, split_last
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections: list[list[bytes]] = []  # the requests of each accepted connection
        self.ended = threading.Event()  # a connection's peer closed it
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections.append([])
            threading.Thread(target=self._serve, args=(conn, self.connections[-1]), daemon=True).start()

    def _serve(self, conn: socket.socket, got: list[bytes]) -> None:
        try:
            self._answer(conn, got)
        except OSError:  # the client reset the connection (closed it with an answer unread)
            self.ended.set()

    def _answer(self, conn: socket.socket, got: list[bytes]) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data or len(data) < _request_length(data):
                    more = conn.recv(65536)
                    if not more:
                        self.ended.set()
                        return
                    data += more
                size = _request_length(data)
                got.append(data[:size])
                data = data[size:]
                if self.split_last:  # the answer's last chunk a moment after the rest
                    conn.sendall(self.answer[:-5])
                    threading.Event().wait(0.05)
                    conn.sendall(self.answer[-5:])
                else:
                    conn.sendall(self.answer)
                if self.close_after is not None and len(got) >= self.close_after:
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept blocked in its thread: it ends
        self.server.close()


def _request_length(data: bytes) -> int:
    head = data.index(b"\r\n\r\n") + 4
    return head + int(data.split(b"Content-Length: ")[1].split(b"\r\n")[0])


@contextlib.contextmanager
def _kept_alive(**server_args) -> Iterator[tuple[_KeepAliveServer, Streams]]:
    """A keep-alive server and the streams to it, both closed at the end."""
    server = _KeepAliveServer(**server_args)
    streams = Streams("127.0.0.1", server.port, "/v1/completions")
    try:
        yield server, streams
    finally:
        streams.close()
        server.close()


def _run(streams: Streams, body: dict) -> list[int]:
    stream = streams.open(body)
    tokens = []
    while not stream.ended:
        for s in streams.poll(1.0):
            tokens += s.take()[0]
    assert stream.error is None, stream.error
    return tokens


def test_streams_one_after_another_share_one_kept_connection():
    with _kept_alive() as (server, streams):
        for n in range(3):
            assert _run(streams, {"prompt": [n], "stream": True}) == [5, 6, 7, 8]
        assert len(server.connections) == 1 and len(server.connections[0]) == 3
        prompts = [json.loads(r.partition(b"\r\n\r\n")[2])["prompt"] for r in server.connections[0]]
        assert prompts == [[0], [1], [2]]
        assert b"connection: close" not in server.connections[0][0].lower()
        assert streams.connections_reused == 2 and len(streams) == 0


def test_an_answer_whose_last_chunk_comes_later_still_leaves_its_connection_kept():
    with _kept_alive(split_last=True) as (server, streams):
        assert _run(streams, {"prompt": [1], "stream": True}) == [5, 6, 7, 8]
        deadline = time.monotonic() + 2
        while streams._draining and time.monotonic() < deadline:  # the last chunk read at a later poll
            streams.poll(0.1)
        assert _run(streams, {"prompt": [2], "stream": True}) == [5, 6, 7, 8]
        assert len(server.connections) == 1 and streams.connections_reused == 1


def test_a_kept_connection_the_server_closed_sends_the_request_again_on_a_new_one():
    with _kept_alive(close_after=1) as (server, streams):  # the server ends every connection after one answer
        assert _run(streams, {"prompt": [1], "stream": True}) == [5, 6, 7, 8]
        time.sleep(0.1)  # the server has closed it (a close the idle check does not see yet: below)
        kept = streams._idle[-1][0]
        with mock.patch("fsched.core.runners.streams._quiet", return_value=True):
            assert _run(streams, {"prompt": [2], "stream": True}) == [5, 6, 7, 8]
        assert kept.fileno() == -1  # the dead one closed
        assert len(server.connections) == 2 and [len(c) for c in server.connections] == [1, 1]
        # the idle check sees the server's close, or the request finds the connection dead: a new one
        assert _run(streams, {"prompt": [3], "stream": True}) == [5, 6, 7, 8]
        assert len(server.connections) == 3 and streams.connections_reused == 0


def test_an_aborted_stream_closes_its_connection_and_an_old_idle_one_is_not_used():
    with _kept_alive() as (server, streams):
        stream = streams.open({"prompt": [1], "stream": True})
        streams.abort(stream)  # the engine must see the disconnect: it aborts the request
        assert server.ended.wait(2) and streams._idle == []
        assert _run(streams, {"prompt": [2], "stream": True}) == [5, 6, 7, 8]
        with mock.patch("fsched.core.runners.streams.IDLE_KEEP_S", 0.0):
            time.sleep(0.01)
            assert _run(streams, {"prompt": [3], "stream": True}) == [5, 6, 7, 8]
        assert len(server.connections) == 3 and streams.connections_reused == 0


def test_an_answer_that_says_connection_close_is_not_kept():
    closing = CHUNKED.replace(b"Transfer-Encoding: chunked\r\n",
                              b"Transfer-Encoding: chunked\r\nConnection: close\r\n")
    with _kept_alive(answer=closing) as (server, streams):
        assert _run(streams, {"prompt": [1], "stream": True}) == [5, 6, 7, 8]
        assert server.ended.wait(2) and streams._idle == []


def test_kept_connections_to_an_engine_that_went_away_are_not_used_and_the_fault_is_unavailable():
    with _kept_alive(close_after=1) as (server, streams):
        assert _run(streams, {"prompt": [1], "stream": True}) == [5, 6, 7, 8]
        assert len(streams._idle) == 1
        server.close()  # the engine is gone: its connection closed, nothing listening any more
        time.sleep(0.1)
        stream = streams.open({"prompt": [2], "stream": True})
        while not stream.ended:
            streams.poll(1.0)
        assert stream.fault is Fault.UNAVAILABLE and "refused" in stream.error.lower()
        assert streams._idle == [] and len(streams) == 0

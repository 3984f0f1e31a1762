"""The engine streams over a real socket: the request as sent, the answer as read, a refused connection.
(The parser and selector on bytes in memory: tests/unit/test_streams.py.)"""

from __future__ import annotations

import json
import socket
import threading
import time

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


# -- connections kept between requests ------------------------------------------------------------------


class _Engine:
    """A server that answers each request on a connection with the next of `answers` (bytes, or a list of
    bytes sent apart, or None: close the connection without answering, or a tuple: answer with its bytes,
    then close the connection soon after); records connections and requests."""

    def __init__(self, answers: list):
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + int(
                        data.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
                    piece = conn.recv(65536)
                    if not piece:
                        self.closed_by_client += 1
                        return
                    data += piece
                end = data.index(b"\r\n\r\n") + 4 + int(data.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                self.requests.append(data[:end])
                data = data[end:]
                answer = self.answers.pop(0) if self.answers else CHUNKED
                if answer is None:
                    return
                for piece in answer if isinstance(answer, list | tuple) else [answer]:
                    conn.sendall(piece)
                    time.sleep(0.02)
                if isinstance(answer, tuple):
                    return

    def close(self) -> None:
        self.server.close()


def _run(streams: Streams, stream) -> list[int]:
    tokens = []
    deadline = time.monotonic() + 10
    while not stream.ended:
        assert time.monotonic() < deadline, "the stream never ended"
        for s in streams.poll(0.1):
            tokens += s.take()[0]
    return tokens + stream.take()[0]


def _settle(streams: Streams, seconds: float = 0.1) -> None:
    """Polls with no stream open (what the daemon's steps do between requests): kept connections read."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        streams.poll(0.02)


def test_a_connection_whose_answer_ended_cleanly_carries_the_next_request():
    engine = _Engine([CHUNKED, CHUNKED, CHUNKED])
    streams = Streams("127.0.0.1", engine.port, "/v1/completions")
    try:
        for i in range(3):
            assert _run(streams, streams.open({"prompt": [i], "stream": True})) == [5, 6, 7, 8]
        assert engine.connections == 1 and len(engine.requests) == 3
        assert [json.loads(r.partition(b"\r\n\r\n")[2])["prompt"] for r in engine.requests] == [[0], [1], [2]]
        assert all(b"Connection: close" not in r for r in engine.requests)
    finally:
        streams.close()
        engine.close()


def test_the_last_chunk_coming_after_the_end_event_is_read_before_the_connection_is_reused():
    head, _, body = CHUNKED.partition(b"\r\n\r\n")
    apart = [head + b"\r\n\r\n" + body[: -len(b"0\r\n\r\n")], b"0\r\n", b"\r\n"]
    engine = _Engine([apart, CHUNKED])
    streams = Streams("127.0.0.1", engine.port, "/v1/completions")
    try:
        assert _run(streams, streams.open({"prompt": [1], "stream": True})) == [5, 6, 7, 8]
        _settle(streams)
        assert _run(streams, streams.open({"prompt": [2], "stream": True})) == [5, 6, 7, 8]
        assert engine.connections == 1
    finally:
        streams.close()
        engine.close()


def test_an_answer_that_says_close_or_an_aborted_stream_is_not_kept():
    closing = CHUNKED.replace(b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n")
    engine = _Engine([closing, [CHUNKED[:60], b""], CHUNKED])
    streams = Streams("127.0.0.1", engine.port, "/v1/completions")
    try:
        assert _run(streams, streams.open({"prompt": [1], "stream": True})) == [5, 6, 7, 8]
        aborted = streams.open({"prompt": [2], "stream": True})
        deadline = time.monotonic() + 5
        while len(engine.requests) < 2:
            assert time.monotonic() < deadline
            streams.poll(0.02)
        streams.abort(aborted)  # the engine must see the disconnect (it aborts the request)
        assert _run(streams, streams.open({"prompt": [3], "stream": True})) == [5, 6, 7, 8]
        assert engine.connections == 3
        deadline = time.monotonic() + 5
        while engine.closed_by_client < 1:
            assert time.monotonic() < deadline, "the aborted stream's connection stayed open"
            time.sleep(0.01)
    finally:
        streams.close()
        engine.close()


def test_a_kept_connection_the_engine_closes_before_answering_sends_the_request_again_on_a_new_one():
    engine = _Engine([CHUNKED, None, CHUNKED])  # the second request: the connection closed unanswered
    streams = Streams("127.0.0.1", engine.port, "/v1/completions")
    try:
        assert _run(streams, streams.open({"prompt": [1], "stream": True})) == [5, 6, 7, 8]
        stream = streams.open({"prompt": [2], "stream": True})
        assert _run(streams, stream) == [5, 6, 7, 8] and stream.error is None
        assert engine.connections == 2 and len(engine.requests) == 3
        assert engine.requests[1] == engine.requests[2]  # the same request, sent again
    finally:
        streams.close()
        engine.close()


def test_a_kept_connection_closed_while_idle_is_dropped_and_a_new_one_made():
    for settle in (0.2, 0.0):  # the close read while idle, or found when the next request takes it
        engine = _Engine([(CHUNKED,), CHUNKED])  # the first answer's connection closed after it
        streams = Streams("127.0.0.1", engine.port, "/v1/completions")
        try:
            assert _run(streams, streams.open({"prompt": [1], "stream": True})) == [5, 6, 7, 8]
            time.sleep(0.1)
            _settle(streams, settle)
            assert _run(streams, streams.open({"prompt": [2], "stream": True})) == [5, 6, 7, 8]
            assert engine.connections == 2 and len(engine.requests) == 2
        finally:
            streams.close()
            engine.close()


def test_a_whole_body_without_its_end_event_ends_the_stream_on_a_kept_connection():
    head, _, _ = CHUNKED.partition(b"\r\n\r\n")
    cut = head + b"\r\n\r\n" + b"%x\r\n%s\r\n" % (len(b"data: {}\n\n"), b"data: {}\n\n") + b"0\r\n\r\n"
    engine = _Engine([cut])
    streams = Streams("127.0.0.1", engine.port, "/v1/completions")
    try:
        stream = streams.open({"prompt": [1], "stream": True})
        _run(streams, stream)  # ends (a hang would fail here)
        assert stream.fault is Fault.UNAVAILABLE and "early" in stream.error
    finally:
        streams.close()
        engine.close()

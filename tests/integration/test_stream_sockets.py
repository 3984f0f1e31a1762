"""The engine streams over a real socket: the request as sent, the answer as read, a refused connection.
(The parser and selector on bytes in memory: tests/unit/test_streams.py.)"""

from __future__ import annotations

import json
import socket
import threading

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

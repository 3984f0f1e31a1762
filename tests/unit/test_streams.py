"""The engine streams' parser and selector: bytes in any pieces, answers of every kind, faults."""

from __future__ import annotations

import json
import socket

import pytest

from fsched.core.runners.streams import HEAD, Fault, Stream, _plain_chunk, received


def _event(tokens: list[int], finish: str | None = None, compact: bool = True) -> bytes:
    chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": " w", "logprobs": None, "finish_reason": finish, "token_ids": tokens}]}
    separators = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(chunk, separators=separators).encode() + b"\n\n"


def _chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


STREAM = [_event([5]), _event([6, 7], compact=False), _event([8], "length"), b"data: [DONE]\n\n"]
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(*STREAM)
UNTIL_CLOSE = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(STREAM)


def _parsed(answer: bytes, cut: int | None = None, plain: bool = True) -> Stream:
    stream = Stream(socket.socket(), b"", state=HEAD, plain=plain)
    stream.sock.close()
    pieces = [answer] if cut is None else [answer[:cut], answer[cut:]]
    for piece in filter(None, pieces):  # an empty read is the engine closing the connection
        received(stream, piece)
    if not stream.ended:
        received(stream, b"")  # the engine closes the connection
    return stream


@pytest.mark.parametrize("answer", [CHUNKED, UNTIL_CLOSE], ids=["chunked", "until-close"])
def test_a_stream_cut_at_any_byte_reads_the_same(answer):
    for cut in range(len(answer) + 1):
        stream = _parsed(answer, cut)
        assert (stream.tokens, stream.finish, stream.error) == ([5, 6, 7, 8], "length", None), cut


def test_plain_chunks_read_without_json_equal_the_json_reading():
    for chunk in [_event([1, 2]), _event([], "stop"), _event([3], compact=False)]:
        data = chunk[6:-2]
        choice = json.loads(data)["choices"][0]
        assert _plain_chunk(data) == (choice["token_ids"], choice["finish_reason"])
    tricky = json.dumps({"choices": [{"text": '"token_ids":[9]', "token_ids": [1], "finish_reason": None}]})
    assert _plain_chunk(tricky.encode()) == ([1], None)  # a key's bytes inside a string are escaped
    two = {"choices": [{"token_ids": [1], "finish_reason": None}, {"token_ids": [2], "finish_reason": None}]}
    assert _plain_chunk(json.dumps(two).encode()) is None
    for choice in ({"finish_reason": "length", "token_ids": [12, 7, 0]},  # the keys in either order
                   {"token_ids": [3], "stop_reason": "x", "finish_reason": "stop"},
                   {"token_ids": [], "finish_reason": None},
                   {"finish_reason": None, "token_ids": [4], "text": "] [5] null"}):
        for separators in ((",", ":"), (", ", ": ")):
            data = json.dumps({"choices": [choice]}, separators=separators).encode()
            assert _plain_chunk(data) == (choice["token_ids"], choice["finish_reason"]), data
    for odd in ({"token_ids": None, "finish_reason": None}, {"token_ids": [1], "finish_reason": 'st"op'},
                {"token_ids": [1]}, {"token_ids": [1.5], "finish_reason": None}):
        assert _plain_chunk(json.dumps({"choices": [odd]}).encode()) is None, odd  # the general path reads it
    assert _parsed(b"HTTP/1.0 200 OK\r\n\r\ndata: " + tricky.encode() + b"\n\ndata: [DONE]\n\n").tokens == [1]


def test_logprobs_come_with_their_chunk_when_asked_for():
    lp = {"tokens": ["token_id:5"], "token_logprobs": [-0.5], "top_logprobs": [{}]}
    chunk = {"choices": [{"index": 0, "token_ids": [5], "logprobs": lp, "finish_reason": None}]}
    stream = _parsed(b"HTTP/1.0 200 OK\r\n\r\ndata: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n",
                     plain=False)
    assert stream.take() == ([5], [(lp, 1)]) and stream.finish == "stop"


@pytest.mark.parametrize("answer, fault, message", [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 32\r\n\r\n" + b'{"error": {"message": "too long"}}'[:32],
     Fault.REFUSED, "HTTP 400"),
    (b'HTTP/1.1 400 Bad Request\r\nContent-Length: 34\r\n\r\n{"error": {"message": "too long"}}',
     Fault.REFUSED, "HTTP 400: too long"),
    (b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(b'{"error": "later"}'),
     Fault.UNAVAILABLE, "HTTP 503: later"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(_event([1])),
     Fault.UNAVAILABLE, "closed the stream early"),
    (b"HTTP/1.1 200 OK\r\n\r\n" + b'data: {"error": {"message": "bad"}}\n\n',
     Fault.REFUSED, "engine error: bad"),
])
def test_every_kind_of_answer_ends_with_its_fault(answer, fault, message):
    for cut in (None, len(answer) // 2):
        stream = _parsed(answer, cut)
        assert stream.ended and stream.fault is fault and message in stream.error, (cut, stream.error)



def _opened(head: bytes) -> Stream:
    stream = Stream(socket.socket(), b"", state=HEAD)
    stream.sock.close()
    received(stream, head)
    return stream


def test_a_read_of_one_whole_plain_event_is_taken_in_one_pass_and_any_other_read_as_before(monkeypatch):
    import fsched.core.runners.streams as streams

    general = []
    monkeypatch.setattr(streams, "_chunks",
                        lambda s, buf, f=streams._chunks: general.append(buf) or f(s, buf))
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    whole = [b"%x\r\n%s\r\n" % (len(p), p) for p in STREAM]  # one whole chunk a read, each one event
    stream = _opened(head)
    general.clear()  # the head's read (nothing of the body yet)
    for read in whole[:3]:
        received(stream, read)
    assert (stream.tokens, stream.last, general) == ([5, 6, 7, 8], "length", [])  # none took the general path
    received(stream, whole[3] + b"0\r\n\r\n")
    assert (stream.finish, stream.ended, general) == ("length", True, [whole[3] + b"0\r\n\r\n"])
    error = b'data: {"error": {"message": "too long"}}\n\n'
    others = [_chunked(STREAM[0], STREAM[1]), b"%x\r\n%s\r\n" % (len(error), error), whole[0][:-1],
              b"%x;ext=1\r\n%s\r\n" % (len(STREAM[0]), STREAM[0])]
    for read in others:  # two chunks, an error, a chunk not yet whole, a chunk extension
        opened = _opened(head)
        general.clear()
        received(opened, read)
        assert general == [read]
    assert "too long" in _opened(head + others[1]).error
    assert _opened(head + others[3]).tokens == [5]


def test_a_request_goes_to_an_engine_already_connected_when_its_stream_opens_not_at_the_next_poll():
    from fsched.core.runners.streams import Streams

    with socket.create_server(("127.0.0.1", 0)) as server:
        streams = Streams("127.0.0.1", server.getsockname()[1], "/v1/completions")
        stream = streams.open({"prompt": [1], "stream": True})
        conn, _ = server.accept()  # the connection is up: no poll of `streams` has run
        with conn:
            conn.settimeout(5)
            got = conn.recv(65536)
            assert got.startswith(b"POST /v1/completions HTTP/1.1\r\n") and got.endswith(b'"stream":true}')
            assert stream.request == b""  # all of it written
        streams.close()

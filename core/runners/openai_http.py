"""Talking to an OpenAI-compatible engine (vLLM, or anything that takes token-id prompts).

Standard library only: one thread per streamed `/v1/completions` call reads
its server-sent events and puts what arrives on a queue the runner drains.
Aborting a stream shuts its socket; the engine sees the disconnect and
frees the request (vLLM aborts a request whose client went away).

What an event means:
- `tokens`: token ids that arrived (a chunk's `token_ids`);
- `finish_reason`: the engine ended the stream (stop, length);
- `error` with `Fault.UNAVAILABLE`: the engine could not be reached, reset
  the connection, answered 503 or cut the stream short: try again later;
- `error` with `Fault.REFUSED`: the engine answered the request with an
  error of its own (a prompt over its context, a bad parameter): retrying
  would not help.
"""

from __future__ import annotations

import enum
import http.client
import json
import queue
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from fsched.core.types import RequestId


class Fault(enum.StrEnum):
    UNAVAILABLE = "unavailable"
    REFUSED = "refused"


@dataclass(slots=True, frozen=True)
class StreamEvent:
    request_id: RequestId
    stream: int  # which of the request's streams (a resume opens a new one)
    tokens: tuple[int, ...] = ()
    finish_reason: str | None = None
    error: str | None = None
    fault: Fault | None = None
    logprobs: dict | None = None  # the chunk's `logprobs` object as the engine sent it (completions form)

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """What the engine says about itself; None where it does not say."""

    model: str
    max_model_len: int | None = None
    kv_tokens: int | None = None  # KV cache capacity in tokens (blocks x block size)
    max_num_seqs: int | None = None


class EngineHTTPError(Exception):
    """The engine could not be asked (unreachable) or answered with an error."""


class EngineClient:
    """One engine's HTTP API: probes, its description, streamed completions."""

    def __init__(self, url: str, connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"engine URL {url!r}: write http://HOST:PORT")
        self.url = f"http://{parts.hostname}:{parts.port or 80}{parts.path.rstrip('/')}"
        self.host, self.port = parts.hostname, parts.port or 80
        self.base = parts.path.rstrip("/").removesuffix("/v1")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s

    # -- plain requests ------------------------------------------------------------------
    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout_s)
        try:
            conn.request("GET", self.base + path)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineHTTPError(f"{self.url} unreachable: {exc}") from None
        finally:
            conn.close()

    def healthy(self) -> bool:
        """The engine answers and is ready (`/health`, or `/v1/models` where there is no `/health`)."""
        try:
            status = self.get("/health")[0]
            if status == 404:
                status = self.get("/v1/models")[0]
            return status == 200
        except EngineHTTPError:
            return False

    def info(self) -> EngineInfo:
        status, body = self.get("/v1/models")
        if status != 200:
            raise EngineHTTPError(f"{self.url}/v1/models answered {status}: {body[:200]!r}")
        models = json.loads(body).get("data") or []
        if not models:
            raise EngineHTTPError(f"{self.url} serves no model")
        first = models[0]
        kv, seqs = self._metrics()
        return EngineInfo(model=first["id"], max_model_len=first.get("max_model_len"), kv_tokens=kv,
                          max_num_seqs=seqs)

    def _metrics(self) -> tuple[int | None, int | None]:
        """KV capacity and batch size from Prometheus metrics, where the engine publishes them.

        vLLM publishes `vllm:cache_config_info{block_size=..,num_gpu_blocks=..}`;
        a `max_num_seqs` label, where present, gives the batch.
        """
        try:
            status, body = self.get("/metrics")
        except EngineHTTPError:
            return None, None
        if status != 200:
            return None, None
        labels: dict[str, str] = {}
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("vllm:cache_config_info{"):
                inside = line[line.index("{") + 1 : line.rindex("}")]
                for item in inside.split('",'):
                    key, _, value = item.partition('="')
                    labels[key.strip()] = value.strip('"')
        blocks, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
        kv = blocks * size if blocks and size else None
        return kv, _int(labels.get("max_num_seqs"))

    # -- streams -------------------------------------------------------------------------
    def stream(self, request_id: RequestId, stream: int, body: dict, events: queue.Queue) -> Stream:
        """Start a streamed completion; its events go to `events`."""
        handle = Stream(self, request_id, stream, body, events)
        handle.thread.start()
        return handle


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "", "None") else None
    except ValueError:
        return None


class Stream:
    """One streamed completion, read by its own thread."""

    def __init__(self, client: EngineClient, request_id: RequestId, stream: int, body: dict,
                 events: queue.Queue):
        self.client = client
        self.request_id = request_id
        self.stream = stream
        self.body = body
        self.events = events
        self.aborted = threading.Event()
        # The socket itself: http.client lets go of it once a response says `Connection: close`.
        self._sock: socket.socket | None = None
        self.thread = threading.Thread(target=self._read, name=f"fsched-stream-{request_id}", daemon=True)

    def abort(self) -> None:
        """Stop reading and drop the connection (the engine aborts the request)."""
        self.aborted.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _emit(self, **fields) -> None:
        if not self.aborted.is_set():
            self.events.put(StreamEvent(self.request_id, self.stream, **fields))

    def _read(self) -> None:
        c = self.client
        conn = http.client.HTTPConnection(c.host, c.port, timeout=c.connect_timeout_s)
        try:
            conn.connect()
            self._sock = conn.sock
            if self.aborted.is_set():
                return
            conn.request("POST", c.base + "/v1/completions", body=json.dumps(self.body).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            conn.sock.settimeout(c.read_timeout_s)
            response = conn.getresponse()
            if response.status != 200:
                self._http_error(response.status, response.read())
                return
            self._read_events(response)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._emit(error=f"{type(exc).__name__}: {exc}", fault=Fault.UNAVAILABLE)
        finally:
            conn.close()

    def _http_error(self, status: int, body: bytes) -> None:
        try:
            error = json.loads(body)
            message = error.get("error", error)
            message = message.get("message", message) if isinstance(message, dict) else message
        except ValueError:
            message = body.decode(errors="replace")[:500]
        fault = Fault.UNAVAILABLE if status in (502, 503, 504) else Fault.REFUSED
        self._emit(error=f"HTTP {status}: {message}", fault=fault)

    def _read_events(self, response: http.client.HTTPResponse) -> None:
        finish = None
        while True:
            line = response.readline()
            if not line:  # the stream ended without [DONE]: the engine went away
                self._emit(error="the engine closed the stream early", fault=Fault.UNAVAILABLE)
                return
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self._emit(finish_reason=finish or "stop")
                return
            chunk = json.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                self._emit(error=f"engine error: {message}", fault=Fault.REFUSED)
                return
            for choice in chunk.get("choices") or ():
                tokens = tuple(choice.get("token_ids") or ())
                finish = choice.get("finish_reason") or finish
                if tokens:
                    self._emit(tokens=tokens, logprobs=choice.get("logprobs"))

"""Talking to an OpenAI-compatible engine (vLLM, or anything that takes token-id prompts).

Standard library only. The plain requests (`/health`, `/v1/models`,
`/metrics`) are blocking calls; streamed calls (`/v1/completions`, or the
token interface of core/runners/tokens_api.py) are read by one selector for
all of them (`streams()`, core/runners/streams.py).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from fsched.core.runners.streams import Fault, Streams

__all__ = ["EngineClient", "EngineHTTPError", "EngineInfo", "Fault", "Streams"]


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
    """One engine's HTTP API: probes, its description, its streams."""

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
        return self._request("GET", path)

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        return self._request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout_s)
        try:
            conn.request(method, self.base + path, body, headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineHTTPError(f"{self.url} unreachable: {exc}") from None
        finally:
            conn.close()

    def serves(self, path: str) -> bool:
        """Whether the engine serves POST `path`: asked with an empty body, a server that has the route
        refuses the body (400, 422); one without it answers 404 or 405, and vLLM 403 where the route
        is there but turned off (its token interface without `--tokens-only` or `--enable-scale-out`)."""
        return self.post(path, {})[0] not in (403, 404, 405)

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
    def streams(self, path: str = "/v1/completions") -> Streams:
        """A selector for this engine's streams at `path` (one per reader: it is not thread-safe)."""
        return Streams(self.host, self.port, self.base + path, self.connect_timeout_s, self.read_timeout_s)


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text not in (None, "", "None") else None
    except ValueError:
        return None

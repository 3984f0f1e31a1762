"""Sending a replay: what the endpoint is asked first, then every request at its time, measured.

Before the clock starts, the endpoint is checked once: each tenant's key
against `/v1/models` (a bad URL or a refused key is an error that names
it), the served model's tokens per word through `/tokenize` (else one token
a word, and the report says so), and whether it takes the fields that force
an output's length. Then one asyncio loop sends each request at its time
(open loop: a request goes out whether or not earlier ones have answered)
and reads every stream, noting when its first token and its last arrived.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from fsched.core.replay.http import ServerAddress, ServerError, call_json, error_message, request
from fsched.core.replay.plan import Forcing, PromptShape, Send, prompt_text, request_body
from fsched.core.sim.trace import TraceRequest
from fsched.core.types import RequestClass

PROBE_WORDS = (32, 96)  # the two prompt lengths /tokenize counts, in words


class ReplayError(Exception):
    """The endpoint cannot be replayed against; the message says why, for the user."""


@dataclass(slots=True, frozen=True)
class Target:
    """The endpoint and what it was found to take."""

    endpoint: ServerAddress
    keys: Mapping[str, str]  # tenant -> API key ("" for none)
    model: str
    chat: bool
    shape: PromptShape = PromptShape()
    forcing: Forcing = Forcing()
    seed: int = 0

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def headers(self, tenant: str) -> dict[str, str]:
        key = self.keys[tenant]
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, send: Send) -> dict:
        words = self.shape.words_for(send.request.prompt_tokens)
        prompt = prompt_text(words, self.seed * 1_000_003 + send.index)
        return request_body(send, model=self.model, chat=self.chat, prompt=prompt, forcing=self.forcing)


@dataclass(slots=True)
class Observed:
    """What the client saw of one request; times in seconds after the replay started."""

    send: Send
    sent_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None  # its last token
    output_tokens: int = 0
    prompt_tokens: int | None = None  # as the endpoint counted them (its usage)
    status: int | None = None
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.error is None and self.first_token_s is not None


@dataclass(slots=True)
class ReplayProgress:
    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0
    tokens: int = 0


# -- before the clock starts ---------------------------------------------------------------------
async def connect(endpoint: ServerAddress, keys: Mapping[str, str], model: str | None, chat: bool,
                  seed: int = 0) -> Target:
    """The target, with every key checked, the model named, prompts sized and length forcing found."""
    listed = await _check_keys(endpoint, keys)
    if model is None:
        if not listed:
            raise ReplayError(f"{endpoint.url}/v1/models lists no model: name one with --model")
        model = listed[0]
    target = Target(endpoint, dict(keys), model, chat, seed=seed)
    target = replace(target, shape=await _prompt_shape(target))
    return replace(target, forcing=await _forcing(target))


async def _check_keys(endpoint: ServerAddress, keys: Mapping[str, str]) -> list[str]:
    listed: list[str] = []
    for tenant in sorted(keys):
        headers = {"Authorization": f"Bearer {keys[tenant]}"} if keys[tenant] else {}
        try:
            status, answer = await call_json(endpoint, "GET", "/v1/models", headers)
        except ServerError as exc:
            raise ReplayError(str(exc)) from None
        if status in (401, 403):
            raise ReplayError(f"{endpoint.url} refused tenant {tenant}'s key (HTTP {status}): "
                              f"{error_message(answer)}")
        if status == 200 and isinstance(answer, dict):
            listed = [m["id"] for m in answer.get("data") or () if isinstance(m, dict) and "id" in m]
        elif status != 404:
            raise ReplayError(f"{endpoint.url}/v1/models answered HTTP {status}: {error_message(answer)}")
    return listed


async def _prompt_shape(target: Target) -> PromptShape:
    """Tokens per word of the served model, from two /tokenize counts; the approximation without one."""
    counts = []
    for words in PROBE_WORDS:
        text = prompt_text(words, words)
        body = {"model": target.model, **({"messages": [{"role": "user", "content": text}]} if target.chat
                                          else {"prompt": text})}
        tenant = min(target.keys)
        status, answer = await call_json(target.endpoint, "POST", "/tokenize", target.headers(tenant), body)
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            return PromptShape()
        counts.append((words, answer["count"]))
    try:
        return PromptShape.from_counts(*counts)
    except ValueError:
        return PromptShape()


async def _forcing(target: Target) -> Forcing:
    """The most length-forcing the endpoint takes, from one short request per try."""
    tenant = min(target.keys)
    probe = replace(target, shape=PromptShape())
    answer = None
    for forcing in (Forcing(True, True), Forcing(True, False), Forcing(False, True), Forcing(False, False)):
        send = Send(-1, 0.0, TraceRequest(0.0, tenant, RequestClass.BATCH, 4, 1))
        obs = await _one(replace(probe, forcing=forcing), send, tenant, time.perf_counter())
        if obs.status == 200 and obs.error is None:
            return forcing
        answer = obs.error
        if obs.status != 400:
            break
    raise ReplayError(f"{target.endpoint.url}{target.path} refuses a plain streamed request: {answer}")


# -- the replay ----------------------------------------------------------------------------------
async def replay(target: Target, sends: Sequence[Send],
                 on_progress: Callable[[ReplayProgress], None] | None = None) -> list[Observed]:
    """Send each request at its time after now (open loop); every request observed, in `sends` order."""
    progress = ReplayProgress(len(sends))
    tasks = []
    t0 = time.perf_counter() + 0.2  # the first bodies are built before the clock runs
    for send in sends:
        body = target.body(send)
        delay = t0 + send.at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_counted(target, send, t0, body, progress, on_progress)))
        progress.sent += 1
        if on_progress is not None:
            on_progress(progress)
    return list(await asyncio.gather(*tasks))


async def _counted(target: Target, send: Send, t0: float, body: dict, progress: ReplayProgress,
                   on_progress: Callable[[ReplayProgress], None] | None) -> Observed:
    obs = await _one(target, send, send.request.tenant, t0, body)
    progress.done += 1
    progress.failed += not obs.completed
    progress.tokens += obs.output_tokens
    if on_progress is not None:
        on_progress(progress)
    return obs


async def _one(target: Target, send: Send, tenant: str, t0: float, body: dict | None = None) -> Observed:
    obs = Observed(send, sent_s=time.perf_counter() - t0)
    try:
        response = await request(target.endpoint, "POST", target.path, target.headers(tenant),
                                 body or target.body(send))
    except ServerError as exc:
        obs.error = str(exc)
        return obs
    obs.status = response.status
    try:
        if response.status != 200:
            raw = b"".join([p async for p in response.pieces()])
            obs.error = f"HTTP {response.status}: {error_message(_json_or_text(raw))}"
            return obs
        await _read_stream(response.events(), obs, t0)
    except (OSError, ServerError, asyncio.IncompleteReadError, ValueError) as exc:
        obs.error = f"the stream broke: {exc!r}"
    finally:
        response.close()
    return obs


async def _read_stream(events, obs: Observed, t0: float) -> None:
    """First and last token times from the events; the token counts from the usage chunk."""
    content_events = 0
    ended = False
    async for data in events:
        now = time.perf_counter() - t0
        if data == b"[DONE]":
            ended = True
            break
        if b'"completion_tokens"' in data:
            usage = json.loads(data).get("usage") or {}
            obs.output_tokens = int(usage.get("completion_tokens") or 0)
            obs.prompt_tokens = usage.get("prompt_tokens")
            continue
        if data.startswith(b'{"error"'):
            obs.error = f"error event: {error_message(json.loads(data))}"
            return
        if obs.first_token_s is None:
            if not _has_content(json.loads(data)):
                continue
            obs.first_token_s = now
        obs.finish_s = now
        content_events += 1
    if not ended:
        obs.error = "the stream ended without [DONE]"
    elif obs.first_token_s is None:
        obs.error = "the stream carried no token"
    elif not obs.output_tokens:
        obs.output_tokens = content_events  # no usage chunk: one event a token, as vLLM sends them


def _has_content(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _json_or_text(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def raise_open_files_limit() -> None:
    """Open loop: every outstanding request holds a connection, often beyond the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

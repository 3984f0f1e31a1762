"""Online endpoints: /v1/models, /v1/completions and /v1/chat/completions.

A request becomes a one-row job of the key's tenant (as `fsched generate`
makes), its tokens come back through the progress hub, and a client that
goes away cancels it. The translation both ways lives in core/openai/online.py.
Their streams, and /v1/responses's, go out through `relayed`: under the rules
of api/guard.py, and bounded against a client that stops reading (api/sse.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Protocol

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fsched.api import ratelimit
from fsched.api.errors import ApiError, error_body
from fsched.api.guard import KeepAlive, StreamEnd, Update, guarded
from fsched.api.hangup import HangUp
from fsched.api.hub import Choices
from fsched.api.limits import text_of
from fsched.api.sse import KEEPALIVE, BoundedStream, LastPiece, Outlet, sse
from fsched.api.state import ServerState, state_of
from fsched.api.tokens import prompt_token_ids
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.answers import opaque_response_id, response_body
from fsched.core.openai.body import PromptThinking
from fsched.core.openai.online import (
    BodyError,
    ClassRefused,
    OnlineRequest,
    choice_of,
    failure_status,
    parse_online,
)
from fsched.core.openai.results import DEFAULT_MODEL_NAME
from fsched.core.openai.streams import StreamRelay
from fsched.core.ports.records import KeyRevoked, QueueFull, RequestProgress
from fsched.core.stamps import ARRIVED, TAG_HEADER, stamp, tag
from fsched.core.stamps import enabled as stamps_on
from fsched.core.types import Endpoint, RequestStatus

router = APIRouter()
RETRY_AFTER_S = 1
# How long a stream's headers wait for its first token (or its end, a refusal included): the engine
# refuses a prompt over its context when it first sees it, within a step of the claim; a request
# queued for longer starts streaming meanwhile (its refusal, if any, then comes as an SSE error).
STREAM_OPEN_WAIT_S = 5.0
# Parses waiting on the grammar worker at once (threads of their own, apart from the store's): more
# wait their turn without holding a thread.
GRAMMAR_PARSES = 16
_grammar_parses: anyio.CapacityLimiter | None = None


@router.get("/v1/models")
async def models(request: Request) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    return {"object": "list", "data": await _models(state)}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str) -> dict:
    state = state_of(request)
    await state.authenticate(request)
    for found in await _models(state):
        if found["id"] == model_id:
            return found
    raise ApiError(404, f"the model {model_id!r} does not exist (GET /v1/models lists the served ones)",
                   "model", "model_not_found")


async def _models(state: ServerState) -> list[dict]:
    """The models the live daemons serve; `created` is when the first of them started, `root` and
    `parent` are vLLM's fields (the model itself; no base model), which its clients read."""
    daemons = await state.live_daemons()
    created = int(min((d.started_at for d in daemons), default=time.time()))
    return [{"id": name, "object": "model", "created": created, "owned_by": "fsched", "root": name,
             "parent": None} for name in sorted({d.model for d in daemons})]


# The endpoints api/hotpath.py answers before FastAPI's routing; their routes below are the way in when
# it does not (and what names their methods in a 405).
POSTED = {"/v1/completions": Endpoint.COMPLETIONS, "/v1/chat/completions": Endpoint.CHAT}


@router.post("/v1/completions")
async def completions(request: Request):
    return await _serve(request, Endpoint.COMPLETIONS, await request.body())


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await _serve(request, Endpoint.CHAT, await request.body())


def hot_handlers() -> dict[str, Callable[[Request, bytes], Awaitable[Response]]]:
    """api/hotpath.py's handlers of the online endpoints, by path: the request and its body."""

    def handler(endpoint: Endpoint) -> Callable[[Request, bytes], Awaitable[Response]]:
        return lambda request, body: _serve(request, endpoint, body)

    return {path: handler(endpoint) for path, endpoint in POSTED.items()}


async def _serve(request: Request, endpoint: Endpoint, body: bytes):
    began = time.time()
    state = state_of(request)
    # A key this server has read before is not read again: whether it was revoked since is checked in
    # the transaction that stores the row (a thread hop and a read fewer on every request).
    known = state.known_key(request)
    key = known or await state.authenticate(request)
    try:
        online = await _parse(body, endpoint, key, state)
        await state.require_daemon()
        job_id = await submit(state, key, online)
        stamp("handler", job_id, began)
        stamp("arrived", job_id, request.scope.get(ARRIVED, began))
        if stamps_on():
            tag(job_id, request.headers.get(TAG_HEADER))
    except ApiError:
        if known is not None:
            await state.authenticate(request)  # a revoked key answers 401 before anything, as read
        raise
    if online.stream:
        return await streamed(request, state, job_id, online, key,
                              partial(stream_response, request, state, endpoint, job_id, online))
    return await _answer(request, state, endpoint, job_id, online)


async def streamed(request: Request, state: ServerState, job_id: int, online: OnlineRequest, key: ApiKey,
                   respond: Callable[[AsyncIterator[Update], HangUp], Awaitable[Response]]) -> Response:
    """A streamed request's response, `respond(progress, hang_up)` once its first news is in, or 499 when
    its client went away first. One watcher of the client (api/hangup.py) serves the wait and the stream,
    whose response stops it (any other end here stops it)."""
    hang_up = HangUp(request.receive)
    try:
        opened = await first_news(request, state, job_id, online, key, hang_up)
        if opened is None:
            hang_up.stop()
            return JSONResponse(error_body(499, "client closed the request"), 499)
        return await respond(opened, hang_up)
    except BaseException:
        hang_up.stop()
        raise


async def stream_response(request: Request, state: ServerState, endpoint: Endpoint, job_id: int,
                          online: OnlineRequest, progress: AsyncIterator[Update],
                          hang_up: HangUp) -> Response:
    """A chat or completions stream's response, its progress followed from `progress` on."""
    outlet = Outlet()
    return BoundedStream(await _stream(request, state, endpoint, job_id, online, progress, outlet),
                         state.guard.rules.stall_s, outlet, hang_up)


async def first_news(request: Request, state: ServerState, job_id: int, online: OnlineRequest,
                     key: ApiKey, hang_up: HangUp) -> AsyncIterator[Update] | None:
    """The job's progress under the stream rules of api/guard.py (keep-alives, ends), its stream held
    back until its first output token or its end (at most STREAM_OPEN_WAIT_S): a request the engine
    refuses (a prompt over the context) answers its error status before any stream starts, as
    unstreamed. None when the client went away first (`hang_up` says; the request is cancelled)."""
    watch = _updates(state, job_id, key)

    async def first() -> Update | None:
        async for update in watch:
            if isinstance(update, StreamEnd):
                return update
            if not isinstance(update, KeepAlive) and any(p.num_output_tokens or p.status.is_finished
                                                         for p in update):
                return update
        return None

    waiting = asyncio.ensure_future(first())
    if await hang_up.before(waiting, STREAM_OPEN_WAIT_S):
        waiting.cancel()
        # Its read of `watch` unwound first: a generator that a task still waits inside cannot be closed.
        await asyncio.wait({waiting})
        await watch.aclose()
        await cancel(state, job_id)
        return None
    opening = waiting.result() if waiting.done() else None
    failed = failed_choice(opening) if isinstance(opening, tuple) else None
    if failed is not None:
        await watch.aclose()
        observe(state, online, waiting.result())
        status, message = failure(failed)
        raise ApiError(status, message, code="request_failed")
    return _then(waiting, watch)


async def _then(first: asyncio.Future, rest: AsyncIterator[Update]) -> AsyncIterator[Update]:
    """The first news (awaited here when it had not come before the stream opened), then the rest."""
    try:
        opening = await first
        if opening is not None:
            yield opening
        async for choices in rest:
            yield choices
    finally:
        first.cancel()
        await rest.aclose()


async def _parse(body: bytes, endpoint: Endpoint, key: ApiKey, state: ServerState) -> OnlineRequest:
    return await parsed_off_loop(text_of(body), endpoint, key, await state.limits(),
                                 tool_parser=state.tool_parser, thinking=state.thinking)


def may_name_a_grammar(text: str) -> bool:
    """Whether a body may carry a grammar: it says `response_format` or `tool_choice` (a required or
    named call is held to a grammar), or escapes a character (a key can be spelled with escapes)."""
    return "response_format" in text or "tool_choice" in text or "\\u" in text


async def parsed_off_loop(text: str, endpoint: Endpoint, key: ApiKey, limits: InputLimits,
                          field_name: Callable[[str | None], str | None] = lambda field: field,
                          tool_parser: str = "auto", thinking: PromptThinking | None = None) -> OnlineRequest:
    """`parsed`, in a thread when the body may carry a grammar (checking one waits on the isolated
    grammar worker: seconds for a large schema) or the model's template is rendered (`thinking`:
    milliseconds for a long conversation), which the event loop never waits on."""
    if not may_name_a_grammar(text) and thinking is None:
        return parsed(text, endpoint, key, limits, field_name, tool_parser, thinking)
    global _grammar_parses
    if _grammar_parses is None:
        _grammar_parses = anyio.CapacityLimiter(GRAMMAR_PARSES)
    return await anyio.to_thread.run_sync(parsed, text, endpoint, key, limits, field_name, tool_parser,
                                          thinking, limiter=_grammar_parses)


def parsed(text: str, endpoint: Endpoint, key: ApiKey, limits: InputLimits,
           field_name: Callable[[str | None], str | None] = lambda field: field, tool_parser: str = "auto",
           thinking: PromptThinking | None = None) -> OnlineRequest:
    """The body as `parse_online` reads it, or the ApiError its refusal answers: 403 for a class above
    the key's, else 400 (`field_name`: the field's name as the client's body says it)."""
    try:
        return parse_online(text, endpoint, key, limits, tool_parser, thinking)
    except ClassRefused as exc:
        raise ApiError(403, exc.message, field_name(exc.field), "class_not_allowed") from None
    except BodyError as exc:
        raise ApiError(400, exc.message, field_name(exc.field), "invalid_value") from None


async def submit(state: ServerState, key: ApiKey, online: OnlineRequest) -> int:
    await ratelimit.admit(state, key, online)
    limits = await state.limits()
    link = state.link
    # Announced to the daemons the moment its group is stored (api/submitter.py), before this resumes.
    announce = None if link is None else partial(link.announce, linkable=_linkable(online))
    try:
        job = await state.submit_online(online.job, limits.max_queued_per_tenant, announce,
                                        None if link is None else link.closed)
        stamp("stored", job.job_id)
    except QueueFull:
        raise ApiError(429, f"tenant {key.tenant!r} has too many unfinished requests "
                            f"(limit {limits.max_queued_per_tenant:,}); retry later",
                       code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except KeyRevoked:
        state.forget_key(key.id)
        raise ApiError(401, "invalid or revoked API key", code="invalid_api_key") from None
    return job.job_id


def _linkable(online: OnlineRequest) -> bool:
    """Whether a daemon may push this request's text over its link: one choice, and nothing per token
    (logprobs, token ids) that only the table carries."""
    answer = online.spec.answer
    return len(online.specs) == 1 and not answer.logprobs and not answer.token_ids


async def cancel(state: ServerState, job_id: int) -> None:
    await state.call(state.backend.jobs.cancel_job, job_id)
    if state.link is not None:
        state.link.wake()  # the daemon holding it drops it now, not at its next sync


async def _answer(request: Request, state: ServerState, endpoint: Endpoint, job_id: int,
                  online: OnlineRequest) -> Response:
    """Wait for the whole answer; a client gone before it comes cancels the request."""
    final = await final_or_disconnect(request, state, job_id)
    if final is None:
        await cancel(state, job_id)
        if state.hub.closing:
            raise ApiError(503, "the server is shutting down; the request was cancelled (send it again)",
                           code="server_shutdown")
        return JSONResponse(error_body(499, "client closed the request"), 499)
    observe(state, online, final)
    failed = failed_choice(final)
    if failed is not None:
        status, message = failure(failed)
        raise ApiError(status, message, code="request_failed")
    created = int(max(p.finished_at or time.time() for p in final))
    choices = [choice_of(p, online.specs[p.choice].prompt) for p in final]
    prompt_ids = await _prompt_ids(state, online) if online.spec.answer.token_ids else None
    body = response_body(endpoint, opaque_response_id(endpoint), created, _model(online, final[0]), choices,
                         online.spec.answer, prompt_ids)
    return Response(json_text(body), media_type="application/json")


async def _prompt_ids(state: ServerState, online: OnlineRequest) -> list[list[int]]:
    """vLLM's prompt_token_ids: each prompt's ids, as the daemon encodes them (the first choice of each)."""
    firsts = online.specs[::online.spec.answer.n]
    return [await prompt_token_ids(state, s.prompt, [m.to_json() for m in s.messages] or None)
            for s in firsts]


async def final_or_disconnect(request: Request, state: ServerState, job_id: int) -> Choices | None:
    """The request's final rows, or None when the client disconnected first."""

    async def final() -> Choices | None:
        last = None
        async for choices in state.hub.follow(job_id, tick_s=1.0):
            if state.hub.closing:
                return None
            last = choices if choices is not None else last
        return last

    waiting = asyncio.ensure_future(final())
    hang_up = HangUp(request.receive)
    try:
        await hang_up.before(waiting)
    finally:
        hang_up.stop()
        if not waiting.done():
            waiting.cancel()
    return waiting.result() if waiting.done() and not waiting.cancelled() else None


async def _stream(request: Request, state: ServerState, endpoint: Endpoint, job_id: int,
                  online: OnlineRequest, progress: AsyncIterator[Update],
                  outlet: Outlet | None = None) -> AsyncIterator[str]:
    """Chat's and completions' server-sent events: chunks as tokens come (the choices interleaved, each
    by its index), the usage chunk if asked, `[DONE]`; under the rules of `relayed` (its generator
    itself: no layer of its own to pass each token through)."""
    try:
        prompt_ids = await _prompt_ids(state, online) if online.spec.answer.token_ids else None
    except BaseException:
        await progress.aclose()
        with anyio.CancelScope(shield=True):
            await cancel(state, job_id)
        raise
    relay = StreamRelay(endpoint, opaque_response_id(endpoint), int(time.time()),
                        online.spec.model or DEFAULT_MODEL_NAME, online, prompt_ids)
    return relayed(request, state, job_id, online, progress, _ChatEvents(relay), outlet)


class StreamEvents(Protocol):
    """What one endpoint's stream says, as SSE text; `relayed` says it when the rules have it."""

    trailer: ClassVar[str]  # after the answer or its failure (not after a rule's end): "" for nothing

    def opening(self) -> Iterable[str]: ...

    def update(self, choices: Choices) -> Iterable[str]: ...

    def closing(self, final: Choices) -> Iterable[str]: ...

    def error(self, status: int, message: str, code: str) -> str: ...


@dataclass(slots=True)
class _ChatEvents:
    relay: StreamRelay
    trailer: ClassVar[str] = "data: [DONE]\n\n"

    def opening(self) -> Iterable[str]:
        return [f"data: {text}\n\n" for text in self.relay.opening_json()]

    def update(self, choices: Choices) -> Iterable[str]:
        return [f"data: {text}\n\n" for text in self.relay.update_json(choices)]

    def streams_running_text(self) -> bool:
        """Whether `running` can say the one choice's next running text now."""
        return self.relay.streams_running_text()

    def running(self, output_text: str) -> bytes:
        """`update`'s events, as bytes, for the one running choice whose output so far is `output_text`
        (a daemon's push: no progress made, the chunk from the stream's template)."""
        chunk = self.relay.running_json(output_text)
        return f"data: {chunk}\n\n".encode() if chunk else b""

    def closing(self, final: Choices) -> Iterable[str]:
        return map(sse, self.relay.closing(final))

    def error(self, status: int, message: str, code: str) -> str:
        return sse(error_body(status, message, code=code))


async def relayed(request: Request, state: ServerState, job_id: int, online: OnlineRequest,
                  progress: AsyncIterator[Update], events: StreamEvents,
                  outlet: Outlet | None = None) -> AsyncIterator[str]:
    """A streamed request's events (chat's, completions', the Responses API's): its opening, its
    updates as they come, keep-alive comments while nothing does, its closing; or an error event
    when it fails or a rule of api/guard.py ends the stream (then the request is cancelled).

    A client that hangs up cancels the request: its response (api/sse.py's BoundedStream) waits for
    the disconnect (the server does not fail a write to a closed connection) and cancels the stream,
    and this generator's `finally` cancels an unfinished request however it was closed (a client
    gone or stalled, a stop).

    With an `outlet`, a daemon's push of running progress that comes while this generator waits is
    written by the push itself (the hub's sink): the same events, no task woken per token.
    """
    ended = attached = False
    unstamped = stamps_on()
    pushes = _PushWriter(events, outlet)
    last = ""  # the answer's last update's events: written with its ending, one write (not two) a request
    try:
        opening = "".join(events.opening())  # each step's events in one piece: one write, not one an event
        if opening:
            yield opening
        while True:
            if outlet is not None and not attached:
                attached = state.hub.attach(job_id, pushes.sink, pushes.text_sink)
            update = await pushes.waited(progress)
            if update is None:
                break
            if isinstance(update, KeepAlive):
                yield KEEPALIVE
                continue
            if isinstance(update, StreamEnd):  # cancelled before the client hears it is
                ended = True
                await cancel(state, job_id)
                yield events.error(update.status, update.message, update.code)
                return
            pushes.final = update
            if failed_choice(update) is not None:
                break
            if unstamped:  # its first update: the first token
                unstamped = False
                stamp("written", job_id)
            piece = "".join(events.update(update))
            if all(p.status.is_finished for p in update):  # the end (nothing follows): with the ending
                last += piece
            elif piece:
                yield piece
        if ending := last + "".join(_ending(state, online, pushes.final, events)):
            yield LastPiece(ending)
        stamp("end_written", job_id)
    finally:
        pushes.idle = False
        final = pushes.final
        if not ended and (final is None or not all(p.status.is_finished for p in final)):
            with anyio.CancelScope(shield=True):  # the generator itself may be being cancelled
                await cancel(state, job_id)


@dataclass(slots=True, eq=False)
class _PushWriter:
    """A stream's writes of a daemon's pushes made by the push itself (the hub's sinks), while its
    generator waits with nothing in hand (`idle`): the same events, no task woken per token."""

    events: StreamEvents
    outlet: Outlet | None
    idle: bool = False
    final: Choices | None = None  # the last progress the stream sent, by either way

    async def waited(self, progress: AsyncIterator[Update]) -> Update | None:
        """`progress`'s next update (None once it has run out), the sinks writing pushes meanwhile."""
        self.idle = True
        try:
            return await anext(progress, None)
        finally:
            self.idle = False

    def sink(self, choices: Choices) -> bool:
        if not self.idle or not self.outlet.write_now(self._rendered, choices):
            return False
        self.final = choices
        return True

    def _rendered(self, choices: Choices) -> bytes:
        return "".join(self.events.update(choices)).encode()

    @property
    def text_sink(self) -> Callable[[str], bool] | None:
        """The sink of a push's running text, written as it is, where the stream's events say one from
        text alone (`final` is not moved on: it only matters once it is an end, which never comes
        this way)."""
        return self._text if hasattr(self.events, "running") else None

    def _text(self, text: str) -> bool:
        return self.idle and self.events.streams_running_text() and self.outlet.write_now(self.events.running,
                                                                                            text)


def _ending(state: ServerState, online: OnlineRequest, final: Choices | None,
            events: StreamEvents) -> list[str]:
    """A stream's last events once its updates end: its failure, or its closing; then the trailer."""
    observe(state, online, final)
    failed = failed_choice(final)
    if failed is not None:
        ending = [events.error(*failure(failed), "request_failed")]
    else:
        ending = list(events.closing(final))
    return ending + [events.trailer] if events.trailer else ending


def _updates(state: ServerState, job_id: int, key: ApiKey) -> AsyncIterator[Update]:
    async def live() -> int:
        return len(await state.live_daemons())

    return guarded(state.hub, state.guard, job_id, key, state.read_key, live)


def _model(online: OnlineRequest, progress: RequestProgress) -> str:
    return online.spec.model or progress.model or DEFAULT_MODEL_NAME


def failed_choice(choices: Choices | None) -> RequestProgress | None:
    """The first choice that ended without finishing done (failed or cancelled), if any."""
    return next((p for p in choices or () if p.status.is_finished and not p.status.succeeded), None)


def failure(progress: RequestProgress) -> tuple[int, str]:
    if progress.status is RequestStatus.FINISHED_CANCELLED:
        return 500, "the request was cancelled (by an admin, or its job was cancelled) before it finished"
    return failure_status(progress.error), progress.error or "the request failed"


def observe(state: ServerState, online: OnlineRequest, choices: Choices | None) -> None:
    if state.metrics is not None and choices:
        state.metrics.observe(online.request_class, choices[0])

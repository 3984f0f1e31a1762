"""POST /v1/responses: OpenAI's Responses API for text, over the same queue as chat.

The body is said in chat's words (core/jobs/responses.py) and checked by the
chat parser; the request is a one-row job as a chat request is; the answer
is a `response` object or, streamed, the Responses event sequence.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fsched.api import online
from fsched.api.errors import ApiError, error_body
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.answers import opaque_responses_id
from fsched.core.jobs.jobfile import JobFileError, load_json_object
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.jobs.openai import BodyError, ClassRefused, OnlineRequest, choice_of, parse_online
from fsched.core.jobs.responses import (
    RESPONSES_NAME,
    ResponsesProblem,
    ResponsesRelay,
    ResponsesRequest,
    response_object,
    to_chat_body,
)
from fsched.core.jobs.results import DEFAULT_MODEL_NAME
from fsched.core.types import Endpoint

router = APIRouter()


@router.post("/v1/responses")
async def responses(request: Request):
    state = state_of(request)
    key = await state.authenticate(request)
    asked, chat = await _parse(request, state, key.request_class)
    await state.require_daemon()
    job_id = await online.submit(state, key, chat)
    response_id = opaque_responses_id()
    model = chat.spec.model or DEFAULT_MODEL_NAME
    logprobs = chat.spec.answer.logprobs
    if chat.stream:
        opened = await online.first_news(request, state, job_id, chat)
        if opened is None:
            return JSONResponse(error_body(499, "client closed the request"), 499)
        relay = ResponsesRelay(response_id, time.time(), model, asked.echo, logprobs,
                               chat.stream_options.obfuscation)
        return StreamingResponse(_stream(request, state, job_id, chat, relay, opened),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    final = await online.final_or_disconnect(request, state, job_id)
    if final is None:
        await online.cancel(state, job_id)
        return JSONResponse(error_body(499, "client closed the request"), 499)
    online.observe(state, chat, final)
    failed = online.failed_choice(final)
    if failed is not None:
        status, message = online.failure(failed)
        raise ApiError(status, message, code="request_failed")
    (done,) = final
    body = response_object(response_id, done.finished_at or time.time(), model, asked.echo, choice_of(done),
                           logprobs=logprobs)
    return Response(json_text(body), media_type="application/json")


async def _parse(request: Request, state: ServerState, key_class) -> tuple[ResponsesRequest, OnlineRequest]:
    limits = await state.limits()
    try:
        text = (await request.body()).decode("utf-8")
        asked = to_chat_body(load_json_object(text, limits.max_depth), limits)
        return asked, parse_online(json.dumps(asked.chat_body), Endpoint.CHAT, key_class, limits)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None
    except (JobFileError, ResponsesProblem) as exc:
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    except ClassRefused as exc:
        raise ApiError(403, exc.message, exc.param, "class_not_allowed") from None
    except BodyError as exc:
        raise ApiError(400, exc.message, _responses_name(exc.param), "invalid_value") from None


def _responses_name(param: str | None) -> str | None:
    """A chat field's path in the Responses body's words ("messages[1]" -> "input[1]")."""
    if param is None:
        return None
    for chat_name, name in RESPONSES_NAME.items():
        if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
            return name + param[len(chat_name):]
    return param


async def _stream(request: Request, state: ServerState, job_id: int, chat: OnlineRequest,
                  relay: ResponsesRelay, progress: AsyncIterator) -> AsyncIterator[str]:
    """The Responses events as the text is flushed; a client that hangs up cancels the request."""
    final = None
    hang_up = asyncio.ensure_future(_cancel_on_disconnect(request, state, job_id))
    try:
        for event in relay.opening():
            yield _sse(event)
        async for choices in progress:
            final = choices
            if online.failed_choice(choices) is not None:
                break
            for event in relay.update(choices):
                yield _sse(event)
        online.observe(state, chat, final)
        failed = online.failed_choice(final)
        if failed is not None:
            status, message = online.failure(failed)
            yield _sse({"type": "error", "sequence_number": relay.seq, "code": "request_failed",
                        "message": message, "param": None, **error_body(status, message)})
        else:
            for event in relay.closing(final, choice_of(final[0])):
                yield _sse(event)
    finally:
        hang_up.cancel()
        if final is None or not all(p.state.finished for p in final):
            with anyio.CancelScope(shield=True):
                await online.cancel(state, job_id)


async def _cancel_on_disconnect(request: Request, state: ServerState, job_id: int) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    await online.cancel(state, job_id)


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json_text(event, separators=(',', ':'))}\n\n"

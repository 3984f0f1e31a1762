"""POST /v1/responses: OpenAI's Responses API for text, over the same queue as chat.

The body is said in chat's words (core/openai/responses.py) and checked by the
chat parser; the request is a one-row job as a chat request is; the answer
is a `response` object or, streamed, the Responses event sequence, under the
stream rules chat's streams follow (api/online.py `relayed`, api/guard.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fsched.api import online
from fsched.api.errors import ApiError, error_body
from fsched.api.hub import Choices
from fsched.api.limits import body_text
from fsched.api.sse import BoundedStream, Outlet
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.inputs import InputError
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.jobs.jsontext import loads_object
from fsched.core.openai.answers import opaque_responses_id
from fsched.core.openai.online import OnlineRequest, choice_of
from fsched.core.openai.responses import (
    RESPONSES_NAME,
    ResponsesRelay,
    ResponsesRequest,
    response_object,
    to_chat_body,
)
from fsched.core.openai.results import DEFAULT_MODEL_NAME
from fsched.core.types import Endpoint

router = APIRouter()


@router.post("/v1/responses")
async def responses(request: Request):
    state = state_of(request)
    key = await state.authenticate(request)
    asked, chat = await _parse(request, state, key)
    await state.require_daemon()
    job_id = await online.submit(state, key, chat)
    response_id = opaque_responses_id()
    model = chat.spec.model or DEFAULT_MODEL_NAME
    logprobs = chat.spec.answer.logprobs
    if chat.stream:
        events = _ResponsesEvents(ResponsesRelay(response_id, time.time(), model, asked.echo, logprobs,
                                                 chat.stream_options.obfuscation, chat.spec.answer))

        async def respond(opened, hang_up) -> Response:
            outlet = Outlet()
            return BoundedStream(online.relayed(request, state, job_id, chat, opened, events, outlet),
                                 state.guard.rules.stall_s, outlet, hang_up)

        return await online.streamed(request, state, job_id, chat, key, respond)
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
                           logprobs=logprobs, answer=chat.spec.answer)
    return Response(json_text(body), media_type="application/json")


async def _parse(request: Request, state: ServerState, key: ApiKey) -> tuple[ResponsesRequest, OnlineRequest]:
    """The Responses body, and the chat request it says (a chat field refused is named by its Responses
    name)."""
    limits = await state.limits()
    text = await body_text(request)
    try:
        asked = to_chat_body(loads_object(text, limits.max_depth), limits)
    except InputError as exc:  # the body's JSON, or a field of the Responses body itself
        raise ApiError(400, exc.message, exc.field, "invalid_value") from None
    return asked, await online.parsed_off_loop(json.dumps(asked.chat_body), Endpoint.CHAT, key, limits,
                                               _responses_name, state.tool_parser, state.thinking)


def _responses_name(param: str | None) -> str | None:
    """A chat field's path in the Responses body's words ("messages[1]" -> "input[1]")."""
    if param is None:
        return None
    for chat_name, name in RESPONSES_NAME.items():
        if param == chat_name or param.startswith((chat_name + ".", chat_name + "[")):
            return name + param[len(chat_name):]
    return param


@dataclass(slots=True)
class _ResponsesEvents:
    """The Responses event sequence as the text is flushed (online.relayed says when)."""

    relay: ResponsesRelay
    trailer: ClassVar[str] = ""

    def opening(self) -> Iterable[str]:
        return map(_sse, self.relay.opening())

    def update(self, choices: Choices) -> Iterable[str]:
        return map(_sse, self.relay.update(choices))

    def closing(self, final: Choices) -> Iterable[str]:
        return map(_sse, self.relay.closing(final, choice_of(final[0])))

    def error(self, status: int, message: str, code: str) -> str:
        return _sse({"type": "error", "sequence_number": self.relay.seq, "code": code, "message": message,
                     "param": None, **error_body(status, message, code=code)})


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json_text(event, separators=(',', ':'))}\n\n"

"""Finished requests as OpenAI batch output lines."""

from __future__ import annotations

from dataclasses import dataclass

from fsched.core.jobs.openai import response_body
from fsched.core.types import Endpoint, RequestId, RequestState

DEFAULT_MODEL_NAME = "fsched"


@dataclass(slots=True, frozen=True)
class RequestResult:
    """A finished request as the job table reports it: what its output line is made of."""

    id: RequestId
    idx: int
    custom_id: str
    endpoint: str
    state: RequestState
    model: str | None
    output_text: str
    num_output_tokens: int
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    finished_at: float | None


def output_line(result: RequestResult) -> dict:
    """One line of `fsched results`: `id, custom_id, response, error`."""
    line = {"id": f"batch_req_{result.id}", "custom_id": result.custom_id}
    if result.state is RequestState.DONE:
        line["response"] = {
            "status_code": 200,
            "request_id": f"req_{result.id}",
            "body": _response_body(result),
        }
        line["error"] = None
    else:
        line["response"] = None
        line["error"] = _error(result)
    return line


def _response_body(result: RequestResult) -> dict:
    return response_body(
        Endpoint(result.endpoint), result.id, int(result.finished_at or 0),
        result.model or DEFAULT_MODEL_NAME, result.output_text, result.finish_reason, result.prompt_tokens,
        result.num_output_tokens,
    )


def _error(result: RequestResult) -> dict:
    if result.state is RequestState.CANCELLED:
        return {"code": "cancelled", "message": "the request was cancelled before it finished"}
    return {"code": "request_failed", "message": result.error or "the request failed"}

"""Finished requests as OpenAI batch output lines (DESIGN §6)."""

from __future__ import annotations

from fsched.core.store.records import RequestResult
from fsched.core.types import Endpoint, RequestState

DEFAULT_MODEL_NAME = "fsched"


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
    created = int(result.finished_at or 0)
    model = result.model or DEFAULT_MODEL_NAME
    prompt_tokens = result.prompt_tokens or 0
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": result.num_output_tokens,
        "total_tokens": prompt_tokens + result.num_output_tokens,
    }
    finish_reason = result.finish_reason or "stop"
    if result.endpoint == Endpoint.CHAT.value:
        return {
            "id": f"chatcmpl-{result.id}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.output_text},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{result.id}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": result.output_text,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def _error(result: RequestResult) -> dict:
    if result.state is RequestState.CANCELLED:
        return {"code": "cancelled", "message": "the request was cancelled before it finished"}
    return {"code": "request_failed", "message": result.error or "the request failed"}

"""Finished requests as OpenAI batch output lines: one line a request line, its choices by index."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from fsched.core.openai.answers import AnswerChoice, response_body, response_id
from fsched.core.ports.records import RequestResult
from fsched.core.types import Endpoint, RequestStatus

DEFAULT_MODEL_NAME = "fsched"


def lines_of(results: Iterable[RequestResult]) -> Iterator[tuple[RequestResult, ...]]:
    """Rows grouped into their lines: a line's choices come together, the first is choice 0."""
    line: list[RequestResult] = []
    for result in results:
        if result.choice == 0 and line:
            yield tuple(line)
            line = []
        line.append(result)
    if line:
        yield tuple(line)


def output_line(line: Sequence[RequestResult] | RequestResult) -> dict:
    """One line of `fsched results`: `id, custom_id, response, error`."""
    rows = (line,) if isinstance(line, RequestResult) else tuple(line)
    first = rows[0]
    out = {"id": f"batch_req_{first.id}", "custom_id": first.custom_id}
    failed = next((r for r in rows if not r.status.succeeded), None)
    if failed is None:
        out["response"] = {
            "status_code": 200,
            "request_id": f"req_{first.id}",
            "body": _response_body(rows),
        }
        out["error"] = None
    else:
        out["response"] = None
        out["error"] = _error(failed)
    return out


def _response_body(rows: Sequence[RequestResult]) -> dict:
    first = rows[0]
    endpoint = Endpoint(first.endpoint)
    choices = [AnswerChoice(index=r.choice, text=r.output_text, finish_reason=r.finish_reason,
                      num_tokens=r.num_output_tokens, prompt_tokens=r.prompt_tokens, tokens=r.output_tokens,
                      logprobs=r.logprobs, prompt=r.prompt) for r in rows]
    created = int(max(r.finished_at or 0 for r in rows))
    return response_body(endpoint, response_id(endpoint, first.id), created,
                         first.model or DEFAULT_MODEL_NAME, choices, first.answer)


def _error(result: RequestResult) -> dict:
    if result.status is RequestStatus.FINISHED_CANCELLED:
        return {"code": "cancelled", "message": "the request was cancelled before it finished"}
    return {"code": "request_failed", "message": result.error or "the request failed"}

"""Test shorthand over the queue: end one request, as the daemon ends many."""

from __future__ import annotations

from collections.abc import Sequence

from fsched.core.ports.queue import QueueStore
from fsched.core.ports.records import Completion
from fsched.core.types import RequestId, RequestStatus


def finish(
    store: QueueStore,
    request_id: RequestId,
    status: RequestStatus,
    output_tokens: Sequence[int] = (),
    output_text: str = "",
    prompt_tokens: int | None = None,
    model: str | None = None,
    error: str | None = None,
    owner: str | None = None,
    lease_epoch: int | None = None,
) -> bool:
    """`store.finish_requests` with one completion; whether it was written."""
    completion = Completion(request_id, status, tuple(output_tokens), output_text, prompt_tokens, model,
                            error, lease_epoch=lease_epoch)
    return store.finish_requests([completion], owner)[0]

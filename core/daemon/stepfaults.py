"""Whose fault was a failed model step: the rule that requeues most requests and fails a poison one.

A step with one request in it is that request's: it counts against it, and
`max_attempts` such steps fail it. A step with several could be any one's,
or none's (a transient fault):

- Out of memory (torch.cuda.OutOfMemoryError, MemoryError): the batch was
  too big. Halve it for the rest of the run and count nothing against
  anyone; a request that runs out of memory alone does not fit at all, and
  fails after `max_attempts`.
- Any other error: counting it against every request in the step would fail
  a poison request's batch mates with it (they are claimed and batched
  together again, and all reach `max_attempts` at once). So it counts
  against no one, and the batch is capped at half the failed step's size for
  a while: a request that keeps failing steps ends up alone in one within
  log2(max batch) failures, and then counts.

Only the failed steps a request was in count, not its claims: a request
reclaimed after a daemon crash has not crashed anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from fsched.core.daemon.engine import Engine, StepFailed
from fsched.core.types import RequestId

log = logging.getLogger("fsched.daemon")

ISOLATE_STEPS = 200  # how long the batch stays capped after a failed step with several requests


def out_of_memory(error: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (known by name: core does not import torch) or MemoryError."""
    if isinstance(error, MemoryError):
        return True
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__)


@dataclass(slots=True)
class Verdict:
    """What to do with the requests a failed step dropped."""

    fail: dict[RequestId, int] = field(default_factory=dict)  # request -> failed steps it was alone in
    requeue: list[RequestId] = field(default_factory=list)


class StepFaults:
    """Counts, per request, the failed steps it was alone in; steers the batch after a failure."""

    def __init__(self, engine: Engine, max_attempts: int, isolate_steps: int = ISOLATE_STEPS):
        self.engine = engine
        self.max_attempts = max_attempts
        self.isolate_steps = isolate_steps
        self.failures: dict[RequestId, int] = {}

    def judge(self, failure: StepFailed, dropped: Iterable[RequestId]) -> Verdict:
        """Count the failure, shrink or cap the batch, and sort the dropped requests."""
        involved = set(failure.request_ids)
        if len(involved) > 1:
            if out_of_memory(failure.error):
                self._shrink_batch(len(involved))
            else:
                self._isolate(len(involved))
        verdict = Verdict()
        for request_id in dropped:
            if len(involved) == 1 and request_id in involved:
                self.failures[request_id] = self.failures.get(request_id, 0) + 1
            failures = self.failures.get(request_id, 0)
            if failures >= self.max_attempts:
                del self.failures[request_id]
                verdict.fail[request_id] = failures
            else:
                verdict.requeue.append(request_id)
        return verdict

    def _shrink_batch(self, failed_batch: int) -> None:
        """Halve the batch that ran out of memory, for the rest of the run (floor 1)."""
        before, after = self.engine.shrink_batch(failed_batch)
        if after < before:
            log.warning("out of memory with %d requests in the step: max batch %d -> %d for the rest "
                        "of this run; the requests are requeued, no attempt counted",
                        failed_batch, before, after)

    def _isolate(self, failed_batch: int) -> None:
        """Cap the batch at half the failed step's size for the next `isolate_steps` steps."""
        rows = max(1, failed_batch // 2)
        self.engine.cap_batch(rows, self.isolate_steps)
        log.warning("a step with %d requests failed; at most %d a step for the next %d steps, "
                    "to find the request that fails it", failed_batch, rows, self.isolate_steps)

"""Reads the HTTP server makes of the job table: its online requests' progress, and metric totals.

One query answers every request a server process is waiting on, so a poll
costs one short read whatever the number of open streams; a request's
logprobs are read a piece at a time, each piece once (the store keeps what
it read of the requests it is polled for).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select

from fsched.core.ports.records import FirstTokens, RequestProgress, TenantTotals
from fsched.core.types import RequestClass, RequestStatus, TokenLogprobs
from fsched.storage.activity import first_tokens
from fsched.storage.db import Database
from fsched.storage.logprobs import read as read_logprobs
from fsched.storage.output import Output
from fsched.storage.output import read as read_outputs
from fsched.storage.prepared import Prepared, listed
from fsched.storage.rows import PROGRESS_COLUMNS, RowState, jobs, request_progress, requests, status_of_row

FORGET_S = 60.0  # what the poll read of a request nobody polls for this long is dropped

# Built once: an open server runs them several times a second.
_JOB_IDS = bindparam("b_job_ids", expanding=True)
PROGRESS = (select(*PROGRESS_COLUMNS).where(requests.c.job_id.in_(_JOB_IDS))
            .order_by(requests.c.job_id, requests.c.choice))
STATES = Prepared(lambda n: select(requests.c.job_id, requests.c.state, requests.c.finish_reason,
                                   requests.c.num_output_tokens)
                  .where(listed(requests.c.job_id, "b_job_ids", n))
                  .order_by(requests.c.job_id, requests.c.choice), listed="b_job_ids")


@dataclass(slots=True)
class _Read:
    at: float  # when last polled
    records: tuple[TokenLogprobs, ...] = ()


@dataclass(slots=True)
class _OutputRead:
    at: float  # when last polled
    in_row: int  # the tokens its row held when it was read (another count: the row was written whole since)
    output: Output  # its row's output with the pieces read so far applied


class SqlServingStore:
    def __init__(self, db: Database, clock: Callable[[], float] = time.monotonic):
        self.db = db
        self.clock = clock
        # Logprobs read so far of the requests being polled: each poll reads only the pieces
        # appended since (the server polls its open requests every few ms).
        self._logprobs: dict[int, _Read] = {}
        self._outputs: dict[int, _OutputRead] = {}  # and running requests' output pieces, alike
        self._swept_at = clock()
        self._lock = threading.Lock()  # polls may come from more than one thread

    def progress(self, job_ids: Sequence[int]) -> dict[int, tuple[RequestProgress, ...]]:
        """Each given job's requests (an online request is a job of one row a choice), by job id,
        in choice order."""
        if not job_ids:
            return {}
        with self.db.read() as conn:
            rows = conn.execute(PROGRESS, {"b_job_ids": list(job_ids)}).all()
            with self._lock:
                logprobs = self._read_logprobs(conn, rows)
                outputs = self._read_outputs(conn, rows)
        out: dict[int, list[RequestProgress]] = {}
        for row in rows:
            out.setdefault(row.job_id, []).append(
                request_progress(row, logprobs.get(row.id, ()), outputs.get(row.id)))
        return {job_id: tuple(choices) for job_id, choices in out.items()}

    def progress_states(self, job_ids: Sequence[int]) -> dict[int, tuple[tuple[RequestStatus, int], ...]]:
        """Each given job's requests as (status, output tokens), in choice order: no text, no token ids
        (what a request's texts and ids would cost to read and decode grows with its length)."""
        if not job_ids:
            return {}
        # The server's check of its linked streams, several times a second: a statement compiled once
        # (storage/prepared.py), run on a driver connection (what SQLAlchemy's Connection, statement and
        # transaction cost around it was most of an idle server's CPU).
        rows = self.db.rows(STATES, {"b_job_ids": list(job_ids)})
        out: dict[int, list[tuple[RequestStatus, int]]] = {}
        for job_id, state, finish_reason, num_output_tokens in rows:
            out.setdefault(job_id, []).append((status_of_row(state, finish_reason), num_output_tokens))
        return {job_id: tuple(states) for job_id, states in out.items()}

    def _read_logprobs(self, conn, rows) -> dict[int, tuple[TokenLogprobs, ...]]:
        """The rows' logprobs: what earlier polls read, and the pieces appended since."""
        now = self.clock()
        behind = [row.id for row in rows
                  if row.num_logprobs > len(self._logprobs.setdefault(row.id, _Read(now)).records)]
        since = {key: n for key in behind if (n := len(self._logprobs[key].records))}
        for key, new in (read_logprobs(conn, behind, since) if behind else {}).items():
            self._logprobs[key].records += new
        out = {}
        for row in rows:
            read = self._logprobs[row.id]
            read.at = now
            out[row.id] = read.records
            if RowState(row.state).finished:
                del self._logprobs[row.id]  # read for the last time
        self._sweep(now)
        return out

    def _read_outputs(self, conn, rows) -> dict[int, Output]:
        """The output of the rows whose row holds only part of it: what earlier polls read of their pieces
        and the pieces appended since (a row that holds it all again is read from the row alone)."""
        now = self.clock()
        partial = {row.id: row for row in rows if row.num_output_tokens > len(row.output_tokens or ())}
        for row in rows:
            read = self._outputs.get(row.id)
            if read is not None and (row.id not in partial or read.in_row != len(row.output_tokens or ())):
                del self._outputs[row.id]  # ended, or its row was written whole since: read from the row on
        since = {key: self._outputs[key].output for key in partial if key in self._outputs}
        behind = [row for key, row in partial.items()
                  if key not in since or since[key].end < row.num_output_tokens]
        read = read_outputs(conn, behind, since) if behind else {}
        for row in behind:
            if row.id in read:
                self._outputs[row.id] = _OutputRead(now, len(row.output_tokens or ()), read[row.id])
            else:  # its pieces did not follow on (read at two moments): its row alone this time
                self._outputs.pop(row.id, None)
        for key in partial:
            if key in self._outputs:
                self._outputs[key].at = now
        return {key: self._outputs[key].output for key in partial if key in self._outputs}

    def _sweep(self, now: float) -> None:
        """Forget what requests nobody polled for a while (their readers went away)."""
        if now - self._swept_at < FORGET_S:
            return
        self._swept_at = now
        for key in [k for k, read in self._logprobs.items() if now - read.at > FORGET_S]:
            del self._logprobs[key]
        for key in [k for k, read in self._outputs.items() if now - read.at > FORGET_S]:
            del self._outputs[key]

    def tenant_totals(self) -> list[TenantTotals]:
        """What each tenant used, by class, over every job the table holds (chargeback): from the
        jobs' counters, so it reads the small jobs table, never the requests."""
        sums = [func.sum(c) for c in (jobs.c.num_output_tokens, jobs.c.num_prompt_tokens, jobs.c.num_done,
                                      jobs.c.num_failed, jobs.c.num_cancelled)]
        with self.db.read() as conn:
            rows = conn.execute(
                select(jobs.c.tenant, jobs.c["class"], *sums).group_by(jobs.c.tenant, jobs.c["class"])
            ).all()
        return [TenantTotals(row[0], RequestClass(row[1]), *(int(v or 0) for v in row[2:])) for row in rows]

    def first_tokens(self, since: float) -> dict[RequestClass, FirstTokens]:
        """First-token latency by class of the requests whose first token came after `since` (an index
        range: the cost follows the window, not the table)."""
        return first_tokens(self.db, since)

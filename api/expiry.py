"""Batches' completion windows and retention: a batch whose window runs out with work unfinished expires;
an ended batch's rows are reclaimed once the retention has passed.

As OpenAI's batches do: its unfinished requests are cancelled, what finished
stays in its output file, and the cancelled lines go to its error file as
`batch_expired`; the batch reads `expired`. Every server sweeps once a
second (any number may share a table: marking and cancelling are idempotent).

Once a minute each server also reclaims the batches that ended (completed,
failed, expired or cancelled) more than `batch_retention_s` ago: their
request rows, outputs and logprobs are deleted a bounded piece a
transaction; the batch keeps its status and counts.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fsched.api.state import ServerState

SWEEP_S = 1.0
RECLAIM_SWEEP_S = 60.0
RECLAIM_BATCHES = 20  # batches one reclaim sweep takes at most: the next takes the rest
log = logging.getLogger("fsched.api")


def expire_overdue(state: ServerState, now: float) -> list[str]:
    """Expire the batches whose windows ended by `now`; their ids."""
    files, jobs = state.backend.files, state.backend.jobs
    # A window is at most 24 h and at least 1 s: only batches older than a second can be due.
    due = [b for b in files.unfinished_batches(now - 1.0) if b.expires_at <= now]
    for record in due:
        files.mark_expired(record.id, now)  # first: a batch is never seen cancelled and not expired
        jobs.cancel_job(record.job_id)
    return [b.id for b in due]


async def expire_forever(state: ServerState, sweep_s: float = SWEEP_S) -> None:
    """The sweep, for the server's life; a table that cannot be read is tried again next time."""
    while True:
        await asyncio.sleep(sweep_s)
        try:
            await state.call(expire_overdue, state, time.time())
        except Exception:  # noqa: BLE001 - the next sweep tries again; requests see the table's error
            log.warning("the completion-window sweep could not read the job table", exc_info=True)


def reclaim_ended(state: ServerState, now: float, retention_s: float) -> list[str]:
    """Reclaim the rows of batches that ended more than `retention_s` before `now`; their ids."""
    return [b.id for b in state.backend.files.reclaim_batches(now - retention_s, RECLAIM_BATCHES)]


async def reclaim_forever(state: ServerState, sweep_s: float = RECLAIM_SWEEP_S) -> None:
    """The retention sweep, for the server's life, with the table's `batch_retention_s`."""
    while True:
        await asyncio.sleep(sweep_s)
        try:
            retention_s = (await state.limits(ask=False)).batch_retention_s
            reclaimed = await state.call(reclaim_ended, state, time.time(), retention_s)
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.warning("the batch retention sweep could not reclaim rows", exc_info=True)
            continue
        if reclaimed:
            log.info("reclaimed the rows of %d batch(es) ended over %d s ago", len(reclaimed), retention_s)

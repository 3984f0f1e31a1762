"""`fsched cancel`, `fsched results` and `fsched purge`: act on submitted jobs."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    acting_user,
    allow,
    fail,
    handle_errors,
    note,
    open_catalog,
    open_table_as_admin,
    print_json,
)


@handle_errors
def cancel(
    job_ids: Annotated[list[int], typer.Argument(help="Jobs to cancel.")],
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Cancel jobs: waiting requests at once, running ones at the daemon's next step."""
    from fsched.core.jobs.access import may_touch_job
    from fsched.core.ports.records import UnknownJob

    store = open_catalog(db)
    actor = acting_user(store)
    refused = []
    for job_id in job_ids:
        try:
            (job,) = store.list_jobs(job_id=job_id)
            refusal = may_touch_job(actor, "cancel", job_id, job.tenant)
            if refusal is not None:
                refused.append(job_id)
                print(f"fsched: error: {refusal}", file=sys.stderr)
                continue
            outcome = store.cancel_job(job_id)
        except UnknownJob as exc:
            refused.append(job_id)
            print(f"fsched: error: {exc}", file=sys.stderr)
            continue
        if as_json:
            print_json(
                {
                    "job_id": job_id,
                    "state": outcome.state.value,
                    "cancelled_now": outcome.cancelled_now,
                    "stopping": outcome.stopping,
                    "already_finished": outcome.already_finished,
                }
            )
        elif outcome.already_finished:
            print(f"job {job_id} is already {outcome.state.value}; nothing to cancel")
        elif outcome.stopping:
            print(
                f"job {job_id}: cancelled {outcome.cancelled_now} waiting request(s); "
                f"{outcome.stopping} running request(s) stop at the daemon's next step "
                f"({outcome.state.value})"
            )
        else:
            print(
                f"job {job_id}: cancelled {outcome.cancelled_now} waiting request(s) ({outcome.state.value})"
            )
    if refused:
        raise typer.Exit(1)


@handle_errors
def results(
    job_id: Annotated[int, typer.Argument(help="The job whose results to write.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")
    ] = None,
    errors: Annotated[
        bool, typer.Option("--errors", help="Write the failed and cancelled requests instead.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Write a job's results as OpenAI batch output lines, in input order."""
    from fsched.core.jobs.access import may_touch_job
    from fsched.core.jobs.jsontext import dumps as json_text
    from fsched.core.openai.results import lines_of, output_line

    store = open_catalog(db)
    job = store.list_jobs(job_id=job_id)[0]
    allow(may_touch_job(acting_user(store), "read the results of", job_id, job.tenant))
    lines = (
        json_text(output_line(line)) + "\n"
        for line in lines_of(store.iter_results(job_id, errors))
    )
    if output is None:
        written = 0
        for line in lines:
            sys.stdout.write(line)
            written += 1
        sys.stdout.flush()
    else:
        written = _write_atomically(output, lines)
        note(f"wrote {written} line(s) to {output}")
    unfinished = job.counts.num_requests - job.counts.num_finished
    if unfinished:
        note(
            f"note: job {job_id} is {job.state.value}; {unfinished} of "
            f"{job.counts.num_requests} request(s) have not finished yet"
        )


@handle_errors
def purge(
    older_than: Annotated[
        int | None,
        typer.Option("--older-than", min=0, help="Seconds since a batch ended (default: the table's "
                     "batch_retention_s limit; 0: every ended batch)."),
    ] = None,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Reclaim the rows of ended batches (an fsched admin only): their requests, outputs and logprobs.

    What `fsched serve` does once a minute for batches past the retention; a
    reclaimed batch keeps its status and counts, its output files' content is
    gone, and it no longer counts toward its tenant's file quota.
    """
    from fsched.core.jobs.limits import limits_in_force

    table = open_table_as_admin(db, "reclaiming batches' rows")
    if older_than is None:
        older_than = limits_in_force(table.keys.stored_limits()).batch_retention_s
    before = time.time() - older_than
    reclaimed = []
    while done := table.files.reclaim_batches(before, 100):
        reclaimed += done
    freed = sum(b.stored_bytes for b in reclaimed)
    if as_json:
        print_json({"older_than_s": older_than, "reclaimed": len(reclaimed), "stored_bytes": freed,
                    "batches": [{"id": b.id, "tenant": b.tenant, "job_id": b.job_id,
                                 "stored_bytes": b.stored_bytes} for b in reclaimed]})
        return
    print(f"reclaimed the rows of {len(reclaimed)} batch(es) that ended over {older_than:,} s ago "
          f"({freed:,} bytes no longer counted toward their tenants' quotas)")


def _write_atomically(path: Path, lines) -> int:
    """Write to a temporary file beside `path`, then rename: no half-written results."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        fail(f"cannot write {path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for line in lines:
                out.write(line)
                count += 1
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return count

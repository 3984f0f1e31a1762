"""`fsched cancel` and `fsched results`: act on submitted jobs."""

from __future__ import annotations

import os
import sys
import tempfile
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

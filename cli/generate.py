"""`fsched generate`: submit one request, wait for a daemon to serve it, print its text.

The job table is the only channel to the daemon: the request is stored as a
one-line job and its output is polled (a cheap read). The daemon flushes a
realtime or streaming request's tokens every engine step, so `--stream` shows
them as they come; a batch request's arrive about once a second.
"""

from __future__ import annotations

import getpass
import json
import signal
import sys
import time
from dataclasses import dataclass
from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    UserError,
    acting_user,
    allow,
    fail,
    handle_errors,
    limits_in_force,
    note,
    open_table,
    print_json,
)
from fsched.cli.submit import CLASS_NAMES, parse_class
from fsched.core.jobs.access import default_tenant, may_act_as
from fsched.core.ports.records import RequestProgress
from fsched.core.types import JobOrigin, RequestClass, RequestStatus

POLL_S = 0.02
DEFAULT_MAX_TOKENS = 64
# How often to look again for a live daemon while waiting (a heartbeat is ~1 s).
DAEMON_CHECK_S = 2.0


@dataclass(slots=True, frozen=True)
class Answer:
    """What a finished request gives the user: text and timing figures."""

    text: str
    tokens: int
    finish_reason: str | None
    ttft_ms: float | None  # submit (enqueued) to first token
    tok_s: float | None  # tokens after the first over the time since the first
    total_ms: float | None  # submit to finish


def answer_of(p: RequestProgress) -> Answer:
    ttft = None if p.first_token_at is None else (p.first_token_at - p.enqueued_at) * 1000
    total = None if p.finished_at is None else (p.finished_at - p.enqueued_at) * 1000
    tok_s = None
    if p.first_token_at is not None and p.finished_at is not None and p.num_output_tokens > 1:
        decode_s = p.finished_at - p.first_token_at
        if decode_s > 0:
            tok_s = (p.num_output_tokens - 1) / decode_s
    return Answer(p.output_text, p.num_output_tokens, p.finish_reason, ttft, tok_s, total)


def one_line_job(prompt: str, max_tokens: int | None, temperature: float | None, seed: int | None) -> bytes:
    """The request as a JSONL line; without --max-tokens the default applies (capped to the context)."""
    line: dict = {"custom_id": "generate", "prompt": prompt}
    if max_tokens is not None:
        line["max_tokens"] = max_tokens
    if temperature is not None:
        line["temperature"] = temperature
    if seed is not None:
        line["seed"] = seed
    return (json.dumps(line, ensure_ascii=False) + "\n").encode()


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f} {unit}"


TenantOption = Annotated[str | None, typer.Option("--tenant", "-t", help="Tenant (default: your OS user).")]
ClassOption = Annotated[str, typer.Option("--class", "-c", help=f"Service class: {CLASS_NAMES}.")]
MaxTokensOption = Annotated[int | None, typer.Option(
    "--max-tokens", help=f"Tokens to generate at most (default: {DEFAULT_MAX_TOKENS}).")]
TemperatureOption = Annotated[float | None, typer.Option(
    "--temperature", help="Sampling temperature, 0 is greedy (default: 1).")]
SeedOption = Annotated[int | None, typer.Option("--seed", help="Sampling seed (default: random).")]
StreamOption = Annotated[bool, typer.Option("--stream", "-s", help="Print the text as it is generated.")]
TimeoutOption = Annotated[float | None, typer.Option(
    "--timeout", help="Give up (and cancel) after this many seconds.")]


@handle_errors
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    tenant: TenantOption = None,
    request_class: ClassOption = "realtime",
    max_tokens: MaxTokensOption = None,
    temperature: TemperatureOption = None,
    seed: SeedOption = None,
    stream: StreamOption = False,
    timeout: TimeoutOption = None,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Generate from one prompt through the running daemon; Ctrl-C cancels it.

    Prints the text (as it comes with --stream), then the first-token latency
    and tokens/s on stderr. The request waits in the queue like any other, so
    a daemon must be running (`fsched daemon`).
    """
    from fsched.core.openai.batchfile import parse_job_file
    from fsched.core.ports.records import JobSubmission

    request_class = parse_class(request_class)
    if timeout is not None and timeout <= 0:
        raise UserError(f"--timeout must be > 0, got {timeout:g}")
    table = open_table(db)
    store = table.catalog
    actor = acting_user(store)
    tenant = tenant or default_tenant(actor, getpass.getuser())
    allow(may_act_as(actor, tenant))
    limits = limits_in_force(table)
    requests = parse_job_file(
        one_line_job(prompt, max_tokens, temperature, seed), "<generate>", limits, DEFAULT_MAX_TOKENS
    )
    # Ctrl-C cancels the request even where the shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    (job,) = store.submit([JobSubmission(requests=requests, tenant=tenant,
                                         request_class=request_class, priority=5, name="generate",
                                         origin=JobOrigin.GENERATE)],
                           max_queued_per_tenant=limits.max_queued_per_tenant)
    try:
        final = _wait(store, job.job_id, stream and not as_json, timeout)
    except KeyboardInterrupt:
        store.cancel_job(job.job_id)
        if stream and not as_json:
            sys.stdout.write("\n")
            sys.stdout.flush()
        note(f"fsched: interrupted; job {job.job_id} cancelled")
        raise typer.Exit(130) from None
    if as_json:
        print_json(answer_json(answer_of(final), final, job.job_id, job.tenant, request_class))
    else:
        print_answer(answer_of(final), job.job_id, streamed=stream)


def answer_json(answer: Answer, final: RequestProgress, job_id: int, tenant: str,
                request_class: RequestClass) -> dict:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "job_id": job_id, "request_id": final.id, "tenant": tenant, "class": request_class.value,
        "state": _state_word(final.status), "text": answer.text, "tokens": answer.tokens,
        "finish_reason": answer.finish_reason, "ttft_ms": rounded(answer.ttft_ms),
        "tok_s": rounded(answer.tok_s), "total_ms": rounded(answer.total_ms),
    }


def _state_word(status: RequestStatus) -> str:
    """The word `--json` has always shown: done, failed or cancelled."""
    return "done" if status.succeeded else status.word.removeprefix("finished_")


def print_answer(answer: Answer, job_id: int, streamed: bool) -> None:
    """The text on stdout (unless it was streamed already), the figures on stderr."""
    if not streamed:
        sys.stdout.write(answer.text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    note(f"first token {_fmt(answer.ttft_ms, 'ms')}, {_fmt(answer.tok_s, 'tok/s', 1)}, "
         f"{answer.tokens} tokens ({answer.finish_reason or 'n/a'}), job {job_id}")


def _wait(store, job_id: int, stream: bool, timeout: float | None) -> RequestProgress:
    """Poll the request until it ends; print new text when streaming. Raises on failure/timeout."""

    start = time.monotonic()
    warned = False
    next_daemon_check = start
    shown = 0
    while True:
        now = time.monotonic()
        if not warned and now >= next_daemon_check:
            next_daemon_check = now + DAEMON_CHECK_S
            wall = time.time()
            if not any(d.alive(wall) for d in store.list_daemons()):
                warned = True
                note("fsched: no daemon is running on this job table; the request waits for `fsched daemon`")
        (p,) = store.request_progress(job_id)
        if stream:
            visible = p.visible_text
            if len(visible) > shown:
                sys.stdout.write(visible[shown:])
                sys.stdout.flush()
                shown = len(visible)
        if p.status.is_finished:
            break
        if timeout is not None and now - start >= timeout:
            store.cancel_job(job_id)
            if stream:
                sys.stdout.write("\n")
                sys.stdout.flush()
            fail(f"no answer within {timeout:g} s; job {job_id} cancelled")
        time.sleep(POLL_S)
    if p.status is RequestStatus.FINISHED_FAILED:
        fail(f"request failed: {p.error or 'unknown error'} (job {job_id})")
    if p.status is RequestStatus.FINISHED_CANCELLED:
        fail(f"job {job_id} was cancelled")
    return p

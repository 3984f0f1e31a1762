"""`fsched submit`: validate whole files, then store them as jobs in one transaction."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsched.cli.common import (
    DbOption,
    JsonOption,
    UserError,
    acting_user,
    allow,
    handle_errors,
    known_tool_parser,
    limits_in_force,
    open_table,
    print_json,
)
from fsched.core.jobs.access import default_tenant, may_act_as
from fsched.core.jobs.jobfile import JobFileError
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.types import RequestClass, RequestSpec

if TYPE_CHECKING:
    from fsched.core.ports.records import SubmittedJob

CLASS_NAMES = ", ".join(c.value for c in RequestClass)


def parse_class(value: str) -> RequestClass:
    try:
        return RequestClass(value)
    except ValueError:
        raise UserError(f"--class must be one of {CLASS_NAMES}, got {value!r}") from None


def read_job_file(name: str, limits: InputLimits) -> bytes:
    """A file's bytes, refusing what cannot be a job file before reading it all."""
    if name == "-":
        data = sys.stdin.buffer.read(limits.max_bytes + 1)
        if len(data) > limits.max_bytes:
            raise JobFileError("<stdin>", f"input is over the limit of {limits.max_bytes:,} bytes")
        return data
    path = Path(name)
    try:
        if path.is_dir():
            raise JobFileError(name, "is a directory, not a JSONL file")
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise JobFileError(name, f"file is {size:,} bytes, over the limit of {limits.max_bytes:,}")
        return path.read_bytes()
    except FileNotFoundError:
        raise JobFileError(name, "no such file") from None
    except PermissionError:
        raise JobFileError(name, "permission denied") from None
    except OSError as exc:
        raise JobFileError(name, exc.strerror or str(exc)) from None


TenantOption = Annotated[str | None, typer.Option(
    "--tenant", "-t", help="Tenant (default: your OS user; another one needs an admin).")]
ClassOption = Annotated[str, typer.Option("--class", "-c", help=f"Service class: {CLASS_NAMES}.")]
PriorityOption = Annotated[int, typer.Option("--priority", "-p", help="Base priority, 0 (most urgent) to 9.")]
NameOption = Annotated[str | None, typer.Option("--name", "-n", help="Job name (default: file name).")]
MaxTokensOption = Annotated[int | None, typer.Option(
    "--max-tokens", help="max_tokens for lines that give none (default: 256).")]


@handle_errors
def submit(
    files: Annotated[list[str], typer.Argument(help="JSONL files of requests; '-' reads stdin.")],
    tenant: TenantOption = None,
    request_class: ClassOption = "batch",
    priority: PriorityOption = 5,
    name: NameOption = None,
    max_tokens: MaxTokensOption = None,
    tool_call_parser: Annotated[str, typer.Option(
        "--tool-call-parser", help="The model family whose syntax the lines' tool calls are read in: "
        "auto (any known one), hermes, llama3_json or mistral (docs/models.md).")] = "auto",
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Submit JSONL files of generation requests, one job per file.

    Every file is validated whole before anything is stored; all the jobs are
    stored in one transaction.
    """
    from fsched.core.ports.records import JobSubmission

    request_class = parse_class(request_class)
    if not 0 <= priority <= 9:
        raise UserError(f"--priority must be within 0..9, got {priority}")
    table = open_table(db)
    store = table.catalog
    actor = acting_user(store)
    tenant = tenant or default_tenant(actor, getpass.getuser())
    allow(may_act_as(actor, tenant))
    limits = limits_in_force(table)
    jobs = [
        JobSubmission(parsed, tenant=tenant, request_class=request_class, priority=priority,
                      name=name or _job_name(source))
        for parsed, source in parse_files(files, limits, max_tokens, known_tool_parser(tool_call_parser))
    ]
    submitted = store.submit(jobs, max_queued_per_tenant=limits.max_queued_per_tenant)
    for job in submitted:
        print_submitted(job, priority, as_json)


def parse_files(
    files: list[str], limits: InputLimits, max_tokens: int | None, tool_parser: str = "auto"
) -> list[tuple[tuple[RequestSpec, ...], str]]:
    """Every file read and parsed whole (with its name for errors), before anything is stored.

    The options' errors come first; then each file is read and parsed before the next is opened, so
    the error reported is the first one a reader of the files, in order and line by line, would meet.
    """
    if max_tokens is not None and not 1 <= max_tokens <= limits.max_tokens:
        raise UserError(f"--max-tokens must be within 1..{limits.max_tokens:,}, got {max_tokens}")
    if files.count("-") > 1:
        raise UserError("standard input ('-') can be read only once")
    parsed = []
    for file in files:
        source = "<stdin>" if file == "-" else file
        data = read_job_file(file, limits)
        parsed.append((parse_job_file(data, source, limits, default_max_tokens=max_tokens,
                                      tool_parser=tool_parser), source))
    return parsed


def _job_name(source: str) -> str:
    return "stdin" if source == "<stdin>" else Path(source).name


def print_submitted(job: SubmittedJob, priority: int, as_json: bool) -> None:
    if as_json:
        print_json({
            "job_id": job.job_id, "num_requests": job.num_requests, "tenant": job.tenant,
            "class": job.request_class.value, "priority": priority, "tenant_created": job.tenant_created,
        })
        return
    created = " (new tenant, weight 1)" if job.tenant_created else ""
    print(
        f"submitted job {job.job_id}: {job.num_requests} request(s), "
        f"tenant {job.tenant}{created}, class {job.request_class.value}, priority {priority}"
    )

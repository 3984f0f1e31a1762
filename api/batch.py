"""The Batch API: files (upload, list, get, content, delete) and batches (create, get, list, cancel).

A batch is a job of class batch of the key's tenant. Its input file is
checked by `fsched submit`'s parser when the batch is created: a bad line
makes the batch `failed` with the line named, and nothing runs. Output and
error files are rendered from the job's results when read.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from fsched.api.errors import ApiError, not_found
from fsched.api.limits import BodyTooLarge, body_text
from fsched.api.state import ServerState, state_of
from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.batches import BATCH_PURPOSE, BatchRecord, new_batch_id, stored_bytes_of, window_seconds
from fsched.core.jobs.jobfile import JobFileError, load_json_object
from fsched.core.jobs.jsontext import dumps as json_text
from fsched.core.jobs.limits import InputLimits
from fsched.core.openai.batch import batch_object, file_object, list_page, validate_metadata
from fsched.core.openai.batchfile import parse_job_pieces
from fsched.core.openai.results import lines_of, output_line
from fsched.core.ports.records import FileQuotaExceeded, JobSubmission, QueueFull
from fsched.core.types import Endpoint, JobOrigin, RequestClass

router = APIRouter()
BATCH_PRIORITY = 5
BATCH_EXPIRED = {"code": "batch_expired",
                 "message": "this request could not be executed before the completion window expired"}
MAX_LIST = 100
MAX_FILES_LIST = 10_000  # OpenAI's limit (and default) for a page of files
# Batch creations a tenant may have in progress at once: each reads and parses a whole input file (up to
# 200 MiB); two keep one tenant's creations going while bounding what they hold.
MAX_CREATIONS_PER_TENANT = 2


# -- files ------------------------------------------------------------------------------------


@router.post("/v1/files")
async def upload(request: Request) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    try:
        form = await request.form(max_files=1, max_fields=4)
    except BodyTooLarge:
        raise  # BodyLimit answers 413, however the body came (chunked or with a length)
    except Exception as exc:  # noqa: BLE001 - any unparseable multipart body is the client's
        raise ApiError(400, f"expected a multipart/form-data body with 'file' and 'purpose': {exc}") from None
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose != BATCH_PURPOSE:
        raise ApiError(400, f"purpose must be {BATCH_PURPOSE!r} (the only purpose fsched serves)", "purpose")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "missing the 'file' part", "file")
    filename = (upload.filename or "upload.jsonl")[:256]
    quota = (await state.limits()).max_file_bytes_per_tenant
    try:  # from the spooled upload a piece at a time: the server never holds the whole file
        stored = await state.call(state.backend.files.add_file, key.tenant, BATCH_PURPOSE, filename,
                                  upload.file, quota=quota, size_hint=upload.size)
    except FileQuotaExceeded as exc:
        raise ApiError(400, str(exc), "file", "file_quota_exceeded") from None
    return file_object(stored)


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                     limit: int = MAX_FILES_LIST, order: str = "desc") -> dict:
    """OpenAI's file list: newest first (`order=asc`: oldest), `limit` at a time, `after` a file id."""
    state = state_of(request)
    key = await state.authenticate(request)
    if not 1 <= limit <= MAX_FILES_LIST:
        raise ApiError(400, f"limit must be within 1..{MAX_FILES_LIST:,}", "limit")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be 'asc' or 'desc'", "order")
    found = await state.call(state.backend.files.list_files, key.tenant, purpose, limit + 1, after,
                             order == "desc")
    return list_page([file_object(f) for f in found[:limit]], has_more=len(found) > limit)


@router.get("/v1/files/{file_id}")
async def get_file(request: Request, file_id: str) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    return file_object(await _file(state, key, file_id))


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    if not await state.call(state.backend.files.delete_file, key.tenant, file_id):
        raise not_found("file", file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str):
    state = state_of(request)
    key = await state.authenticate(request)
    f = await _file(state, key, file_id)
    if f.job_id is None:
        pieces = await state.call(state.backend.files.iter_content, key.tenant, file_id)
        return StreamingResponse(pieces or iter([b""]), media_type="application/octet-stream")
    record = await state.call(state.backend.files.batch_of_job, key.tenant, f.job_id)
    if record is not None and record.reclaimed_at is not None:
        raise ApiError(410, f"file {file_id!r} held the results of batch {record.id!r}, which were "
                       f"deleted at {int(record.reclaimed_at)} (Unix time) with the batch's other rows, "
                       "batch_retention_s after it ended; the batch object still answers", "file_id",
                       "file_reclaimed")
    expired = record is not None and record.expired_at is not None
    return StreamingResponse(_results(state, f.job_id, f.errors, expired), media_type="application/jsonl")


def _results(state: ServerState, job_id: int, errors: bool, expired: bool = False):
    """Output lines, read in pages (a sync generator: Starlette runs it in a worker thread); a
    batch that expired shows its cancelled lines as OpenAI's `batch_expired`."""
    for line in lines_of(state.backend.jobs.iter_results(job_id, errors=errors)):
        out = output_line(line)
        if expired and out["error"] is not None and out["error"]["code"] == "cancelled":
            out["error"] = BATCH_EXPIRED
        yield (json_text(out) + "\n").encode()


async def _file(state: ServerState, key: ApiKey, file_id: str):
    f = await state.call(state.backend.files.get_file, key.tenant, file_id)
    if f is None:
        raise not_found("file", file_id)
    return f


# -- batches ----------------------------------------------------------------------------------


@router.post("/v1/batches")
async def create_batch(request: Request) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    body = await _json_body(request)
    endpoint, metadata = _batch_fields(body)
    f = await state.call(state.backend.files.get_file, key.tenant, body["input_file_id"])
    if f is None:
        raise not_found("file", body["input_file_id"], "input_file_id")
    if f.purpose != BATCH_PURPOSE or f.job_id is not None:
        raise ApiError(400, f"file {f.id!r} was not uploaded with purpose 'batch'", "input_file_id")
    record = BatchRecord(id=new_batch_id(), tenant=key.tenant, job_id=None, endpoint=endpoint.value,
                         input_file_id=f.id, completion_window=body["completion_window"], metadata=metadata,
                         created_at=time.time())
    limits = await state.limits()
    with _creation_slot(state, key.tenant):
        return await _create(state, key, record, f.filename, endpoint, limits)


@contextmanager
def _creation_slot(state: ServerState, tenant: str):
    """One of the tenant's MAX_CREATIONS_PER_TENANT places to create a batch (each reads and parses a
    whole file), or 429: a tenant cannot fill the server's memory and threads with creations."""
    busy = state.batch_creations
    if busy.get(tenant, 0) >= MAX_CREATIONS_PER_TENANT:
        raise ApiError(429, f"{MAX_CREATIONS_PER_TENANT} batch creations of yours are in progress, the most "
                       "at once; retry when one is done", code="too_many_batch_creations",
                       headers={"Retry-After": "5"})
    busy[tenant] = busy.get(tenant, 0) + 1
    try:
        yield
    finally:
        busy[tenant] -= 1
        if not busy[tenant]:
            del busy[tenant]


async def _create(state: ServerState, key: ApiKey, record: BatchRecord, filename: str, endpoint: Endpoint,
                  limits: InputLimits) -> dict:
    """Parse the input file (read from the table a piece at a time) and submit its job."""
    pieces = await state.call(state.backend.files.iter_content, key.tenant, record.input_file_id)
    try:
        requests = await state.call(parse_job_pieces, pieces or (), filename, limits, endpoint=endpoint,
                                    thinking=state.thinking, tenant=key.tenant, tool_parser=state.tool_parser)
    except JobFileError as exc:
        failed = _refused(record, exc)
        await state.call(state.backend.files.add_batch, failed)
        return batch_object(failed, None)
    if len(requests) > limits.max_queued_per_tenant:  # could never fit: not a retry later
        raise ApiError(400, f"the batch holds {len(requests):,} requests, larger than your queue "
                       f"limit of {limits.max_queued_per_tenant}", "input_file_id", "batch_too_large")
    quota = limits.max_file_bytes_per_tenant
    record = replace(record, stored_bytes=await state.call(stored_bytes_of, requests))
    used = await state.call(state.backend.files.stored_bytes, key.tenant)
    if used + record.stored_bytes > quota:  # refused before a row is written
        raise _over_quota(FileQuotaExceeded(key.tenant, used, record.stored_bytes, quota, "batch"))
    submission = JobSubmission(requests, tenant=key.tenant, request_class=RequestClass.BATCH,
                               priority=BATCH_PRIORITY, name=record.id, origin=JobOrigin.BATCH, key_id=key.id)
    try:
        (job,) = await state.call(state.backend.jobs.submit, [submission],
                                  max_queued_per_tenant=limits.max_queued_per_tenant)
    except QueueFull as exc:
        raise ApiError(429, str(exc), code="queue_full", headers={"Retry-After": "60"}) from None
    record = replace(record, job_id=job.job_id)
    try:  # checked again with the batch made visible, one check at a time per tenant
        await state.call(state.backend.files.add_batch, record, quota=quota)
    except FileQuotaExceeded as exc:  # another creation or upload took the room meanwhile
        await state.call(state.backend.jobs.cancel_job, job.job_id)
        await state.call(state.backend.files.discard_job_rows, job.job_id)
        raise _over_quota(exc) from None
    return await _batch_json(state, record)


def _over_quota(exc: FileQuotaExceeded) -> ApiError:
    return ApiError(400, str(exc), "input_file_id", "file_quota_exceeded")


@router.get("/v1/batches/{batch_id}")
async def get_batch(request: Request, batch_id: str) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    return await _batch_json(state, await _batch(state, key, batch_id))


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    if not 1 <= limit <= MAX_LIST:
        raise ApiError(400, f"limit must be within 1..{MAX_LIST}", "limit")
    records = await state.call(state.backend.files.list_batches, key.tenant, after, limit + 1)
    return list_page([await _batch_json(state, r) for r in records[:limit]], has_more=len(records) > limit)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> dict:
    state = state_of(request)
    key = await state.authenticate(request)
    record = await _batch(state, key, batch_id)
    if record.job_id is not None:
        await state.call(state.backend.jobs.cancel_job, record.job_id)
    return await _batch_json(state, record)


async def _batch(state: ServerState, key: ApiKey, batch_id: str) -> BatchRecord:
    record = await state.call(state.backend.files.get_batch, key.tenant, batch_id)
    if record is None:
        raise not_found("batch", batch_id)
    return record


async def _batch_json(state: ServerState, record: BatchRecord) -> dict:
    """The batch object; a batch seen finished for the first time gets its output files."""
    job = None
    if record.job_id is not None:
        (job,) = await state.call(state.backend.jobs.list_jobs, job_id=record.job_id)
        if job.state.finished and record.output_file_id is None and record.reclaimed_at is None:
            sizes = await state.call(_output_sizes, state, record)
            record = await state.call(state.backend.files.attach_outputs, record, sizes)
    return batch_object(record, job)


def _output_sizes(state: ServerState, record: BatchRecord) -> tuple[int, int]:
    expired = record.expired_at is not None
    return tuple(sum(len(chunk) for chunk in _results(state, record.job_id, errors, expired))
                 for errors in (False, True))


async def _json_body(request: Request) -> dict:
    text = await body_text(request)
    try:
        return load_json_object(text, 16)
    except JobFileError as exc:
        raise ApiError(400, f"the body must be a JSON object: {exc}", exc.field) from None


def _batch_fields(body: dict) -> tuple[Endpoint, dict | None]:
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise ApiError(400, f"{name} is required (a string)", name)
    unknown = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"}
    if unknown:
        raise ApiError(400, f"unknown field {sorted(unknown)[0]!r}", sorted(unknown)[0])
    try:
        endpoint = Endpoint(body["endpoint"])
    except ValueError:
        raise ApiError(400, "endpoint must be /v1/completions or /v1/chat/completions", "endpoint") from None
    try:
        window_seconds(body["completion_window"])
    except ValueError as exc:
        raise ApiError(400, str(exc), "completion_window") from None
    try:
        return endpoint, validate_metadata(body.get("metadata"))
    except ValueError as exc:
        raise ApiError(400, str(exc), "metadata") from None


def _refused(record: BatchRecord, exc: JobFileError) -> BatchRecord:
    error = {"code": "invalid_request", "message": exc.message, "param": exc.field, "line": exc.line}
    return replace(record, errors=[error], failed_at=time.time())

"""The job table's schema: SQLAlchemy 2.0 typed models, one class a table.

Times are Unix seconds (float): the same type on SQLite and PostgreSQL, and
cheap to compare in the scheduler. Job counters (num_done, ...) are kept in
the same transaction as the request rows they count, so `fsched status`
reads the small jobs table and never scans millions of requests.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from fsched.storage.textcodec import SafeString, SafeText

# BIGINT on PostgreSQL; on SQLite an INTEGER PRIMARY KEY must stay INTEGER to
# be the rowid alias (autoincrement).
Id = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Meta(Base):
    """Key-value facts about the database itself, such as the schema version."""

    __tablename__ = "fsched_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Tenant(Base):
    __tablename__ = "tenants"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[float] = mapped_column(Float)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    # No foreign key: a finished job stays as history after its tenant is removed.
    tenant: Mapped[str] = mapped_column(String(128))
    request_class: Mapped[str] = mapped_column("class", String(16))
    priority: Mapped[int] = mapped_column(Integer, default=5)
    name: Mapped[str] = mapped_column(SafeString(256))
    # Which door it came in by (core.types.JobOrigin), and the API key it came with.
    origin: Mapped[str] = mapped_column(String(16), default="submit")
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    num_requests: Mapped[int] = mapped_column(Integer)
    num_done: Mapped[int] = mapped_column(Integer, default=0)
    num_failed: Mapped[int] = mapped_column(Integer, default=0)
    num_cancelled: Mapped[int] = mapped_column(Integer, default=0)
    num_running: Mapped[int] = mapped_column(Integer, default=0)
    num_output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # Prompt tokens of the requests that ended with a count of them (chargeback).
    num_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cancel_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_jobs_state", "state"),
        Index("ix_jobs_tenant_state", "tenant", "state"),
        # Listings: the newest finished jobs of some origins, without walking the online ones.
        Index("ix_jobs_origin_id", "origin", "id"),
    )


class RequestRow(Base):
    __tablename__ = "requests"
    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # Position in the submitted file (0-based); results come back in this order.
    idx: Mapped[int] = mapped_column(Integer)
    custom_id: Mapped[str] = mapped_column(SafeString(512))
    # A line asking for several choices (n, or several prompts) is one row a choice, all with the
    # line's custom_id: `choice` is the row's index among them (0 for a line of one).
    choice: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How the API shows the answer (AnswerOptions.to_json): NULL for a plain request.
    answer: Mapped[dict | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(32))
    prompt: Mapped[str | None] = mapped_column(SafeText, nullable=True)
    messages: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # What a chat template is given besides the messages (ChatRender.to_json): NULL for most.
    render: Mapped[dict | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    params: Mapped[dict] = mapped_column(JSON)  # SamplingParams.to_json(), seed always set
    max_tokens: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    # Generated so far: token ids are the truth (resume recomputes from them),
    # the text is what results print. A running request's output after what is here is in request_output
    # (num_output_tokens counts all its tokens); the write that ends it puts it all here.
    output_tokens: Mapped[list] = mapped_column(JSON, default=list)
    output_text: Mapped[str] = mapped_column(SafeText, default="")
    # Logprobs of the output tokens stored so far (their records are in request_logprobs).
    num_logprobs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    num_output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(SafeText, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    enqueued_at: Mapped[float] = mapped_column(Float)
    first_token_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Room for several daemons on one queue (PostgreSQL): who holds the
    # request, under which lease epoch, until when. Every write-back checks them.
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        UniqueConstraint("job_id", "idx", name="uq_requests_job_idx"),
        UniqueConstraint("job_id", "custom_id", "choice", name="uq_requests_job_custom_id_choice"),
        Index("ix_requests_state_id", "state", "id"),
        # The daemon's claim: a job's queued requests in input order.
        Index("ix_requests_job_state_idx", "job_id", "state", "idx"),
        Index("ix_requests_lease_owner", "lease_owner"),
        # The sweep for expired leases (running requests by expiry).
        Index("ix_requests_state_lease_expires", "state", "lease_expires_at"),
        # First-token latency over a recent window (the dashboard), without a scan.
        Index("ix_requests_first_token_at", "first_token_at"),
    )


class DaemonHeartbeat(Base):
    """A running (or dead) daemon's heartbeat and engine figures."""

    __tablename__ = "daemons"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(512))
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stats: Mapped[dict] = mapped_column(JSON, default=dict)


class DaemonUsage(Base):
    """One daemon's decayed usage of one tenant, as it last published it.

    Each daemon writes only its own rows (no contention between daemons) and
    reads the others': the cluster's usage of a tenant is the sum, each row
    decayed by its age on the database's clock.
    """

    __tablename__ = "daemon_usage"
    daemon: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    kv_token_s: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float)  # database clock, Unix seconds


class ApiKeyRow(Base):
    """An HTTP API key: its tenant, its highest class, and the SHA-256 of its secret (never the key)."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    request_class: Mapped[str] = mapped_column("class", String(16))
    name: Mapped[str] = mapped_column(String(128), default="")
    secret_hash: Mapped[str] = mapped_column(String(64))
    # An admin key may also administer over HTTP: every tenant's work, weights.
    admin: Mapped[bool] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class FileRow(Base):
    """A file of the Batch API: an upload (content in file_chunks), or a batch's output or errors
    (no content: rendered from the job's results when read)."""

    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(SafeString(256))
    # Not named `bytes`: that would hide the builtin from the annotations below.
    size: Mapped[int] = mapped_column("bytes", BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    # An upload's content is its rows in file_chunks; an output file has none.
    job_id: Mapped[int | None] = mapped_column(Id, nullable=True)  # output files: whose results
    errors: Mapped[bool] = mapped_column(Integer, default=0)  # output files: the failed lines
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (Index("ix_files_tenant_created", "tenant", "created_at"),)


class FileChunk(Base):
    """A piece of an upload's content (pieces of a fixed size, in `seq` order): an upload is written
    and read a piece at a time, and its pieces are deleted with it. No foreign key: the pieces are
    written before the file row that makes them visible; `created_at` dates those a stopped upload left."""

    __tablename__ = "file_chunks"
    file_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)  # before `data`: read without the piece itself
    data: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (Index("ix_file_chunks_created_at", "created_at"),)


class RequestLogprobs(Base):
    """Logprobs of a request's output tokens, appended a piece at each write of its tokens: the
    records (TokenLogprobs.to_json, one compact array a token) of tokens `start`, `start` + 1, ...
    A write stores only what is new and a reader reads only the pieces it lacks, so a request's
    logprobs cost their size once, not once a flush or a poll."""

    __tablename__ = "request_logprobs"
    request_id: Mapped[int] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    start: Mapped[int] = mapped_column(Integer, primary_key=True)
    records: Mapped[list] = mapped_column(JSON)


class RequestOutput(Base):
    """A running request's output, appended a piece at each write of it (storage/output.py): tokens
    `start`, `start` + 1, ... after those its row and earlier pieces hold, and the text that follows the
    first `text_kept` characters of its text so far. The write that ends the request puts its whole
    output in its row and drops its pieces."""

    __tablename__ = "request_output"
    request_id: Mapped[int] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    start: Mapped[int] = mapped_column(Integer, primary_key=True)
    tokens: Mapped[list] = mapped_column(JSON)
    text_kept: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(SafeText)


class KeyLimit(Base):
    """A rate limit an admin set on one API key (name -> value), over the table-wide one."""

    __tablename__ = "key_limits"
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class KeyRate(Base):
    """A key's rate so far, one row a kind (requests, tokens): the time, on the database's clock, by
    which what it was let through would have been spent at its limit (GCRA's theoretical arrival time).
    Every server replica reads and moves the same row, so a limit holds across replicas."""

    __tablename__ = "key_rates"
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    tat: Mapped[float] = mapped_column(Float)


class BatchRow(Base):
    """A Batch API batch: the job it runs (none when its input was refused) and OpenAI's fields."""

    __tablename__ = "batches"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)  # creation order, for `after` paging
    tenant: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[int | None] = mapped_column(Id, nullable=True)
    endpoint: Mapped[str] = mapped_column(String(32))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(16))
    batch_metadata: Mapped[dict | None] = mapped_column("metadata", JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    errors: Mapped[list | None] = mapped_column(JSON, nullable=True)  # why it failed validation
    failed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # When its completion window ran out with work unfinished (that work was cancelled).
    expired_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What its rows hold as its tenant's quota counts them (BatchRecord.stored_bytes), until reclaimed.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    reclaimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_batches_tenant_seq", "tenant", "seq"),
        UniqueConstraint("job_id", name="uq_batches_job"),
    )

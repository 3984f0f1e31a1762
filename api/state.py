"""What every handler shares: the stores, the progress hub, and short caches of table facts."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio.to_thread
from fastapi import Request

from fsched.api.errors import ApiError
from fsched.api.facts import KEEP_WARM_S, Cached, due, note_failed_read, refreshed, start_read
from fsched.api.guard import Guard
from fsched.api.hub import ProgressHub
from fsched.api.keyreads import KeyReads
from fsched.api.submitter import JobCall, Submitter
from fsched.core.jobs.apikeys import ApiKey, secret_matches, split_key
from fsched.core.jobs.limits import InputLimits, limits_in_force
from fsched.core.openai.body import PromptThinking
from fsched.core.ports.catalog import CatalogStore
from fsched.core.ports.files import FileStore
from fsched.core.ports.keys import KeyStore
from fsched.core.ports.records import DaemonSummary, JobSubmission, StorageError, SubmittedJob
from fsched.core.ports.serving import ServingStore
from fsched.core.ports.table import Table

if TYPE_CHECKING:
    from fsched.api.history import History
    from fsched.api.link import LinkClient
    from fsched.api.metrics import Metrics
    from fsched.api.tokens import Tokenizers

log = logging.getLogger("fsched.serve")

# How long a server trusts what it read of the table: daemons come and go, and
# an admin's new limits apply, within these; a revoked key is refused at once.
# A daemon's row changes once a heartbeat (1 s) and one killed reads dead only
# after its lease (10 s): a list read more often sees a crash no sooner. What
# shows at once, a daemon's goodbye or its first row, shows here within the
# TTL: until then a request after the last daemon stopped is stored (it waits
# for one, `--no-daemon-s`) and one after the first started is refused (503).
DAEMONS_TTL_S = 1.0
LIMITS_TTL_S = 1.0
KNOWN_KEYS = 10_000  # keys remembered at most (api/online.py's requests skip reading them)


@dataclass(slots=True)
class Backend:
    """The stores a server uses, all over one database (built by `fsched serve`, or by a test)."""

    jobs: CatalogStore  # submit, list jobs and daemons, results, cancel, tenants
    keys: KeyStore  # API keys and stored limits
    files: FileStore  # Batch API files and batches
    serving: ServingStore  # online requests' progress, metric totals

    @classmethod
    def of(cls, table: Table) -> Backend:
        """The stores of one job table: SQL (storage/stores.py) or in memory (core/ports/memory)."""
        return cls(jobs=table.catalog, keys=table.keys, files=table.files, serving=table.serving)


@dataclass(slots=True)
class ServerState:
    backend: Backend
    hub: ProgressHub
    metrics: Metrics | None = None
    history: History | None = None  # the dashboard's samples, made on first use
    tokenizers: Tokenizers | None = None  # the served model's tokenizer, loaded on first use
    guard: Guard = field(default_factory=Guard)  # what open streams check while they wait
    link: LinkClient | None = None  # the daemons' links: pushed wake-ups and tokens
    batch_creations: dict[str, int] = field(default_factory=dict)  # in progress, by tenant
    tool_parser: str = "auto"  # the model family whose syntax tool calls are read in (`--tool-call-parser`)
    thinking: PromptThinking | None = None  # whether the model's template opens a chat's reasoning
    _submitter: Submitter | None = None  # the group commit, on a thread of its own
    _key_reads: KeyReads | None = None
    _daemons: Cached[list[DaemonSummary]] = field(default_factory=Cached)
    _limits: Cached[InputLimits] = field(default_factory=Cached)
    # each key's rate limits, the key asked for last at the end
    _rate_limits: OrderedDict[str, Cached[dict[str, int]]] = field(default_factory=OrderedDict)
    _known_keys: dict[str, ApiKey] = field(default_factory=dict)  # unrevoked when read, by id

    async def call(self, fn, *args, **kwargs):
        """A store call in a worker thread: the event loop never waits on the database."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def submit_online(self, submission: JobSubmission, max_queued_per_tenant: int,
                            stored: JobCall | None = None, abandoned: JobCall | None = None) -> SubmittedJob:
        """Store one online request's job, in a group commit with those arriving meanwhile (`stored` and
        `abandoned`: api/submitter.py's)."""
        return await self._submitter_made().submit(submission, max_queued_per_tenant, stored, abandoned)

    def start_submitter(self) -> None:
        """The group commit's thread started now, its connection and statements made ready on it: a fresh
        server's first online request does not wait for them."""
        self._submitter_made().start(self.backend.jobs.prepare_submits)

    def _submitter_made(self) -> Submitter:
        if self._submitter is None:
            # Its own thread, not `call`'s hop (anyio's capacity limiter, cancel scope and checkpoint,
            # a worker taken and put back: a tenth of serve's CPU with 4-token requests).
            self._submitter = Submitter(self.backend.jobs.submit_each,
                                        committed=None if self.link is None else self.link.nudge)
        return self._submitter

    def close(self) -> None:
        """The server stops: the group commit's thread ends once its last transaction is done."""
        if self._submitter is not None:
            self._submitter.close()

    async def read_key(self, key_id: str) -> ApiKey | None:
        """The key as stored now, read together with the lookups arriving meanwhile (api/keyreads.py)."""
        if self._key_reads is None:
            get_key = self.backend.keys.get_key
            self._key_reads = KeyReads(lambda ids: self.call(lambda: {i: get_key(i) for i in ids}))
        return await self._key_reads.get(key_id)

    async def live_daemons(self, ask: bool = True) -> list[DaemonSummary]:
        """The daemons alive as read within DAEMONS_TTL_S (`ask`: api/facts.py's `refreshed`)."""
        return await refreshed(self._daemons, DAEMONS_TTL_S, self._read_live_daemons, ask)

    async def _read_live_daemons(self) -> list[DaemonSummary]:
        daemons = await self.call(self.backend.jobs.list_daemons)
        wall = time.time()
        return [d for d in daemons if d.alive(wall)]

    async def require_daemon(self) -> None:
        if not await self.live_daemons():
            raise ApiError(503, "no fsched daemon is serving this job table; start one with `fsched daemon`",
                           code="no_daemon")

    async def limits(self, ask: bool = True) -> InputLimits:
        """The limits in force as read within LIMITS_TTL_S (`ask`: api/facts.py's `refreshed`)."""
        return await refreshed(self._limits, LIMITS_TTL_S, self._read_limits, ask)

    async def _read_limits(self) -> InputLimits:
        return limits_in_force(await self.call(self.backend.keys.stored_limits))

    async def read_limits_ahead(self) -> None:
        """The limits read when the server starts, not at its first request (whose read would also open
        the worker pool's first connection to the table); a table that cannot be read now is read then."""
        try:
            await self.limits()
        except StorageError as exc:
            log.warning("the limits could not be read at start (%s); the first request reads them", exc)

    async def rate_limits(self, key_id: str) -> dict[str, int]:
        """The rate limits on a key (api/ratelimit.py), as read within LIMITS_TTL_S."""
        found = self._rate_limits.get(key_id)
        if found is None:
            if len(self._rate_limits) >= KNOWN_KEYS:
                self._rate_limits.clear()
            found = self._rate_limits[key_id] = Cached()
        else:
            self._rate_limits.move_to_end(key_id)
        return await refreshed(found, LIMITS_TTL_S,
                               functools.partial(self.call, self.backend.keys.rate_limits, key_id))

    def refresh_ahead(self, now: float) -> None:
        """Start the reads of the facts requests keep asking for that near their TTL (api/facts.py): the
        live daemons; the limits and the rate limits of every key asked for lately, all in one read once
        any of them is due (a key's rate limits are, but for its own, stored limits: read together, they
        come due together, one read a TTL)."""
        if due(self._daemons, DAEMONS_TTL_S, now):
            start_read(self._daemons, self._read_live_daemons)
        lately = self._keys_asked_lately(now)
        if due(self._limits, LIMITS_TTL_S, now) or any(due(self._rate_limits[k], LIMITS_TTL_S, now)
                                                        for k in lately):
            self._read_limits_ahead([k for k in lately if self._rate_limits[k].reading is None])

    def _keys_asked_lately(self, now: float) -> list[str]:
        lately = []
        for key_id in reversed(self._rate_limits):  # the keys asked for lately are last
            if now - self._rate_limits[key_id].asked > KEEP_WARM_S:
                break
            lately.append(key_id)
        return lately

    def _read_limits_ahead(self, keys: list[str]) -> None:
        """One read of the stored limits and these keys' rate limits, for each of their caches."""
        read = asyncio.ensure_future(self.call(self.backend.keys.stored_and_rate_limits, keys))
        read.add_done_callback(note_failed_read)
        if self._limits.reading is None:
            start_read(self._limits, functools.partial(_limits_of, read))
        for key_id in keys:
            start_read(self._rate_limits[key_id], functools.partial(_one_of, read, key_id))

    async def authenticate(self, request: Request) -> ApiKey:
        """The key of `Authorization: Bearer <key>`; 401 for none, a malformed, unknown or revoked one."""
        key_id, secret = _bearer(request)
        stored = await self.read_key(key_id)
        if not secret_matches(secret, stored):
            raise ApiError(401, "invalid or revoked API key", code="invalid_api_key")
        if len(self._known_keys) >= KNOWN_KEYS:
            self._known_keys.clear()
        self._known_keys[key_id] = stored
        return stored

    def known_key(self, request: Request) -> ApiKey | None:
        """The request's key as this server read it unrevoked before, when the secret is its: a key
        never changes but for its revocation, which the caller must then check where it stores the
        request's row (a revoked key's row is never stored: `CatalogStore.submit_each`). None for a
        key not read here yet, a wrong secret, or a malformed header (`authenticate` answers them)."""
        try:
            key_id, secret = _bearer(request)
        except ApiError:
            return None
        known = self._known_keys.get(key_id)
        return known if known is not None and secret_matches(secret, known) else None

    def forget_key(self, key_id: str) -> None:
        self._known_keys.pop(key_id, None)


async def _one_of(read: asyncio.Future, key_id: str) -> dict[str, int]:
    return (await asyncio.shield(read)).rate_limits[key_id]


async def _limits_of(read: asyncio.Future) -> InputLimits:
    return limits_in_force((await asyncio.shield(read)).stored)


def _bearer(request: Request) -> tuple[str, str]:
    """The key id and secret of `Authorization: Bearer <key>`; 401 for none or a malformed one."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    parts = split_key(key.strip()) if scheme.lower() == "bearer" else None
    if parts is None:
        raise ApiError(401, "missing or malformed API key (Authorization: Bearer fsk-...)",
                       code="invalid_api_key")
    return parts


def state_of(request: Request) -> ServerState:
    return request.app.state.fsched

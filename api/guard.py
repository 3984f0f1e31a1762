"""What an open online request checks while it waits: keep-alives, a daemon to serve it, its key, the server.

A stream's handler follows its job through the hub (`follow`); between
updates it hears a tick every `tick_s` when it has something to check (one
timer for every stream, and a stream whose tokens flow and whose key another
stream checks sleeps through it), and this module turns the updates and
ticks into what the client gets: the progress, a keep-alive comment after
`keepalive_s` of silence, or an end (`StreamEnd`, sent as an OpenAI-shaped
error event) when
- the server is stopping (SIGTERM): its open requests are cancelled;
- no daemon has been live for `no_daemon_s`: nobody holds or can take it;
- the key was revoked: the key's open requests end within `key_check_s`.
The rule "a daemon came back in time" needs nothing here: it claims the
request and the updates simply resume.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from fsched.api.hub import Choices, ProgressHub
from fsched.core.jobs.apikeys import ApiKey

KEEPALIVE_S = 2.0  # an SSE comment after this long without an event
NO_DAEMON_S = 10.0  # no live daemon this long: the stream ends with an error event
KEY_CHECK_S = 1.0  # how often an open stream's key is read again
STALL_S = 30.0  # a client that takes no bytes this long is cut off and its request cancelled


@dataclass(slots=True, frozen=True)
class KeepAlive:
    """Nothing new for a while: send a comment so proxies and clients see the stream alive."""


@dataclass(slots=True, frozen=True)
class StreamEnd:
    """The stream ends here with an error event; the request is cancelled."""

    status: int
    message: str
    code: str


@dataclass(slots=True)
class StreamRules:
    keepalive_s: float = KEEPALIVE_S
    no_daemon_s: float = NO_DAEMON_S
    key_check_s: float = KEY_CHECK_S
    stall_s: float = STALL_S

    def __post_init__(self) -> None:
        for name in ("keepalive_s", "no_daemon_s", "key_check_s", "stall_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


@dataclass(slots=True)
class _Checked:
    valid: bool
    at: float


@dataclass(slots=True)
class Guard:
    """One per server: the rules and the shared, short-lived answers of the checks.

    A stream's tick wakes it only when it has something to do (`due`): a
    keep-alive, a check of its key that no other stream of the key was woken
    for within `key_check_s`, or a count of the time without a daemon. The one
    stream woken for a key reads it for all of them; a key found revoked, or no
    daemon found live, wakes the others at once (the hub's `tick_now`)."""

    rules: StreamRules = field(default_factory=StreamRules)
    _keys: dict[str, _Checked] = field(default_factory=dict)
    _checking: dict[str, float] = field(default_factory=dict)  # key id -> when a stream was woken to read it
    no_daemon: bool = False  # the last look found no live daemon: every stream counts the time

    async def key_valid(self, key: ApiKey, read: Callable[[str], Awaitable[ApiKey | None]]) -> bool:
        """Whether the key is still unrevoked; one read a key per `key_check_s`, whatever the streams."""
        now = time.monotonic()
        checked = self._keys.get(key.id)
        if checked is None or now - checked.at >= self.rules.key_check_s:
            try:
                stored = await read(key.id)
            finally:
                self._checking.pop(key.id, None)
            checked = self._keys[key.id] = _Checked(stored is not None and not stored.revoked, now)
        return checked.valid

    def unsure(self, key_id: str, now: float) -> bool:
        """Whether a stream of the key must ask `key_valid` now, whenever it last did: the key's last read
        is older than `key_check_s` (or there is none), or found it revoked."""
        checked = self._keys.get(key_id)
        return checked is None or not checked.valid or now - checked.at >= self.rules.key_check_s

    def check_due(self, key_id: str, now: float) -> bool:
        """Whether a stream of this key has a check to make at this tick: its key read again (one stream
        a key, the first asked: it is then the one woken), found revoked, or no daemon live."""
        checked = self._keys.get(key_id)
        if checked is not None and not checked.valid or self.no_daemon:
            return True
        if checked is not None and now - checked.at < self.rules.key_check_s:
            return False
        claimed = self._checking.get(key_id)
        if claimed is not None and now - claimed < self.rules.key_check_s:  # another stream reads it
            return False
        self._checking[key_id] = now  # void after key_check_s: a stream woken and gone reads nothing
        return True


Update = Choices | KeepAlive | StreamEnd


async def guarded(hub: ProgressHub, guard: Guard, job_id: int, key: ApiKey,
                  read_key: Callable[[str], Awaitable[ApiKey | None]],
                  live_daemons: Callable[[], Awaitable[int]]) -> AsyncIterator[Update]:
    """The job's progress, keep-alives, and a `StreamEnd` when a rule above ends it (the last yielded)."""
    rules = guard.rules
    tick_s = min(rules.keepalive_s, rules.key_check_s, 1.0)
    last_event = last_check = time.monotonic()
    orphan_since: float | None = None

    def due(now: float) -> bool:
        """Whether a tick wakes this stream: a keep-alive due, or a check to make (`Guard.check_due`)."""
        if now - max(last_event, hub.delivered_at(job_id)) >= rules.keepalive_s or orphan_since is not None:
            return True
        return guard.check_due(key.id, now)

    async for choices in hub.follow(job_id, tick_s, due):
        now = time.monotonic()
        if hub.closing:
            yield StreamEnd(503, "the server is shutting down; the request was cancelled (send it again)",
                            "server_shutdown")
            return
        if now - last_check >= rules.key_check_s or guard.unsure(key.id, now):
            last_check = now
            if not await guard.key_valid(key, read_key):
                hub.tick_now()  # the key's other streams end now too
                yield StreamEnd(401, "the API key was revoked; the request was cancelled", "invalid_api_key")
                return
            live = await live_daemons()
            if not live and not guard.no_daemon:
                guard.no_daemon = True
                hub.tick_now()  # every stream counts the time without one from now
            guard.no_daemon = not live
            orphan_since = None if live else (orphan_since or now)
            if orphan_since is not None and now - orphan_since >= rules.no_daemon_s:
                yield StreamEnd(503, f"no fsched daemon has been live for {rules.no_daemon_s:g} s to serve "
                                     "this request; it was cancelled", "no_daemon")
                return
        if choices is not None:
            last_event = now
            yield choices
        elif now - max(last_event, hub.delivered_at(job_id)) >= rules.keepalive_s:  # a sink's write counts
            last_event = now
            yield KeepAlive()

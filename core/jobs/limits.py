"""Limits on what `fsched submit` and the HTTP API accept, in one validated config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from fsched.core.jobs.ratelimit import RATE_NAMES

MIB = 1024 * 1024
GB = 1000 * 1000 * 1000
DAY_S = 24 * 3600
DEFAULT_MAX_QUEUED_PER_TENANT = 1_000_000


@dataclass(slots=True, frozen=True)
class InputLimits:
    """What one submitted file may hold.

    The defaults follow the OpenAI batch API (50,000 requests, 200 MB a
    file); 1 MiB a line keeps one prompt within what a model's context can
    take many times over, and 64 levels of nesting is far beyond any real
    request while keeping the checker cheap.
    """

    max_lines: int = 50_000
    max_bytes: int = 200 * MIB
    max_line_bytes: int = 1 * MIB
    max_depth: int = 64
    # Far above any context window in use; the real check against the
    # model's context happens when the daemon admits the request.
    max_tokens: int = 1_000_000
    # A request that names no max_tokens may generate up to the room its model's context
    # leaves (as OpenAI and vLLM answer; the daemon caps a default at that room). An operator
    # may set a lower default; frameworks that treat a cut answer as an error then see cuts.
    default_max_tokens: int = 1_000_000
    max_custom_id_chars: int = 512
    max_stop_sequences: int = 4
    # Unfinished (queued, preempted or running) requests one tenant may
    # have: a submit that would go over it is refused whole. Generous: it
    # guards the job table against a runaway script, not a fair share.
    max_queued_per_tenant: int = DEFAULT_MAX_QUEUED_PER_TENANT
    # Bytes one tenant may keep stored: its uploaded files, and what its batches hold until reclaimed
    # (their request rows, then their output files once they end: core.jobs.batches.stored_bytes_of).
    # OpenAI's default for an organisation's files is 100 GB.
    max_file_bytes_per_tenant: int = 100 * GB
    # Seconds an ended batch (completed, failed, expired or cancelled) keeps its rows: then `fsched
    # serve`'s sweep deletes its requests, outputs and logprobs (the batch still answers with its status
    # and counts; its output files' content is gone). 30 days: a month to fetch a batch's results.
    batch_retention_s: int = 30 * DAY_S
    # What the tokens-a-minute rate limits charge for logprobs: one token more for every this many
    # logprob records a request may make (each output token's, and each of its alternatives'). 20:
    # top_logprobs 20 about doubles a request's charge, as it about doubles what it costs to serve.
    logprobs_per_charged_token: int = 20

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"limit {f.name} must be >= 1, got {getattr(self, f.name)}")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError("default_max_tokens must not exceed max_tokens")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> InputLimits:
        """Read overrides such as FSCHED_MAX_LINES=100000 from the environment."""
        overrides: dict[str, int] = {}
        for f in fields(cls):
            raw = environ.get(f"FSCHED_{f.name.upper()}")
            if raw is None:
                continue
            try:
                overrides[f.name] = int(raw)
            except ValueError:
                raise ValueError(f"FSCHED_{f.name.upper()} must be an integer, got {raw!r}") from None
        return cls(**overrides)


LIMIT_NAMES = tuple(f.name for f in fields(InputLimits))
# The input limits, then the rate limits (unlimited unless set; also settable on one key).
ALL_LIMIT_NAMES = LIMIT_NAMES + RATE_NAMES


def limits_in_force(stored: Mapping[str, int], environ: Mapping[str, str] | None = None) -> InputLimits:
    """The limits in force: an admin's stored ones (the defaults where none is stored).

    A command's environment (`environ`: FSCHED_MAX_LINES=..., as before) may
    lower a limit for that command, never raise it: a user's environment must
    not lift what the admin set. The HTTP server and `fsched limits show` pass
    none: a server's clients do not share its environment.
    """
    defaults = InputLimits()
    values = {name: int(stored.get(name, getattr(defaults, name))) for name in LIMIT_NAMES}
    if environ:
        asked = InputLimits.from_env(environ)
        for name in LIMIT_NAMES:
            if f"FSCHED_{name.upper()}" in environ:
                values[name] = min(values[name], getattr(asked, name))
    values["default_max_tokens"] = min(values["default_max_tokens"], values["max_tokens"])
    return InputLimits(**values)


def validate_limit(name: str, value: int | None, per_key: bool = False) -> int | None:
    """A limit an admin may store (None: unset it): a known name, and a value of at least 1. On one
    key (`per_key`), only the rate limits."""
    validate_limit_name(name, per_key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"limit {name} must be an integer >= 1, got {value!r}")
    return value


def validate_limit_name(name: str, per_key: bool = False) -> str:
    if per_key and name not in RATE_NAMES:
        raise ValueError(f"only the rate limits ({', '.join(RATE_NAMES)}) can be set on one key, "
                         f"not {name!r}")
    if name not in ALL_LIMIT_NAMES:
        raise ValueError(f"unknown limit {name!r}; the limits are {', '.join(ALL_LIMIT_NAMES)}")
    return name


def limit_rows(stored: Mapping[str, int], per_key: Mapping[str, int] | None = None) -> list[dict]:
    """What `fsched limits show` lists: each limit's name, value (None: unlimited), whether an admin set
    it, and where its value comes from (default, table, key). With `per_key` (one key's own), only the
    rate limits, as they apply to that key."""
    rows = []
    if per_key is None:
        for name, value in asdict(limits_in_force(stored)).items():
            rows.append({"name": name, "value": value, "set": name in stored,
                         "from": "table" if name in stored else "default"})
    for name in RATE_NAMES:
        if per_key is not None and name in per_key:
            rows.append({"name": name, "value": per_key[name], "set": True, "from": "key"})
        else:
            value = stored.get(name)
            rows.append({"name": name, "value": value, "set": value is not None,
                         "from": "default" if value is None else "table"})
    return rows

"""What the PostgreSQL benches that time two ways of one write in one run share: a fresh database for the
run, and each way's p50 and p90 printed with their ratios (bench/claim_latency.py, bench/move_jobs.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def fresh_database(url: str, prefix: str) -> Iterator[str]:
    """The URL of a new database beside `url`'s, dropped at the end."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def print_two_ways(times: dict[str, list[float]], base: str, new: str, what: str) -> None:
    """Each way's p50 and p90 (ms), then `new` over `base`."""
    figures = {}
    for way, taken in times.items():
        taken = sorted(taken)
        figures[way] = (taken[len(taken) // 2], taken[int(len(taken) * 0.9)])
        print(f"{way:>20}: p50 {figures[way][0]:.2f} ms  p90 {figures[way][1]:.2f} ms  ({len(taken)} runs)")
    (p50, p90), (base50, base90) = figures[new], figures[base]
    print(f"{what}: {new} / {base} p50 {p50 / base50:.2f}x, p90 {p90 / base90:.2f}x")

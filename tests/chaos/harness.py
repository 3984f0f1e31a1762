"""What the chaos tests share: a job table and the `fsched` command on it, workloads, invariants.

Every check reads the SQLite file directly, in one read transaction (a
consistent snapshot even while a daemon writes), so it sees exactly what a
restarted daemon or a user's `fsched status` would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fsched.core.runners.standin import standin_text
from tests.support.cli import TABLE_COMMANDS, invoke

FSCHED = str(Path(sys.executable).parent / "fsched")
SIGKILLED = -signal.SIGKILL
WORDS = ("the fair queue serves every tenant its share of tokens while realtime chat waits less "
         "and batch work fills the rest of each step").split()


@dataclass
class Table:
    """An fsched job table (an SQLite file) and the `fsched` command pointed at it."""

    path: Path
    env: dict
    # Run the commands that only read or write the table (submit, status, cancel, ...) in this process
    # when no crash point is armed: each `fsched` process costs about a second of CPU in imports. The
    # daemon, and every command armed to crash, run in processes of their own.
    in_process: bool = False

    @classmethod
    def at(cls, path: Path, in_process: bool = False) -> Table:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
        env.update(FSCHED_DB=f"sqlite:///{path}", USER="tester", LOGNAME="tester", COLUMNS="160")
        return cls(Path(path), env, in_process)

    @property
    def url(self) -> str:
        return self.env["FSCHED_DB"]

    def _env(self, crash_at: str | None, extra: dict | None) -> dict:
        env = {**self.env, **(extra or {})}
        if crash_at:
            env["FSCHED_CRASH_AT"] = crash_at
        return env

    def run(self, *args: str, crash_at: str | None = None, env: dict | None = None,
            timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
        if self.in_process and crash_at is None and args and args[0] in TABLE_COMMANDS:
            return invoke(args, self._env(None, env), input=input)
        return subprocess.run([FSCHED, *args], capture_output=True, env=self._env(crash_at, env),
                              timeout=timeout, input=input)

    def ok(self, *args: str, **kw) -> str:
        proc = self.run(*args, **kw)
        assert proc.returncode == 0, f"fsched {' '.join(args)}: rc {proc.returncode}: {proc.stderr.decode()}"
        return proc.stdout.decode()

    def start(self, *args: str, crash_at: str | None = None, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen([FSCHED, *args], env=self._env(crash_at, env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def copy(self, path: Path) -> Table:
        """A copy of this table (SQLite's backup: consistent, WAL included)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        src, dst = sqlite3.connect(self.path), sqlite3.connect(path)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return Table.at(path, self.in_process)


# -- workloads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFile:
    path: Path
    tenant: str
    request_class: str
    lines: int

    @property
    def name(self) -> str:
        return self.path.name


def write_job_file(path: Path, n: int, seed: int, max_tokens: tuple[int, int] = (8, 64),
                   chat_every: int = 4, temperatures: tuple[float, ...] = (0, 0.7, 1.0)) -> Path:
    """n requests, every one with an explicit seed (a stored request without one gets a
    random seed, and then no two runs could be compared); some in chat form."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for i in range(n):
            text = " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))
            line: dict = {"custom_id": f"{path.stem}-{i}", "max_tokens": rng.randint(*max_tokens),
                          "seed": rng.randrange(1 << 40), "temperature": rng.choice(temperatures)}
            if chat_every and i % chat_every == 1:
                line["messages"] = [{"role": "user", "content": text}]
            else:
                line["prompt"] = text
            out.write(json.dumps(line) + "\n")
    return path


def write_workload(folder: Path, seed: int = 0, scale: float = 1.0) -> list[JobFile]:
    """Three tenants' work in three classes: batch (flushed every second), streaming and
    realtime (flushed every step), so every crash point is reached often."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = [("batch", "alice", "batch", 160), ("stream", "bob", "streaming", 60),
            ("chat", "bob", "realtime", 30)]
    return [
        JobFile(write_job_file(folder / f"{stem}.jsonl", max(1, int(n * scale)), seed * 100 + k), tenant,
                request_class, max(1, int(n * scale)))
        for k, (stem, tenant, request_class, n) in enumerate(spec)
    ]


def submit(table: Table, files: list[JobFile], **kw) -> list[int]:
    """Submit each file as the real command does; the acknowledged job ids."""
    ids = []
    for f in files:
        out = table.ok("submit", str(f.path), "--tenant", f.tenant, "--class", f.request_class, "--json",
                       **kw)
        ids += [json.loads(line)["job_id"] for line in out.splitlines()]
    return ids


# -- reading the table -----------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=30)


def outputs(path: Path) -> dict[tuple[str, str], list[tuple[str, list[int], str]]]:
    """(job name, custom_id) -> [(state, tokens, text)], one entry per job of that name."""
    conn = _connect(path)
    try:
        rows = conn.execute(
            "SELECT j.name, r.custom_id, r.state, r.output_tokens, r.output_text, r.id "
            "FROM requests r JOIN jobs j ON j.id = r.job_id ORDER BY r.job_id, r.idx").fetchall()
        pieces = _pieces(conn)
    finally:
        conn.close()
    found: dict[tuple[str, str], list] = {}
    for name, cid, state, tokens, text, key in rows:
        found.setdefault((name, cid), []).append((state, *_whole(key, json.loads(tokens), text, pieces)))
    return found


def _pieces(conn: sqlite3.Connection) -> dict[int, list]:
    """Each running (or requeued) request's output pieces, in order: (tokens, text kept, text)."""
    pieces: dict[int, list] = {}
    for key, tokens, kept, text in conn.execute(
            "SELECT request_id, tokens, text_kept, text FROM request_output ORDER BY request_id, start"):
        pieces.setdefault(key, []).append((json.loads(tokens), kept, text))
    return pieces


def _whole(key: int, tokens: list[int], text: str, pieces: dict[int, list]) -> tuple[list[int], str]:
    """A request's output: its row's tokens and text with its pieces applied."""
    for more, kept, piece in pieces.get(key, []):
        tokens, text = tokens + more, text[:kept] + piece
    return tokens, text


def final_tokens(path: Path) -> dict[tuple[str, str], list[int]]:
    """The reference: every request done, once; (job name, custom_id) -> tokens."""
    found = {}
    for key, entries in outputs(path).items():
        assert len(entries) == 1, f"{key}: {len(entries)} rows in the reference"
        state, tokens, _ = entries[0]
        assert state == "done", f"{key}: {state} in the reference"
        found[key] = tokens
    return found


def integrity(path: Path) -> str:
    conn = _connect(path)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchall()
        foreign = conn.execute("PRAGMA foreign_key_check").fetchall()
    finally:
        conn.close()
    text = "; ".join(r[0] for r in result)
    return text if not foreign else f"{text}; foreign key violations: {foreign[:5]}"


@dataclass
class Snapshot:
    """What one check saw: enough to compare with the next one."""

    jobs: int = 0
    requests: int = 0
    states: Counter = field(default_factory=Counter)
    ended: dict[int, tuple] = field(default_factory=dict)  # request id -> (state, finished_at, tokens)

    def summary(self) -> str:
        return f"{self.jobs} jobs, {self.requests} requests: " + ", ".join(
            f"{n} {s}" for s, n in sorted(self.states.items()))


def check_table(path: Path, expected: dict[tuple[str, str], list[int]] | None = None,
                previous: Snapshot | None = None, standin: bool = True, live: bool = False) -> Snapshot:
    """Assert every invariant a crash must not break; returns what was seen.

    - the file passes `PRAGMA integrity_check` and has no dangling foreign key;
    - every job is whole (its requests are rows 0..n-1, no more, no fewer) and its
      counters equal the counts of its request rows by state, tokens included;
    - nothing of a cancelled job waits (a daemon stops its running requests; a
      waiting one would never be taken, and the job would read `cancelling` forever);
    - a request's stored tokens and text agree; a running request has a holder and
      no other has; a done request has an output and a finish reason;
    - with `expected`: every stored output is a prefix of the reference output, and a
      done request's output is the reference output exactly;
    - with `previous`: a request that had ended is unchanged (nothing ends twice);
    - `results` lists each finished request exactly once (done; failed and cancelled);
      with `live` (a daemon still finishing requests) only that none is listed twice.
    """
    assert (check := integrity(path)) == "ok", f"integrity_check: {check}"
    conn = _connect(path)
    try:
        conn.execute("BEGIN")  # one snapshot for every read below
        jobs = conn.execute(
            "SELECT id, name, num_requests, num_done, num_failed, num_cancelled, num_running, "
            "num_output_tokens, state, cancel_requested_at FROM jobs ORDER BY id").fetchall()
        rows = conn.execute(
            "SELECT id, job_id, idx, custom_id, state, output_tokens, output_text, num_output_tokens, "
            "finish_reason, finished_at, lease_owner FROM requests ORDER BY job_id, idx").fetchall()
        pieces = _pieces(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    snap = Snapshot(jobs=len(jobs), requests=len(rows))
    by_job: dict[int, list] = {}
    for row in rows:
        by_job.setdefault(row[1], []).append(row)
    assert set(by_job) <= {j[0] for j in jobs}, "requests without a job"
    for job_id, name, n, done, failed, cancelled, running, job_tokens, job_state, cancel_at in jobs:
        mine = by_job.get(job_id, [])
        assert [r[2] for r in mine] == list(range(n)), (
            f"job {job_id} ({name}) is partial: {len(mine)} request rows of {n}")
        states = Counter(r[4] for r in mine)
        counted = {"done": done, "failed": failed, "cancelled": cancelled, "running": running}
        assert {s: states.get(s, 0) for s in counted} == counted, (
            f"job {job_id} ({name}): counters {counted} but rows {dict(states)}")
        assert job_tokens == sum(r[7] for r in mine), f"job {job_id}: token counter {job_tokens}"
        if done + failed + cancelled == n:
            assert job_state in ("completed", "failed", "cancelled"), f"job {job_id} ended but {job_state}"
        if cancel_at is not None:
            # Nothing of a cancelled job may wait: no daemon would ever take it.
            waiting = states.get("queued", 0) + states.get("preempted", 0)
            assert not waiting, f"job {job_id} ({job_state}) was cancelled but {waiting} request(s) wait"
        snap.states.update(states)
        for rid, _, _, cid, state, tokens_json, text, num_tokens, reason, finished_at, owner in mine:
            tokens, text = _whole(rid, json.loads(tokens_json), text, pieces)
            where = f"request {rid} ({name}/{cid}, {state})"
            assert len(tokens) == num_tokens, f"{where}: {num_tokens} counted, {len(tokens)} stored"
            if standin:
                assert text == standin_text(tokens), f"{where}: text does not match its tokens"
            assert (owner is not None) == (state == "running"), f"{where}: holder {owner!r}"
            if state == "done":
                assert tokens and reason and finished_at, f"{where}: done without output or finish"
            if expected is not None:
                want = expected[(name, cid)]
                if state == "done":
                    assert tokens == want, f"{where}: output differs from the reference"
                else:
                    assert tokens == want[: len(tokens)], f"{where}: tokens not a prefix of the reference"
            if state in ("done", "failed", "cancelled"):
                snap.ended[rid] = (state, finished_at, tokens)
    if previous is not None:
        for rid, before in previous.ended.items():
            now = snap.ended.get(rid)
            assert now == before, f"request {rid} ended again: {before} -> {now}"
    _check_results(path, jobs, by_job, live)
    return snap


def _check_results(path: Path, jobs, by_job, live: bool) -> None:
    """What `fsched results` lists: each finished request once, in input order."""
    from fsched.storage.jobstore import SqlJobStore

    store = SqlJobStore(f"sqlite:///{path}")
    try:
        for job in jobs:
            job_id = job[0]
            rows = by_job.get(job_id, [])
            for errors, states in ((False, {"done"}), (True, {"failed", "cancelled"})):
                listed = [r.id for r in store.iter_results(job_id, errors=errors)]
                assert len(listed) == len(set(listed)), f"job {job_id}: a request listed twice"
                if live:
                    continue
                rows_in = [str(r[0]) for r in rows if r[4] in states]  # the rows' keys, as request ids
                assert listed == rows_in, f"job {job_id}: results differ from the rows"
    finally:
        store.db.dispose()


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def stored_tokens(path: Path) -> int:
    conn = _connect(path)
    try:
        return conn.execute("SELECT COALESCE(SUM(num_output_tokens), 0) FROM requests").fetchone()[0]
    finally:
        conn.close()


def unfinished(path: Path) -> int:
    conn = _connect(path)
    try:
        return conn.execute(
            "SELECT COUNT(*) FROM requests WHERE state IN ('queued', 'running', 'preempted')").fetchone()[0]
    finally:
        conn.close()


def one_line_error(stderr: bytes) -> str:
    """The error a user saw: exactly one line, `fsched: error: ...`, no traceback."""
    text = stderr.decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    assert "Traceback" not in text, f"a traceback reached the user:\n{text}"
    errors = [line for line in lines if line.startswith("fsched: error: ")]
    assert len(errors) == 1, f"expected one 'fsched: error:' line, got:\n{text}"
    return errors[0]

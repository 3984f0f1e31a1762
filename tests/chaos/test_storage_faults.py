"""The disk fills, or the database's file system turns read-only, under real `fsched` commands.

Each command that cannot write says so in one line (`fsched: error: ...`, the
cause named, no traceback) and exits 1; a running daemon waits and retries
(`storage_patience_s`); nothing is corrupted (integrity_check, whole jobs,
counters equal to rows); and once space (or write access) is back the work
finishes with the same outputs as an undisturbed run.

We run as root, for whom `chmod` blocks nothing, so the faults are real: a
small tmpfs mounted for the test, filled with a file, or remounted read-only.
Where mounting is not permitted those tests skip, saying why; the file-size
limit test (RLIMIT_FSIZE: writes past it fail with EFBIG) needs no privilege.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .harness import (
    FSCHED,
    Table,
    check_table,
    final_tokens,
    one_line_error,
    outputs,
    wait_for,
    write_job_file,
)

STANDIN = ("daemon", "--model", "standin", "--until-idle", "--quiet")


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def volume(tmp_path):
    """A 16 MiB tmpfs of this test's own, unmounted afterwards."""
    path = tmp_path / "vol"
    path.mkdir()
    try:
        proc = _mount("-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(path))
    except FileNotFoundError:
        pytest.skip("no `mount` command: the disk-full and read-only tests need a small file system")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): the disk-full and read-only "
                    "tests need root with CAP_SYS_ADMIN; test_file_size_limit covers a failing write")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(volume: Path) -> Path:
    """Write a file until the file system is full; returns it (delete it to free the space)."""
    filler = volume / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 512, 1):  # big blocks, then the last partial ones
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def with_job(db: Path, job: Path) -> Table:
    """A table at `db` holding `job`, submitted in this process (a second of imports saved): the commands
    under test, and the ones that show the table works again, run as processes."""
    Table.at(db, in_process=True).ok("submit", str(job))
    return Table.at(db)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 300-line job file and its outputs from an undisturbed run."""
    base = tmp_path_factory.mktemp("storage-faults")
    path = write_job_file(base / "job.jsonl", 300, seed=21, max_tokens=(4, 24))
    reference = with_job(base / "ref" / "fsched.db", path)
    reference.ok(*STANDIN)
    return path, final_tokens(reference.path)


def _assert_finished_like_the_reference(table: Table, expected) -> None:
    snap = check_table(table.path, expected)
    assert snap.states == {"done": snap.requests}
    assert {key: [tokens for _, tokens, _ in entries] for key, entries in outputs(table.path).items()} == {
        key: [tokens] for key, tokens in expected.items()}


def test_disk_full_fails_commands_cleanly_and_they_work_once_space_is_back(volume, job):
    path, expected = job
    table = with_job(volume / "db" / "fsched.db", path)
    before = check_table(table.path, expected)
    filler = fill(volume)

    for args in (("submit", str(path)), ("tenants", "add", "newcomer"), ("cancel", "1")):
        proc = table.run(*args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        line = one_line_error(proc.stderr)
        assert "full" in line and str(volume) in line, line  # names the cause and where
    daemon = table.run(*STANDIN)
    assert daemon.returncode == 1, daemon.stderr.decode()
    assert "full" in one_line_error(daemon.stderr)

    filler.unlink()  # (with the disk full, even opening the file can fail: check it now)
    after = check_table(table.path, expected, previous=before)  # nothing half-written
    assert (after.jobs, after.requests, after.states) == (before.jobs, before.requests, before.states)
    table.ok("tenants", "add", "newcomer")
    table.ok(*STANDIN)
    _assert_finished_like_the_reference(table, expected)


def test_a_running_daemon_waits_out_a_full_disk_and_finishes(volume, job):
    path, expected = job
    table = with_job(volume / "db" / "fsched.db", path)
    # About 5 s of work at 8 a step (300 answers of 4-24 tokens, 10 ms a step): the disk is full
    # long before the daemon could be done, however slowly this test's polls come round.
    daemon = table.start("daemon", "--model", "standin:10ms", "--max-batch", "8")
    try:
        assert wait_for(lambda: _done(table, expected) >= 10, timeout=30)
        filler = fill(volume)
        time.sleep(1.5)  # the daemon's writes fail meanwhile
        assert daemon.poll() is None, daemon.communicate()[1].decode()
        stuck = check_table(table.path, expected, live=True)  # readable and consistent while full
        assert stuck.states.get("done", 0) < stuck.requests
        filler.unlink()
        assert wait_for(lambda: _done(table, expected) == 300, timeout=60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, err.decode()
    text = err.decode()
    assert "Traceback" not in text
    assert "job table unavailable" in text and "full" in text  # what the operator saw meanwhile
    _assert_finished_like_the_reference(table, expected)


def test_read_only_file_system_fails_commands_cleanly(volume, job):
    path, expected = job
    table = with_job(volume / "db" / "fsched.db", path)
    before = check_table(table.path, expected)
    proc = _mount("-o", "remount,ro", str(volume))
    assert proc.returncode == 0, proc.stderr
    try:
        for args in (("submit", str(path)), ("tenants", "set-weight", "tester", "2"), STANDIN):
            proc = table.run(*args)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            line = one_line_error(proc.stderr)
            assert "read-only" in line or "readonly" in line, line
        status = table.run("status", "--json")
        if status.returncode:  # reading may need to write SQLite's shared-memory file
            assert "read-only" in one_line_error(status.stderr)
        else:
            assert json.loads(status.stdout)["jobs"][0]["num_requests"] == 300
    finally:
        proc = _mount("-o", "remount,rw", str(volume))
        assert proc.returncode == 0, proc.stderr
    after = check_table(table.path, expected, previous=before)
    assert (after.jobs, after.requests) == (before.jobs, before.requests)
    table.ok(*STANDIN)
    _assert_finished_like_the_reference(table, expected)


def test_file_size_limit_fails_a_submit_cleanly(tmp_path, job):
    """A write past RLIMIT_FSIZE fails with EFBIG (SQLite: a disk I/O error): no mount needed."""
    path, expected = job
    table = with_job(tmp_path / "db" / "fsched.db", path)
    before = check_table(table.path, expected)
    big = write_job_file(tmp_path / "big.jsonl", 5_000, seed=22)
    limit = max(p.stat().st_size for p in table.path.parent.iterdir()) + (64 << 10)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([FSCHED, "submit", str(big)], env=table.env, capture_output=True,
                          preexec_fn=small_files, timeout=120)
    assert proc.returncode == 1, proc.stderr.decode()
    line = one_line_error(proc.stderr)
    assert "disk I/O error" in line or "too large" in line, line
    after = check_table(table.path, expected, previous=before)
    assert (after.jobs, after.requests) == (before.jobs, before.requests)
    table.ok("submit", str(big))
    assert check_table(table.path).requests == 5_300


def _done(table: Table, expected) -> int:
    return check_table(table.path, expected, live=True).states.get("done", 0)


def test_unusable_paths_are_one_line_errors(tmp_path):
    """The database's folder cannot be created, the daemon's lock file cannot be opened:
    `fsched` says so in one line (these were raw OSError tracebacks)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    nowhere = Table.at(blocker / "db" / "fsched.db")
    proc = nowhere.run("submit", str(write_job_file(tmp_path / "j.jsonl", 2, seed=1)))
    assert proc.returncode == 1
    assert "cannot create the database" in one_line_error(proc.stderr)

    table = Table.at(tmp_path / "db" / "fsched.db")
    table.ok("tenants", "add", "someone")
    (tmp_path / "db" / "fsched.db.daemon.lock").mkdir()  # where the daemon's lock file goes
    proc = table.run(*STANDIN)
    assert proc.returncode == 1
    assert "cannot open the daemon lock" in one_line_error(proc.stderr)

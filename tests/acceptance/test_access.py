"""Tenants on one machine are OS users: the real `fsched` commands, run as real other OS users.

A session fixture creates throwaway OS users (useradd) in a group that
shares one SQLite job table, the way "Access and trust" in docs/deployment.md sets a
shared queue up. Each user's commands run in a process whose real and
effective uid are that user's: the process starts as root, imports what the
commands need (the interpreter here lives under /root, which other users
cannot read), drops to the user with setgroups/setgid/setuid, then runs the
commands through `fsched`'s own entry point. Needs root and useradd; skipped
otherwise.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import FSCHED, SAMPLE_JOBS

# Runs `fsched` commands as another user: argv = uid, gid, commands (JSON), scratch folder.
RUN_AS = r"""
import contextlib, io, json, os, sys
uid, gid, commands, scratch = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
from fsched.cli.main import app

def invoke(args):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            app(args, prog_name="fsched")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return {"args": args, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

# Warm up as root on a scratch table: every module the commands import gets loaded now.
real_db = os.environ["FSCHED_DB"]
os.environ["FSCHED_DB"] = f"sqlite:///{scratch}/warm.db"
for command in commands:
    invoke(command["args"])
os.environ["FSCHED_DB"] = real_db
os.setgroups([gid])
os.setgid(gid)
os.setuid(uid)
assert os.getuid() == os.geteuid() == uid
results = []
for command in commands:
    os.environ.update(command.get("env", {}))
    results.append(invoke(command["args"]))
print(json.dumps(results))
"""


class OsUsers:
    def __init__(self, tag: str):
        self.group = f"fsg{tag}"
        self.alice, self.bob, self.outsider = f"fsalice{tag}", f"fsbob{tag}", f"fsout{tag}"
        self.users = (self.alice, self.bob, self.outsider)

    def create(self) -> None:
        subprocess.run(["groupadd", self.group], check=True, capture_output=True)
        for name in (self.alice, self.bob):
            subprocess.run(["useradd", "-M", "-N", "-g", self.group, "-s", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
        # Not in the shared group: the file's permissions keep them out.
        subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", self.outsider],
                       check=True, capture_output=True)

    def remove(self) -> None:
        for name in self.users:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", self.group], capture_output=True)

    def ids(self, name: str) -> tuple[int, int]:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid


@pytest.fixture(scope="module")
def os_users():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create throwaway OS users")
    users = OsUsers(str(os.getpid()))
    try:
        users.create()
    except subprocess.CalledProcessError as exc:
        users.remove()
        pytest.skip(f"cannot create OS users here: {exc.stderr.decode().strip()}")
    yield users
    users.remove()


@pytest.fixture
def shared(os_users):
    """A job table shared by the group: folder 2770 root:group, files 0660 (docs/deployment.md)."""
    folder = Path(tempfile.mkdtemp(prefix="fsched-shared-", dir="/tmp"))
    os.chown(folder, 0, grp.getgrnam(os_users.group).gr_gid)
    os.chmod(folder, 0o2770)
    db = folder / "fsched.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
    env.update(FSCHED_DB=f"sqlite:///{db}", COLUMNS="200", USER="root", LOGNAME="root")
    yield folder, db, env
    shutil.rmtree(folder, ignore_errors=True)


def as_root(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FSCHED, *args], capture_output=True, env=env, timeout=60)


def as_user(os_users: OsUsers, name: str, env: dict, commands: list[dict]) -> list[dict]:
    uid, gid = os_users.ids(name)
    scratch = tempfile.mkdtemp(prefix="fsched-warm-")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", RUN_AS, str(uid), str(gid), json.dumps(commands), scratch],
            capture_output=True, env={**env, "USER": name, "LOGNAME": name}, timeout=120,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def share_files(folder: Path) -> None:
    for path in folder.iterdir():
        os.chmod(path, 0o660)


def test_the_os_user_is_the_tenant_whatever_user_says(os_users, shared):
    """The identity is the process's uid: $USER cannot change it. What each command then allows a user who
    is not an admin is tested in process (tests/unit/test_cli_access.py)."""
    folder, db, env = shared
    alice, bob = os_users.alice, os_users.bob
    jobs = str(SAMPLE_JOBS / "chat.jsonl")
    # The admin (root here) sets up the table and submits a job for bob.
    assert as_root(env, "submit", jobs, "--tenant", bob).returncode == 0  # job 1, bob's
    share_files(folder)
    stat = db.stat()
    assert (stat.st_uid, oct(stat.st_mode & 0o777)) == (0, "0o660")

    submitted, cancel, daemon = as_user(os_users, alice, env, [
        # $USER says bob: the identity is the process's uid, so the tenant is alice.
        {"args": ["submit", jobs, "--json"], "env": {"USER": bob, "LOGNAME": bob}},   # job 2, alice's
        {"args": ["cancel", "1"]},
        {"args": ["daemon", "--model", "standin", "--until-idle"]},
    ])
    assert submitted["code"] == 0, submitted["stderr"]
    assert json.loads(submitted["stdout"])["tenant"] == alice
    refusals = (
        (cancel, f"job 1 belongs to tenant '{bob}'; as OS user '{alice}' you may cancel only the jobs "
                 f"of tenant '{alice}'"),
        (daemon, "serving the job table (fsched daemon) needs an fsched admin"),
    )
    for r, text in refusals:
        assert r["code"] == 1, r
        assert r["stderr"].startswith("fsched: error: ") and text in r["stderr"], r["stderr"]
        assert r["stderr"].count("\n") == 1 and r["stdout"] == "", r

    # Nothing of bob's changed: the admin sees job 1 queued, weights untouched.
    admin_view = json.loads(as_root(env, "status", "--json").stdout)
    assert [(j["id"], j["tenant"], j["state"]) for j in admin_view["jobs"]] == [
        (1, bob, "queued"), (2, alice, "queued")
    ]
    assert {t["name"]: t["weight"] for t in admin_view["tenants"]} == {alice: 1.0, bob: 1.0}


def test_the_file_owner_is_an_admin_and_the_file_mode_is_the_boundary(os_users, shared):
    folder, db, env = shared
    alice, outsider = os_users.alice, os_users.outsider
    jobs = str(SAMPLE_JOBS / "chat.jsonl")
    assert as_root(env, "submit", jobs, "--tenant", "bob").returncode == 0
    share_files(folder)
    # A table alice creates in her own folder is hers: she is its admin and may name any tenant.
    own = Path(tempfile.mkdtemp(prefix="fsched-own-", dir="/tmp"))
    os.chown(own, *os_users.ids(alice))
    try:
        (mine,) = as_user(os_users, alice, env, [
            {"args": ["submit", jobs, "--tenant", "carol", "--json"],
             "env": {"FSCHED_DB": f"sqlite:///{own}/fsched.db"}},
        ])
        assert mine["code"] == 0, mine["stderr"]
        assert json.loads(mine["stdout"])["tenant"] == "carol"
        assert (own / "fsched.db").stat().st_uid == os_users.ids(alice)[0]
        assert oct((own / "fsched.db").stat().st_mode & 0o777) == "0o600"
    finally:
        shutil.rmtree(own, ignore_errors=True)

    # Someone outside the group cannot open the shared table at all: the OS refuses, fsched says so.
    (outside,) = as_user(os_users, outsider, env, [{"args": ["status", "--json"]}])
    assert outside["code"] == 1 and outside["stderr"].startswith("fsched: error: cannot use database file")
    assert outside["stderr"].endswith(": Permission denied\n")
    assert "Traceback" not in outside["stderr"] and outside["stderr"].count("\n") == 1

    # The documented limit: a member who can write the file can bypass fsched with sqlite3.
    uid, gid = os_users.ids(alice)
    bypass = subprocess.run(
        [sys.executable, "-c", (
            "import os, sqlite3, sys; os.setgroups([int(sys.argv[2])]); os.setgid(int(sys.argv[2])); "
            "os.setuid(int(sys.argv[1])); c = sqlite3.connect(sys.argv[3]); "
            "c.execute(\"UPDATE tenants SET weight = 50 WHERE name = 'bob'\"); c.commit()"
        ), str(uid), str(gid), str(db)],
        capture_output=True, timeout=60,
    )
    assert bypass.returncode == 0, bypass.stderr.decode()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT weight FROM tenants WHERE name = 'bob'").fetchone() == (50.0,)
    conn.close()

"""Who may act on whose work, through the commands, in process: a non-admin OS user acts on their own
tenant's work only, and sees other tenants as totals (core/jobs/access.py's rules, as each command applies
them). That the OS user is the process's uid, whatever $USER says, and that the file's mode is the
boundary, is tested with real OS users in tests/acceptance/test_access.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import Commands, act_as

JOBS = str(Path(__file__).resolve().parents[2] / "sample_jobs" / "chat.jsonl")


@pytest.fixture
def fsched():
    commands = Commands()
    yield commands
    commands.close()


def test_a_tenant_cannot_act_on_another_tenants_work(fsched, monkeypatch):
    assert fsched.run("submit", JOBS, "--tenant", "bob").returncode == 0  # an admin submits job 1, bob's
    act_as(monkeypatch, "alice")
    commands = [
        # Job 2: alice's, whatever $USER says.
        (["submit", JOBS, "--json"], {"USER": "bob", "LOGNAME": "bob"}),
        (["submit", JOBS, "--tenant", "bob"], None),
        (["cancel", "1"], None),
        (["results", "1", "--errors"], None),
        (["status", "1"], None),
        (["status", "--tenant", "bob"], None),
        (["tenants", "set-weight", "alice", "100"], None),
        (["tenants", "add", "someone"], None),
        (["keys", "create", "alice"], None),
        (["limits", "set", "max_lines", "5"], None),
        (["status", "--json"], None),
        (["cancel", "2"], None),
        (["results", "2", "--errors"], None),
        (["status", "2", "--json"], None),
        (["tenants", "list", "--json"], None),
    ]
    by_args = {" ".join(args): fsched.run(*args, env=env) for args, env in commands}

    submitted = by_args[f"submit {JOBS} --json"]
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["tenant"] == "alice"

    refusals = {
        f"submit {JOBS} --tenant bob": "you are OS user 'alice' and may submit only as tenant 'alice', "
        "not 'bob'",
        "cancel 1": "job 1 belongs to tenant 'bob'; as OS user 'alice' you may cancel only the jobs "
        "of tenant 'alice'",
        "results 1 --errors": "you may read the results of only the jobs",
        "status 1": "you may see only the jobs",
        "status --tenant bob": "may list only the jobs of tenant 'alice', not 'bob'",
        "tenants set-weight alice 100": "changing a weight needs an fsched admin",
        "tenants add someone": "adding a tenant needs an fsched admin",
        "keys create alice": "needs an fsched admin",
        "limits set max_lines 5": "setting a limit needs an fsched admin",
    }
    for args, text in refusals.items():
        ran = by_args[args]
        err = ran.stderr.decode()
        assert ran.returncode == 1, (args, ran)
        assert err.startswith("fsched: error: ") and text in err, (args, err)
        assert err.count("\n") == 1 and ran.stdout == b"", (args, ran)

    # Her own listing: her job only; bob appears only as totals in the tenants table.
    status = json.loads(by_args["status --json"].stdout)
    assert [(j["id"], j["tenant"]) for j in status["jobs"]] == [(2, "alice")]
    assert {t["name"]: t["queued"] for t in status["tenants"]} == {"alice": 8, "bob": 8}
    # Her own job: hers to cancel, read and see.
    assert by_args["cancel 2"].returncode == 0 and b"cancelled 8 waiting" in by_args["cancel 2"].stdout
    lines = by_args["results 2 --errors"].stdout.decode().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["error"]["code"] == "cancelled"
    assert json.loads(by_args["status 2 --json"].stdout)["jobs"][0]["state"] == "cancelled"
    assert {t["name"] for t in json.loads(by_args["tenants list --json"].stdout)} == {"alice", "bob"}

    # Nothing of bob's changed: an admin sees job 1 queued, weights untouched, no job for bob from alice.
    act_as(monkeypatch, "root", admin=True)
    admin_view = json.loads(fsched.ok("status", "--json"))
    assert [(j["id"], j["tenant"], j["state"]) for j in admin_view["jobs"]] == [
        (1, "bob", "queued"), (2, "alice", "cancelled")
    ]
    assert {t["name"]: t["weight"] for t in admin_view["tenants"]} == {"alice": 1.0, "bob": 1.0}
    assert fsched.table.rows.api_keys == {} and fsched.table.rows.limits == {}


def test_an_admin_names_any_tenant_and_a_user_defaults_to_their_own(fsched, monkeypatch):
    act_as(monkeypatch, "carol-admin", admin=True)
    assert json.loads(fsched.ok("submit", JOBS, "--tenant", "carol", "--json"))["tenant"] == "carol"
    # An admin's default tenant is the login name ($USER), as before there were users.
    assert json.loads(fsched.ok("submit", JOBS, "--json"))["tenant"] == "tester"
    act_as(monkeypatch, "dave")
    assert json.loads(fsched.ok("submit", JOBS, "--json"))["tenant"] == "dave"

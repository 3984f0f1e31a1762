"""Limits an admin stores in the table bind `fsched submit`; a user's environment cannot lift them."""

from __future__ import annotations

import json


def test_submit_obeys_the_stored_limits(fsched, tmp_path):
    job = tmp_path / "three.jsonl"
    job.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    fsched.ok("limits", "set", "max_queued_per_tenant", "2")
    refused = fsched.run("submit", str(job), env={"FSCHED_MAX_QUEUED_PER_TENANT": "1000"})
    assert refused.returncode == 1 and b"over the limit of 2 a tenant" in refused.stderr
    fsched.ok("limits", "set", "max_lines", "2")
    refused = fsched.run("submit", str(job))
    assert refused.returncode == 1 and b"more than 2 requests" in refused.stderr
    shown = {row["name"]: row for row in json.loads(fsched.ok("limits", "show", "--json"))}
    assert shown["max_lines"] == {"name": "max_lines", "value": 2, "set": True, "from": "table"}
    fsched.ok("limits", "unset", "max_lines")
    fsched.ok("limits", "unset", "max_queued_per_tenant")
    assert "submitted job 1: 3 request(s)" in fsched.ok("submit", str(job))
    assert fsched.run("limits", "set", "max_power", "3").returncode == 1


def test_rate_limits_are_set_table_wide_and_on_one_key(fsched):
    made = json.loads(fsched.ok("keys", "create", "alice", "--json"))
    fsched.ok("limits", "set", "tokens_per_minute", "5000")
    assert "is now 30" in fsched.ok("limits", "set", "requests_per_minute", "30", "--key", made["id"])
    shown = key_limits(fsched, made["id"])
    assert shown == {
        "requests_per_minute": {"name": "requests_per_minute", "value": 30, "set": True, "from": "key"},
        "tokens_per_minute": {"name": "tokens_per_minute", "value": 5000, "set": True, "from": "table"},
    }
    table = fsched.ok("limits", "show")
    assert "requests_per_minute" in table and "unlimited" in table
    wrong = fsched.run("limits", "set", "max_lines", "3", "--key", made["id"])
    assert wrong.returncode == 1 and b"only the rate limits" in wrong.stderr
    assert fsched.run("limits", "set", "requests_per_minute", "3", "--key", "nokey").returncode == 1
    fsched.ok("limits", "unset", "requests_per_minute", "--key", made["id"])
    shown = key_limits(fsched, made["id"])
    assert shown["requests_per_minute"]["value"] is None


def key_limits(fsched, key_id: str) -> dict:
    return {row["name"]: row for row in json.loads(fsched.ok("limits", "show", "--key", key_id, "--json"))}

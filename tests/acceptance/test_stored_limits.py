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

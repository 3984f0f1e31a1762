"""Limits an admin stores in the table bind `fsched submit`; a user's environment (the real process's)
cannot lift them. Every other case of `fsched limits` is tested in process
(tests/unit/test_cli_commands.py)."""

from __future__ import annotations

import json


def test_submit_obeys_the_stored_limits(fsched, tmp_path):
    job = tmp_path / "three.jsonl"
    job.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    fsched.ok("limits", "set", "max_queued_per_tenant", "2")
    refused = fsched.run("submit", str(job), env={"FSCHED_MAX_QUEUED_PER_TENANT": "1000"})
    assert refused.returncode == 1 and b"over the limit of 2 a tenant" in refused.stderr
    fsched.ok("limits", "unset", "max_queued_per_tenant")
    assert "submitted job 1: 3 request(s)" in fsched.ok("submit", str(job))

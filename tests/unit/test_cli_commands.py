"""Every command's logic and every bad input, in process: typer's CliRunner over an in-memory job table.

The same cases the real `fsched` executable once ran one subprocess each for; what needs the executable
itself (its entry point, a terminal, a signal) is in tests/acceptance/test_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsched.core.types import RequestStatus
from tests.support.cli import Commands

SAMPLE_JOBS = Path(__file__).resolve().parents[2] / "sample_jobs"


@pytest.fixture
def fsched():
    commands = Commands()
    yield commands
    commands.close()


def line(obj) -> str:
    return json.dumps(obj) + "\n"


def test_submit_sample_jobs_and_status(fsched):
    out = fsched.ok("submit", str(SAMPLE_JOBS / "summaries.jsonl"), "--tenant", "alice", "--class", "batch")
    assert "submitted job 1: 10 request(s), tenant alice (new tenant, weight 1), class batch" in out
    info = json.loads(fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"), "--class", "realtime",
                                "--priority", "1", "--json"))
    assert info == {"job_id": 2, "num_requests": 8, "tenant": "tester", "class": "realtime", "priority": 1,
                    "tenant_created": True}
    fsched.ok("submit", str(SAMPLE_JOBS / "openai_batch.jsonl"), "-t", "alice", "--name", "oa")
    status = json.loads(fsched.ok("status", "--json"))
    assert set(status) == {"jobs", "tenants", "daemons", "online", "fairness_jain"}
    job = status["jobs"][0]
    for key in ("id", "tenant", "class", "priority", "state", "num_requests", "num_done", "num_failed",
                "num_cancelled", "submitted_at"):
        assert key in job
    assert [(j["id"], j["state"], j["num_requests"]) for j in status["jobs"]] == [
        (1, "queued", 10), (2, "queued", 8), (3, "queued", 6)]
    assert status["jobs"][2]["name"] == "oa"
    tenants = {t["name"]: t for t in status["tenants"]}
    assert tenants["alice"]["queued"] == 16 and tenants["alice"]["entitled_share"] == 0.5
    table = fsched.ok("status")
    assert "summaries.jsonl" in table and "Tenants" in table and "alice" in table
    one = json.loads(fsched.ok("status", "2", "--json"))
    assert [j["id"] for j in one["jobs"]] == [2]
    mine = json.loads(fsched.ok("status", "--tenant", "alice", "--json"))
    assert [j["id"] for j in mine["jobs"]] == [1, 3]


def test_submit_reads_stdin_and_applies_default_max_tokens(fsched):
    out = json.loads(fsched.ok("submit", "-", "--json", "--max-tokens", "7", input=line({"prompt": "hi"})))
    assert out["num_requests"] == 1
    (stored,) = fsched.table.rows.requests.values()
    assert stored.prompt == "hi" and stored.params["max_tokens"] == 7
    assert json.loads(fsched.ok("status", "--json"))["jobs"][0]["name"] == "stdin"


def test_several_files_are_one_transaction(fsched, tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(line({"prompt": "a"}))
    bad.write_text(line({"prompt": "a"}) + "{oops\n")
    proc = fsched.run("submit", str(good), str(bad))
    assert proc.returncode == 1 and b"bad.jsonl, line 2" in proc.stderr
    assert fsched.table.rows.jobs == {}
    out = fsched.ok("submit", str(good), str(good), "--json")
    assert [json.loads(x)["job_id"] for x in out.splitlines()] == [1, 2]


def test_several_files_report_the_first_error_in_file_then_line_order(fsched, tmp_path):
    """A user reading the files in order meets the first file's error first, whatever kind each is."""
    dup = tmp_path / "dup.jsonl"
    dup.write_text(line({"prompt": "a", "custom_id": "z"}) * 2)
    big = tmp_path / "big.jsonl"
    big.write_text(line({"prompt": "x" * 300}))
    missing = tmp_path / "missing.jsonl"
    bad_json = tmp_path / "bad_json.jsonl"
    bad_json.write_text(line({"prompt": "a"}) + "{oops\n")
    limit = {"FSCHED_MAX_BYTES": "200"}
    cases = [
        ([dup, big], "dup.jsonl, line 2, field 'custom_id': duplicate custom_id 'z' (first on line 1)"),
        ([big, dup], "big.jsonl: file is"),
        ([dup, missing], "dup.jsonl, line 2, field 'custom_id': duplicate"),
        ([bad_json, big], "bad_json.jsonl, line 2: invalid JSON"),
        ([missing, bad_json], "missing.jsonl: no such file"),
    ]
    for files, expected in cases:
        proc = fsched.run("submit", *map(str, files), env=limit)
        err = proc.stderr.decode()
        assert proc.returncode == 1 and expected in err and err.count("\n") == 1, (files, err)
    assert fsched.table.rows.jobs == {}


def bad_cases(tmp_path):
    """(name, args after 'submit', stderr must contain, env) for each bad input."""

    def f(name, content: str | bytes) -> str:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    ok = line({"prompt": "fine"})
    openai = {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}
    return [
        ("invalid json", [f("a.jsonl", ok + '{"prompt": \n')], "a.jsonl, line 2: invalid JSON", None),
        (
            "not an object",
            [f("b.jsonl", '"just a string"\n')],
            "b.jsonl, line 1: each line must be a JSON object",
            None,
        ),
        (
            "missing prompt",
            [f("c.jsonl", line({"max_tokens": 3}))],
            "c.jsonl, line 1, field 'prompt': missing",
            None,
        ),
        (
            "both prompt and messages",
            [f("d.jsonl", line({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}))],
            "field 'prompt': give either",
            None,
        ),
        (
            "wrong type",
            [f("e.jsonl", ok + line({"prompt": "a", "temperature": "hot"}))],
            "e.jsonl, line 2, field 'temperature': must be a number",
            None,
        ),
        (
            "max_tokens zero",
            [f("g.jsonl", line({"prompt": "a", "max_tokens": 0}))],
            "field 'max_tokens': must be within",
            None,
        ),
        (
            "max_tokens absurd",
            [f("h.jsonl", line({"prompt": "a", "max_tokens": 10**15}))],
            "field 'max_tokens'",
            None,
        ),
        (
            "unknown class",
            [f("i.jsonl", ok), "--class", "urgent"],
            "--class must be one of realtime, streaming, batch",
            None,
        ),
        (
            "priority out of range",
            [f("j.jsonl", ok), "--priority", "12"],
            "--priority must be within 0..9",
            None,
        ),
        (
            "duplicate custom_id",
            [f("k.jsonl", line({"prompt": "a", "custom_id": "z"}) * 2)],
            "k.jsonl, line 2, field 'custom_id': duplicate custom_id 'z' (first on line 1)",
            None,
        ),
        ("empty file", [f("l.jsonl", "")], "l.jsonl: file has no requests", None),
        ("missing file", [str(tmp_path / "nope.jsonl")], "nope.jsonl: no such file", None),
        ("a directory", [str(tmp_path)], "is a directory", None),
        ("non-utf8", [f("m.jsonl", b'{"prompt": "caf\xe9"}\n')], "m.jsonl, line 1: not valid UTF-8", None),
        (
            "too many lines",
            [f("n.jsonl", ok * 3)],
            "n.jsonl, line 3: more than 2 requests",
            {"FSCHED_MAX_LINES": "2"},
        ),
        ("too many bytes", [f("o.jsonl", ok * 10)], "o.jsonl: file is", {"FSCHED_MAX_BYTES": "100"}),
        (
            "line too long",
            [f("p.jsonl", line({"prompt": "x" * 500}))],
            "p.jsonl, line 1: line is",
            {"FSCHED_MAX_LINE_BYTES": "100"},
        ),
        (
            "unsupported url",
            [f("q.jsonl", line({**openai, "url": "/v1/embeddings"}))],
            "q.jsonl, line 1, field 'url': unsupported url",
            None,
        ),
        ("unsupported method", [f("r.jsonl", line({**openai, "method": "PUT"}))], "field 'method'", None),
        ("mixed forms", [f("s.jsonl", line(openai) + ok)], "s.jsonl, line 2: mixes the simple form", None),
        (
            "NaN",
            [f("t.jsonl", '{"prompt": "a", "temperature": NaN}\n')],
            "t.jsonl, line 1: NaN is not valid JSON",
            None,
        ),
        (
            "Infinity",
            [f("u.jsonl", '{"prompt": "a", "top_p": Infinity}\n')],
            "Infinity is not valid JSON",
            None,
        ),
        (
            "deep nesting",
            [f("v.jsonl", '{"prompt": "a", "x": ' + "[" * 70 + "]" * 70 + "}\n")],
            "v.jsonl, line 1: JSON nested deeper than 64 levels",
            None,
        ),
        ("stdin twice", ["-", "-"], "standard input ('-') can be read only once", None),
    ]


def test_every_bad_input_is_one_clear_line_and_changes_nothing(fsched, tmp_path):
    fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"), "-t", "before")
    before = fsched.dump()
    cases = bad_cases(tmp_path)
    for name, args, expected, env in cases:
        proc = fsched.run("submit", *args, env=env, input=b"")
        err = proc.stderr.decode()
        assert proc.returncode != 0, name
        assert expected in err, f"{name}: {err!r}"
        assert err.count("\n") == 1 and err.startswith("fsched: error: "), f"{name}: {err!r}"
        assert proc.stdout == b"", name
        assert fsched.dump() == before, f"{name} changed the job table"
    assert len(cases) == 24


def test_unknown_ids_are_clear_errors(fsched):
    fsched.ok("tenants", "add", "someone")
    for args in (["status", "77"], ["cancel", "77"], ["results", "77"]):
        proc = fsched.run(*args)
        assert proc.returncode == 1, args
        assert proc.stderr.decode() == "fsched: error: no job with id 77\n", args


def test_cancel_queued_job_and_cancel_finished_is_a_no_op(fsched):
    fsched.ok("submit", str(SAMPLE_JOBS / "summaries.jsonl"))
    assert "job 1: cancelled 10 waiting request(s) (cancelled)" in fsched.ok("cancel", "1")
    assert "job 1 is already cancelled; nothing to cancel" in fsched.ok("cancel", "1")
    out = json.loads(fsched.ok("cancel", "1", "--json"))
    assert out["already_finished"] and out["state"] == "cancelled"
    status = json.loads(fsched.ok("status", "1", "--json"))["jobs"][0]
    assert (status["state"], status["num_cancelled"]) == ("cancelled", 10)


def test_cancelling_a_running_job_leaves_its_running_requests_to_their_daemon(fsched):
    fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"))
    fsched.table.queue.claim("d", per_group=3)
    out = fsched.ok("cancel", "1")
    assert out == ("job 1: cancelled 5 waiting request(s); 3 running request(s) stop at the daemon's next "
                   "step (cancelling)\n")
    assert json.loads(fsched.ok("cancel", "1", "--json"))["stopping"] == 3


def test_results_write_openai_lines_to_a_file(fsched, tmp_path):
    fsched.ok("submit", str(SAMPLE_JOBS / "openai_batch.jsonl"))
    fsched.ok("cancel", "1")
    assert fsched.ok("results", "1") == ""  # nothing finished successfully
    out_file = tmp_path / "errors.jsonl"
    proc = fsched.run("results", "1", "--errors", "-o", str(out_file))
    assert proc.returncode == 0 and b"wrote 6 line(s)" in proc.stderr
    lines = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(1, 7)]
    assert all(x["response"] is None and x["error"]["code"] == "cancelled" for x in lines)


def test_results_of_a_finished_job_are_its_lines_in_input_order(fsched):
    from fsched.core.ports.records import Completion

    fsched.ok("submit", str(SAMPLE_JOBS / "openai_batch.jsonl"))
    queue = fsched.table.queue
    claimed = queue.claim("d", per_group=10)
    queue.finish_requests([Completion(c.id, RequestStatus.FINISHED_STOPPED, (1, 2), f"answer {c.custom_id}",
                                      3, "m", lease_epoch=c.lease_epoch) for c in reversed(claimed)], "d")
    lines = [json.loads(x) for x in fsched.ok("results", "1").splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(1, 7)]
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in lines)


def test_results_of_an_unfinished_job_say_so(fsched):
    fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"))
    proc = fsched.run("results", "1")
    assert proc.returncode == 0 and proc.stdout == b""
    assert b"8 of 8 request(s) have not finished yet" in proc.stderr


def test_tenants_commands(fsched):
    assert "added tenant alice with weight 3" in fsched.ok("tenants", "add", "alice", "--weight", "3")
    assert fsched.run("tenants", "add", "alice").stderr == b"fsched: error: tenant 'alice' already exists\n"
    fsched.ok("tenants", "set-weight", "alice", "1.5")
    listing = json.loads(fsched.ok("tenants", "list", "--json"))
    assert listing == [
        {"name": "alice", "weight": 1.5, "entitled_share": None, "active_jobs": 0, "queued": 0, "running": 0}
    ]
    for bad in ("0", "-2", "nan", "inf"):
        proc = fsched.run("tenants", "set-weight", "alice", "--", bad)
        assert proc.returncode != 0 and b"weight must be" in proc.stderr, bad
    assert fsched.run("tenants", "set-weight", "bob", "2").returncode == 1
    fsched.ok("submit", str(SAMPLE_JOBS / "chat.jsonl"), "-t", "alice")
    proc = fsched.run("tenants", "remove", "alice")
    assert proc.returncode == 1 and b"has 1 unfinished job(s)" in proc.stderr
    fsched.ok("cancel", "1")
    assert "removed tenant alice" in fsched.ok("tenants", "remove", "alice")
    assert "alice" not in fsched.ok("tenants", "list")


def test_keys_are_made_listed_and_revoked(fsched):
    created = json.loads(fsched.ok("keys", "create", "leaver", "--json"))
    assert created["key"].startswith(f"fsk-{created['id']}-")
    fsched.ok("keys", "revoke", created["id"])
    (listed,) = [k for k in json.loads(fsched.ok("keys", "list", "--json")) if k["id"] == created["id"]]
    assert listed["tenant"] == "leaver" and listed["revoked_at"] is not None and "key" not in listed
    assert created["key"] not in fsched.ok("keys", "list")  # shown once, never again
    assert fsched.run("keys", "revoke", "nokey").returncode == 1


@pytest.mark.parametrize("args", [["--help"], ["submit", "--help"], ["tenants", "--help"]])
def test_help(fsched, args):
    assert "Usage" in fsched.ok(*args)


# -- limits an admin stores ------------------------------------------------------------------------


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


def test_purge_reclaims_ended_batches_past_the_retention_and_only_an_admin_may(fsched, monkeypatch):
    from fsched.core.jobs.batches import BatchRecord, new_batch_id
    from tests.support.cli import act_as
    from tests.support.tables import submission

    table = fsched.table
    ended, running = table.catalog.submit([submission(3), submission(2)])
    table.catalog.cancel_job(ended.job_id)
    for job in (ended, running):
        table.files.add_batch(BatchRecord(new_batch_id(), "alice", job.job_id, "/v1/completions", "file-x",
                                          "24h", None, 1.0, stored_bytes=1234))
    kept = json.loads(fsched.ok("purge", "--json"))  # the default: ended over 30 days ago
    assert kept["older_than_s"] == 30 * 24 * 3600 and kept["reclaimed"] == 0
    act_as(monkeypatch, "mallory")
    refused = fsched.run("purge", "--older-than", "0")
    assert refused.returncode == 1 and b"admin" in refused.stderr
    monkeypatch.undo()
    done = json.loads(fsched.ok("purge", "--older-than", "0", "--json"))
    assert done["reclaimed"] == 1 and done["stored_bytes"] == 1234
    assert done["batches"][0]["job_id"] == ended.job_id
    assert table.catalog.request_progress(ended.job_id) == []
    assert len(table.catalog.request_progress(running.job_id)) == 2  # not ended: kept
    assert "reclaimed the rows of 0 batch(es)" in fsched.ok("purge", "--older-than", "0")

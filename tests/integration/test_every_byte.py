"""Outputs of any text round-trip exactly, on SQLite and PostgreSQL; a refused write fails its request alone.

Every byte value 0-255 (NUL included, which PostgreSQL's text refuses) and the
lone surrogates that byte-level decoding with `surrogateescape` gives, through
the daemon's writes, `fsched results`, the Batch API's output file and the
online API (plain and streamed).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fsched.api.app import create_app
from fsched.api.state import Backend
from fsched.core.openai.batchfile import parse_job_file
from fsched.core.ports.records import Completion, JobSubmission, TokenUpdate
from fsched.core.types import RequestClass, RequestStatus
from fsched.storage import textcodec
from fsched.storage.refusals import REFUSED_PREFIX
from fsched.storage.stores import JobTable
from tests.support.thread_daemon import answering

EVERY_BYTE = "".join(chr(b) for b in range(256)) + "\udc80\udcff\ud800" + textcodec.ESCAPE + "0000"
FSCHED = str(Path(sys.executable).parent / "fsched")
ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture
def table(db_url):
    t = JobTable(db_url)
    yield t
    t.dispose()


def submit(table: JobTable, n: int = 1, tenant: str = ME, prompt: str = "hello") -> int:
    lines = "".join(json.dumps({"custom_id": f"c{i}", "prompt": prompt, "max_tokens": 8}) + "\n"
                    for i in range(n))
    (job,) = table.catalog.submit([JobSubmission(parse_job_file(lines.encode(), "f.jsonl"), tenant,
                                                 RequestClass.BATCH, 5, "job")])
    return job.job_id


def run_all(table: JobTable, text: str = EVERY_BYTE) -> None:
    """What a daemon does: claim, flush tokens so far, finish, with `text` as the output."""
    claimed = table.queue.claim("d1", per_group=100)
    assert table.queue.flush_tokens("d1", [TokenUpdate(c.id, (1, 2), text[:100], 1.0, c.lease_epoch)
                                           for c in claimed]) == len(claimed)
    table.queue.finish_requests([Completion(c.id, RequestStatus.FINISHED_STOPPED, (1, 2, 3), text,
                                            lease_epoch=c.lease_epoch) for c in claimed], "d1")


def test_every_byte_and_lone_surrogates_round_trip_through_the_stores(table):
    job_id = submit(table)
    (claimed,) = table.queue.claim("d1", per_group=10)
    assert claimed.prompt_text == "hello"
    assert table.queue.flush_tokens("d1", [TokenUpdate(claimed.id, (1,), EVERY_BYTE, 1.0,
                                                        claimed.lease_epoch)]) == 1
    (progress,) = table.serving.progress([job_id])[job_id]
    assert progress.output_text == EVERY_BYTE
    table.queue.finish_requests([Completion(claimed.id, RequestStatus.FINISHED_STOPPED, (1, 2), EVERY_BYTE,
                                            lease_epoch=claimed.lease_epoch)], "d1")
    (result,) = table.catalog.iter_results(job_id)
    assert result.output_text == EVERY_BYTE and result.status is RequestStatus.FINISHED_STOPPED
    assert [p.output_text for p in table.catalog.request_progress(job_id)] == [EVERY_BYTE]


def test_fsched_results_writes_every_byte_back(table, db_url, tmp_path):
    job_id = submit(table)
    run_all(table)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
    out = subprocess.run([FSCHED, "results", str(job_id), "--db", db_url], capture_output=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    (line,) = out.stdout.decode().split("\n")[:-1]  # (splitlines would split at U+0085 too)
    assert json.loads(line)["response"]["body"]["choices"][0]["text"] == EVERY_BYTE


def test_a_refused_write_fails_that_request_alone(table, monkeypatch):
    """With the codec bypassed, PostgreSQL refuses the NUL and SQLite's driver the surrogate: the
    poisoned request ends failed with the table's reason, its neighbours are written, nothing raises."""
    monkeypatch.setattr(textcodec, "encode_text", lambda text: text)
    job_id = submit(table, n=4, prompt="fine")
    a, b, c, d = table.queue.claim("d1", per_group=10)
    poison = "bad\x00\udc80"
    written = table.queue.flush_tokens("d1", [TokenUpdate(a.id, (1,), "ok", 1.0, a.lease_epoch),
                                              TokenUpdate(b.id, (1,), poison, 1.0, b.lease_epoch)])
    assert written == 1
    outcome = table.queue.finish_requests([
        Completion(c.id, RequestStatus.FINISHED_STOPPED, (1, 2), poison, lease_epoch=c.lease_epoch),
        Completion(d.id, RequestStatus.FINISHED_STOPPED, (1, 2), "fine", lease_epoch=d.lease_epoch),
        Completion(b.id, RequestStatus.FINISHED_STOPPED, (1, 2), "late", lease_epoch=b.lease_epoch),
    ], "d1")
    assert outcome == [True, True, False]  # b had already ended (failed at its flush)
    results = {r.custom_id: r for r in table.catalog.iter_results(job_id, errors=True)}
    assert set(results) == {"c1", "c2"}
    assert all(r.status is RequestStatus.FINISHED_FAILED and r.error.startswith(REFUSED_PREFIX)
               for r in results.values())
    (done,) = table.catalog.iter_results(job_id)
    assert done.custom_id == "c3" and done.output_text == "fine"
    assert table.queue.flush_tokens("d1", [TokenUpdate(a.id, (1, 2), "ok!", 1.0, a.lease_epoch)]) == 1
    (job,) = table.catalog.list_jobs(job_id=job_id)
    assert (job.counts.num_done, job.counts.num_failed, job.counts.num_running) == (1, 2, 1)
    assert job.num_output_tokens == 6  # two each: a flushed, c kept on failing (its ids), d done


def test_the_api_answers_every_byte_plain_streamed_and_in_batch_output(table):
    backend = Backend(jobs=table.catalog, keys=table.keys, files=table.files, serving=table.serving)
    key = table.keys.create_key("alice", RequestClass.STREAMING)[1]
    auth = {"Authorization": f"Bearer {key}"}
    with answering(table.queue, EVERY_BYTE), TestClient(create_app(backend)) as client:
        body = {"model": "m", "prompt": "hi", "max_tokens": 4}
        plain = client.post("/v1/completions", json=body, headers=auth)
        assert plain.status_code == 200, plain.text
        assert plain.json()["choices"][0]["text"] == EVERY_BYTE
        answered = client.post("/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 4},
                               headers=auth)
        assert answered.status_code == 200, answered.text
        assert answered.json()["output"][0]["content"][0]["text"] == EVERY_BYTE
        streamed = client.post("/v1/completions", json={**body, "stream": True}, headers=auth)
        deltas = [json.loads(line[6:]) for line in streamed.text.split("\n")
                  if line.startswith("data: {")]
        assert "".join(d["choices"][0]["text"] for d in deltas if d.get("choices")) == EVERY_BYTE
        line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                           "body": {"model": "m", "prompt": "hi", "max_tokens": 4}})
        up = client.post("/v1/files", headers=auth, data={"purpose": "batch"},
                         files={"file": ("in.jsonl", line.encode())})
        batch = client.post("/v1/batches", headers=auth, json={
            "input_file_id": up.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"})
        deadline = time.time() + 20
        while (got := client.get(f"/v1/batches/{batch.json()['id']}", headers=auth).json())[
                "status"] != "completed" and time.time() < deadline:
            time.sleep(0.05)
        content = client.get(f"/v1/files/{got['output_file_id']}/content", headers=auth)
        (out,) = content.text.split("\n")[:-1]
        assert json.loads(out)["response"]["body"]["choices"][0]["text"] == EVERY_BYTE

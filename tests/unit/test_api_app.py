"""The HTTP app in process, over stand-in stores: error shapes, body limits, auth."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fsched.api.app import create_app
from fsched.api.state import Backend
from fsched.core.jobs.apikeys import ApiKey, new_key
from fsched.core.ports.records import StorageError
from fsched.core.types import RequestClass

MADE = new_key()


class Keys:
    def __init__(self, revoked: bool = False):
        self.key = ApiKey(MADE.id, "alice", RequestClass.STREAMING, "", MADE.secret_hash, 0.0,
                          1.0 if revoked else None)

    def get_key(self, key_id):
        return self.key if key_id == self.key.id else None

    def stored_limits(self):
        return {}


class Jobs:
    def __init__(self, down: bool = False):
        self.down = down
        self.submitted = []

    def list_daemons(self):
        if self.down:
            raise StorageError("database is locked")
        return []

    def submit(self, submissions, max_queued_per_tenant):
        self.submitted.append(submissions)
        raise AssertionError("nothing is submitted without a daemon")

    def submit_each(self, submissions, max_queued_per_tenant):
        return self.submit(submissions, max_queued_per_tenant)

    def prepare_submits(self):
        pass


class Serving:
    def progress(self, job_ids):
        return {}

    def progress_states(self, job_ids):
        return {}


def app(down=False, revoked=False) -> tuple[TestClient, Jobs]:
    jobs = Jobs(down)
    backend = Backend(jobs=jobs, keys=Keys(revoked), files=None, serving=Serving())
    return TestClient(create_app(backend)), jobs


AUTH = {"Authorization": f"Bearer {MADE.key}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_keys_are_checked_before_anything_else():
    client, jobs = app()
    assert error_of(client.get("/v1/models"), 401)["code"] == "invalid_api_key"
    assert error_of(client.get("/v1/models", headers={"Authorization": "Bearer fsk-nope"}), 401)
    wrong = MADE.key[:-1] + ("A" if MADE.key[-1] != "A" else "B")
    assert error_of(client.get("/v1/models", headers={"Authorization": f"Bearer {wrong}"}), 401)
    client, _ = app(revoked=True)
    assert error_of(client.get("/v1/models", headers=AUTH), 401)


def test_no_daemon_is_503_and_nothing_is_submitted():
    client, jobs = app()
    assert client.get("/v1/models", headers=AUTH).json() == {"object": "list", "data": []}
    error = error_of(client.post("/v1/chat/completions", headers=AUTH, json=CHAT), 503)
    assert error["code"] == "no_daemon" and jobs.submitted == []


def test_a_table_that_fails_is_503_with_retry_after():
    client, _ = app(down=True)
    response = client.get("/v1/models", headers=AUTH)
    assert error_of(response, 503)["code"] == "storage" and response.headers["retry-after"] == "1"
    assert client.get("/health").status_code == 503


@pytest.mark.parametrize("chunked", [False, True])
def test_bodies_over_the_limit_are_413_declared_or_not(chunked):
    client, jobs = app()
    big = b'{"prompt": "' + b"x" * (1 << 21) + b'"}'
    content = iter([big[i:i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
    error = error_of(client.post("/v1/completions", headers=AUTH, content=content), 413)
    assert "over the limit" in error["message"] and jobs.submitted == []


def test_unknown_paths_and_bad_bodies_answer_in_openai_shape():
    client, _ = app()
    assert error_of(client.get("/v1/nothing", headers=AUTH), 404)
    assert error_of(client.post("/v1/completions", headers=AUTH, content=b"\xff"), 400)
    three = client.post("/v1/chat/completions", headers=AUTH, json={**CHAT, "n": 300})
    assert error_of(three, 400)["param"] == "n"
    forbidden = client.post("/v1/chat/completions", headers=AUTH, json={**CHAT, "service_tier": "priority"})
    assert error_of(forbidden, 403)["param"] == "service_tier"


def test_the_online_endpoints_are_answered_before_the_frameworks_middleware_and_routing():
    client, _ = app()
    through_framework = []
    build = client.app.build_middleware_stack

    def spied():
        inner = build()

        async def stack(scope, receive, send):
            through_framework.append((scope["type"], scope.get("method"), scope.get("path")))
            await inner(scope, receive, send)
        return stack

    client.app.build_middleware_stack = spied
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "m", "prompt": "hi"})):
        assert error_of(client.post(path, headers=AUTH, json=body), 503)["code"] == "no_daemon"
        assert error_of(client.post(path, content=b"{}"), 401)["code"] == "invalid_api_key"
    assert through_framework == []
    wrong_method = client.get("/v1/chat/completions", headers=AUTH)  # the framework's routes still say so
    assert error_of(wrong_method, 405) and wrong_method.headers["allow"] == "POST"
    assert through_framework == [("http", "GET", "/v1/chat/completions")]


def test_metrics_read_the_table_and_the_daemons_figures():
    from fsched.api.metrics import Metrics
    from fsched.core.jobs.jobstate import JobCounts, JobSummary
    from fsched.core.ports.records import (
        DaemonStats,
        DaemonSummary,
        RequestProgress,
        TenantSummary,
        TenantTotals,
    )
    from fsched.core.types import JobState, RequestStatus

    class Table:
        def list_jobs(self, include_finished):
            counts = JobCounts(5, 1, 0, 0, 2)
            return [JobSummary(1, "a", RequestClass.BATCH, 5, "j", JobState.IN_PROGRESS, counts, 9, 0.0, 1.0,
                               None)]

        def list_tenants(self):
            return [TenantSummary("a", 3.0, 1, 2, 2), TenantSummary("b", 1.0, 0, 0, 0)]

        def list_daemons(self):
            stats = DaemonStats(kv_tokens=50, kv_budget=200, preemptions=4, served_share={"a": 1.0},
                                first_tokens={"a": {"realtime": [10, 9]}, "b": {"batch": [4, 4]}},
                                tokens_computed=1000, tokens_recomputed=30, tokens_parked=20)
            return [DaemonSummary("d1", "h", 1, "cpu", "m", 0.0, 0.0, None, stats, 0.1)]

        def tenant_totals(self):
            return [TenantTotals("a", RequestClass.BATCH, 9, 30, 1, 2, 0)]

    table = Table()
    backend = Backend(jobs=table, keys=None, files=None, serving=table)
    metrics = Metrics(backend)
    done = RequestProgress(1, 1, RequestStatus.FINISHED_STOPPED, "x", 1, 10.0, 10.2, 11.0, None,
                           prompt_tokens=1)
    metrics.observe(RequestClass.REALTIME, done)
    metrics.observe(RequestClass.REALTIME, done)
    # Failed before its first token: its finish counts, no first token does.
    metrics.observe(RequestClass.STREAMING, RequestProgress(2, 2, RequestStatus.FINISHED_FAILED, "", 0, 10.0,
                                                            None, 12.0, "boom"))
    text = metrics.render().decode()
    assert 'fsched:time_to_first_token_seconds_count{class="realtime"} 2.0' in text
    assert 'fsched:e2e_request_latency_seconds_count{class="streaming"} 1.0' in text
    assert 'time_to_first_token_seconds_count{class="streaming"}' not in text  # a series only once observed
    assert 'class="batch"' not in "".join(line for line in text.splitlines() if "latency_seconds" in line)
    for line in ('fsched:num_requests_waiting{class="batch",tenant="a"} 2.0',
                 'fsched:num_requests_running{class="batch",tenant="a"} 2.0',
                 'fsched:generation_tokens_total{class="batch",tenant="a"} 9.0',
                 'fsched:prompt_tokens_total{class="batch",tenant="a"} 30.0',
                 'fsched:requests_total{class="batch",outcome="done",tenant="a"} 1.0',
                 'fsched:requests_total{class="batch",outcome="failed",tenant="a"} 2.0',
                 'fsched:tenant_entitled_share{tenant="a"} 1.0',
                 'fsched:tenant_entitled_share{tenant="b"} 0.25',
                 'fsched:tenant_served_share{tenant="a"} 1.0', 'fsched:kv_cache_usage_perc{daemon="d1"} 0.25',
                 'fsched:num_preemptions_total{daemon="d1"} 4.0', "fsched:daemons_alive 1.0",
                 'fsched:time_to_first_token_seconds_bucket{class="realtime",le="0.25"} 2.0',
                 'fsched:e2e_request_latency_seconds_count{class="realtime"} 2.0',
                 # live attainment per tenant and class: divide the two counters' rates
                 'fsched:first_tokens_total{class="realtime",daemon="d1",tenant="a"} 10.0',
                 'fsched:first_tokens_on_target_total{class="realtime",daemon="d1",tenant="a"} 9.0',
                 'fsched:first_tokens_on_target_total{class="batch",daemon="d1",tenant="b"} 4.0',
                 'fsched:tokens_computed_total{daemon="d1"} 1000.0',
                 'fsched:tokens_preempted_total{checkpoint="recompute",daemon="d1"} 30.0',
                 'fsched:tokens_preempted_total{checkpoint="park",daemon="d1"} 20.0',
                 # only a has work, and it was served all of it: fair
                 "fsched:tenant_fairness_jain 1.0"):
        assert line in text, line


def test_a_request_never_asks_opentelemetry_for_its_providers(monkeypatch):
    from opentelemetry import _logs, metrics, trace

    def asked():
        raise AssertionError("a request asked OpenTelemetry's global providers")

    client, _ = app()
    for module, name in ((trace, "get_tracer_provider"), (metrics, "get_meter_provider"),
                         (_logs, "get_logger_provider")):
        monkeypatch.setattr(module, name, asked)
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models", headers=AUTH).status_code == 200


class CountedKeys(Keys):
    """Keys whose stored limits are counted as they are read; the first `failing` reads fail."""

    def __init__(self, failing: int = 0):
        super().__init__()
        self.reads, self.failing = 0, failing

    def stored_limits(self):
        self.reads += 1
        if self.reads <= self.failing:
            raise StorageError("database is locked")
        return {}


def _started(keys: CountedKeys) -> None:
    """A server over `keys` started, and left once it read its limits (at most 5 s)."""
    import time

    with TestClient(create_app(Backend(jobs=Jobs(), keys=keys, files=None, serving=Serving()))):
        deadline = time.monotonic() + 5
        while keys.reads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)


def test_a_server_reads_its_limits_when_it_starts_not_at_its_first_request():
    keys = CountedKeys()
    _started(keys)
    assert keys.reads == 1


def test_a_table_that_cannot_be_read_at_the_start_is_a_warning_not_a_failed_start(caplog):
    keys = CountedKeys(failing=1)
    with caplog.at_level("WARNING", logger="fsched.serve"):
        _started(keys)
    assert keys.reads == 1 and "the limits could not be read at start" in caplog.text

"""deploy/: Debian's prometheus scrapes a live `fsched serve`, and every query of the Grafana dashboard
returns data through Prometheus's HTTP API.

One server, one stand-in daemon and one Prometheus (scraping every second) for the module; online
requests of two classes run while it scrapes, so the latency histograms and counters move, and a batch
backlog longer than the test keeps requests waiting and running. Each query is asked until it has data
(a scrape may come late on a loaded machine), within a deadline.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading
import time

import httpx
import pytest

from tests.support.ports import free_port

from .conftest import REPO
from .http_server import Server, make_server

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "fsched.json"
# What Grafana puts in for its variables when it runs a query.
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__range": "1m", "$tenant": ".*", "${datasource}": ""}

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(PROMETHEUS is None,
                       reason="needs Debian's prometheus (apt-get install -y prometheus; "
                              ".ci/run installs it)"),
]


def queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def grafana_expr(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    root = tmp_path_factory.mktemp("prometheus")
    s = make_server(root)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    # 200 requests of 200 tokens, 4 at a time at 10 ms a step: 100 s of backlog, more than the test takes.
    work = "".join(json.dumps({"prompt": f"d{i}", "max_tokens": 200}) + "\n" for i in range(200))
    s.seed({"alice": 3.0}, [("alice", "work.jsonl", work)])
    s.start_daemon("--model", "standin:10ms", "--max-batch", "4")
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    """Prometheus with deploy/prometheus.yml's scrape job, pointed at this server, every second."""
    root = tmp_path_factory.mktemp("prometheus-data")
    config = (REPO / "deploy" / "prometheus.yml").read_text()
    config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
    config = config.replace('"127.0.0.1:8001"', f'"127.0.0.1:{server.metrics_port}"')
    assert f"127.0.0.1:{server.metrics_port}" in config
    (root / "prometheus.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                             f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


QUERY_DEADLINE_S = 90  # for every query to have data; a quiet machine needs a few seconds


def online_traffic(server: Server, stop: threading.Event, refused: list[str]) -> None:
    """Online requests of two tenants and classes, one after another, until `stop`."""
    keys = [(server.key("bob", "realtime"), "priority"), (server.key("carol", "streaming"), "default")]
    i = 0
    while not stop.is_set():
        key, tier = keys[i % 2]
        r = httpx.post(f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"model": "m", "prompt": "hello there", "max_tokens": 6, "service_tier": tier})
        if r.status_code != 200:
            refused.append(r.text)
        i += 1


def queries_without_data(prometheus: str) -> list[tuple[str, str, list]]:
    empty = []
    for title, expr in queries():
        answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": grafana_expr(expr)},
                           timeout=10).json()
        assert answer["status"] == "success", (title, expr, answer)
        values = [float(r["value"][1]) for r in answer["data"]["result"]]
        if not any(math.isfinite(v) for v in values):
            empty.append((title, expr, answer["data"]["result"]))
    return empty


def test_every_dashboard_query_returns_data_through_prometheus(server, prometheus):
    stop, refused = threading.Event(), []
    traffic = threading.Thread(target=online_traffic, args=(server, stop, refused))
    traffic.start()
    try:
        deadline = time.monotonic() + QUERY_DEADLINE_S
        while (empty := queries_without_data(prometheus)) and time.monotonic() < deadline:
            time.sleep(1)  # the next scrape
    finally:
        stop.set()
        traffic.join()
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    assert empty == [], f"queries without data after {QUERY_DEADLINE_S} s: {empty}"
    assert refused == []
    assert len(queries()) >= 15


def test_the_dashboard_covers_what_operators_asked_for():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(e for _, e in queries())
    for metric in ("tenant_served_share", "tenant_entitled_share", "time_to_first_token_seconds_bucket",
                   "num_requests_waiting", "num_requests_running", "generation_tokens_total",
                   "prompt_tokens_total", "requests_total", "num_preemptions_total", "daemons_alive",
                   "kv_cache_usage_perc", "first_tokens_on_target_total", "first_tokens_total"):
        assert f"fsched:{metric}" in exprs, metric
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "tenant"]
    for panel in dashboard["panels"]:  # every panel names the data source variable: importable anywhere
        assert panel["datasource"]["uid"] == "${datasource}" and panel["description"]

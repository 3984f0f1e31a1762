"""`/dashboard` in a real browser: Debian's chromium driven by Playwright, against a live daemon and server.

One server and one stand-in daemon serve the module. The page's figures are
compared with `/metrics` and `fsched status --json` at one moment: the daemon
(the table's only writer) is paused with SIGSTOP while the three are read, so
nothing moves between the reads. The screenshot goes to a temporary folder,
or to docs/dashboard.png with FSCHED_SCREENSHOTS=docs (how the committed one
was made).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from .conftest import REPO
from .http_server import Server, make_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]

playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="needs playwright (pip install playwright)")
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="needs Debian's chromium (apt-get install -y chromium; .ci/run installs it)"),
]


def lines(n: int, max_tokens: int) -> str:
    return "".join(json.dumps({"prompt": f"document {i}", "max_tokens": max_tokens}) + "\n" for i in range(n))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    root = tmp_path_factory.mktemp("dashboard")
    s = make_server(root)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    s.seed({"alice": 3.0, "bob": 1.0}, [(t, "work.jsonl", lines(40, 400)) for t in ("alice", "bob")])
    s.daemon = s.start_daemon("--model", "standin:20ms", "--max-batch", "4")
    s.start_server()
    s.wait_ready()
    s.admin_key, s.bob_key = s.key("ops", admin=True), s.key("bob", "realtime")
    for _ in range(3):  # online requests of bob's, shown grouped
        body = {"model": "m", "prompt": "hello", "max_tokens": 4, "service_tier": "priority"}
        r = httpx.post(f"{s.url}/v1/completions", headers={"Authorization": f"Bearer {s.bob_key}"},
                       timeout=60, json=body)
        assert r.status_code == 200, r.text
    yield s
    os.kill(s.daemon.pid, signal.SIGCONT)
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def open_page(browser, server: Server, key: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{server.url}/dashboard")
    page.fill("#key", key)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("body[data-updated]")
    page.errors, page.urls = errors, requests
    return page


def metrics(server: Server) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.metrics_url, timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def page_figures(page) -> dict[tuple[str, frozenset], float | None]:
    """Every figure the page marks with the metric it shows, with its labels."""
    cells = page.eval_on_selector_all("[data-metric]", """els => els.map(e => ({
        metric: e.dataset.metric, value: e.dataset.value,
        labels: Object.fromEntries(Object.entries(e.dataset).filter(([k]) => k.startsWith('label'))
                   .map(([k, v]) => [k.slice(5).toLowerCase(), v]))}))""")
    return {(c["metric"], frozenset(c["labels"].items())): (float(c["value"]) if c["value"] else None)
            for c in cells}


def test_the_page_shows_what_metrics_and_status_show_at_one_moment(server, browser):
    page = open_page(browser, server, server.admin_key)
    # The work under way: both tenants' batch jobs have served tokens (the docs' picture waits
    # longer, for a few samples in every chart).
    deadline = time.monotonic() + 60
    while len(server.rows("SELECT DISTINCT tenant FROM jobs WHERE class = 'batch' "
                          "AND num_output_tokens > 0")) < 2:
        assert time.monotonic() < deadline, "the daemon served neither tenant's batch work in 60 s"
        time.sleep(0.1)
    if os.environ.get("FSCHED_SCREENSHOTS") == "docs":
        page.wait_for_timeout(20_000)
    os.kill(server.daemon.pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)  # a write in flight lands (or never starts)
        page.evaluate("window.fschedDashboard.refresh()")
        shown = page_figures(page)
        exported = metrics(server)
        status = json.loads(server.cli("status", "--json", "--all"))
        rows = page.eval_on_selector_all("#jobs tr[data-job-id]", """els => els.map(e => ({
            id: +e.dataset.jobId, done: +e.dataset.numDone, total: +e.dataset.numRequests,
            tokens: e.querySelector('[data-field=num_output_tokens]').textContent.replace(/,/g, ''),
            state: e.querySelector('[data-field=state]').textContent}))""")
        screenshot(page)
    finally:
        os.kill(server.daemon.pid, signal.SIGCONT)
    assert not page.errors, page.errors
    assert all(u.startswith(server.url) for u in page.urls), "the page loaded something from elsewhere"
    per_tenant = {"fsched:generation_tokens_total", "fsched:prompt_tokens_total"}  # summed over classes
    compared = 0
    for (name, labels), value in shown.items():
        if name in per_tenant:
            expected = sum(v for (n, ls), v in exported.items() if n == name and labels <= ls)
        else:
            expected = exported.get((name, labels))
        assert expected is not None or value is None, (name, dict(labels), value)
        if value is not None:
            assert value == pytest.approx(expected, abs=1e-4), (name, dict(labels))
            compared += 1
    names = {name for name, _ in shown}
    assert {"fsched:tenant_entitled_share", "fsched:tenant_served_share", "fsched:num_requests_waiting",
            "fsched:num_requests_running", "fsched:kv_cache_usage_perc", "fsched:daemons_alive",
            "fsched:generation_tokens_total"} <= names
    assert compared >= 12
    # The jobs table is status's (files and batches), figure for figure.
    by_id = {j["id"]: j for j in status["jobs"]}
    assert sorted(r["id"] for r in rows) == sorted(by_id)
    for r in rows:
        j = by_id[r["id"]]
        assert (r["done"], r["total"], int(r["tokens"]), r["state"]) == \
            (j["num_done"], j["num_requests"], j["num_output_tokens"], j["state"])
    assert any(j["num_output_tokens"] for j in status["jobs"])  # the work was under way
    # Online requests are grouped per tenant and key, not listed as jobs.
    online = page.eval_on_selector_all("#online tr[data-tenant]", "els => els.map(e => e.dataset.tenant)")
    assert online == ["bob"]
    assert {t["name"]: t["weight"] for t in status["tenants"]}["alice"] == float(
        page.input_value("#tenants tr[data-tenant=alice] input.weight"))
    page.close()


def screenshot(page) -> Path:
    folder = REPO / "docs" if os.environ.get("FSCHED_SCREENSHOTS") == "docs" else Path(os.environ.get(
        "TMPDIR", "/tmp"))
    path = folder / "dashboard.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 50_000
    return path


def test_a_tenant_key_sees_its_own_work_and_the_aggregate_shares_only(server, browser):
    page = open_page(browser, server, server.bob_key)
    state = page.evaluate("window.fschedDashboard.state()")
    assert state["viewer"] == {"tenant": "bob", "admin": False, "key_id": state["viewer"]["key_id"]}
    assert state["jobs"] and {j["tenant"] for j in state["jobs"]} == {"bob"}
    assert {g["tenant"] for g in state["online"]} == {"bob"}
    assert {w["tenant"] for w in state["why"]} <= {"bob"}
    assert {t["name"] for t in state["tenants"]} >= {"alice", "bob"}  # shares: every tenant's, in aggregate
    tenants_on_page = page.eval_on_selector_all(
        "#jobs tr[data-tenant], #why tr[data-tenant], #online tr[data-tenant]",
        "els => els.map(e => e.dataset.tenant)")
    assert tenants_on_page and set(tenants_on_page) == {"bob"}
    assert page.query_selector("input.weight") is None  # no weight editor for a tenant
    refused = httpx.post(f"{server.url}/dashboard/api/weights", timeout=10,
                         json={"tenant": "bob", "weight": 9},
                         headers={"Authorization": f"Bearer {server.bob_key}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_admin"
    page.close()


def test_an_admin_changes_a_weight_from_the_page(server, browser):
    page = open_page(browser, server, server.admin_key)
    page.fill("#tenants tr[data-tenant=bob] input.weight", "2")
    # The field reads "2" as soon as it is filled: wait for the page's own request to be answered.
    with page.expect_response(lambda r: r.url.endswith("/dashboard/api/weights")) as answered:
        page.click("#tenants tr[data-tenant=bob] button")
    assert answered.value.status == 200
    tenants = {t["name"]: t["weight"] for t in json.loads(server.cli("tenants", "list", "--json"))}
    assert tenants["bob"] == 2.0
    page.fill("#tenants tr[data-tenant=bob] input.weight", "-1")  # refused by the same rule as the CLI
    # The page polls: a refresh between typing and clicking must keep what was typed.
    page.evaluate("window.fschedDashboard.refresh()")
    assert page.input_value("#tenants tr[data-tenant=bob] input.weight") == "-1"
    page.on("dialog", lambda d: d.dismiss())
    with page.expect_event("dialog") as refused:
        page.click("#tenants tr[data-tenant=bob] button")
    assert "weight must be" in refused.value.message
    assert {t["name"]: t["weight"] for t in json.loads(server.cli("tenants", "list", "--json"))}["bob"] == 2.0
    page.close()


def test_a_refused_key_asks_again_and_no_key_reads_nothing(server, browser):
    page = browser.new_page()
    page.goto(f"{server.url}/dashboard")
    page.fill("#key", "fsk-000000000000-" + "x" * 43)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#login:not([hidden])")
    assert "refused" in page.text_content("#status")
    assert httpx.get(f"{server.url}/dashboard/api/state", timeout=10).status_code == 401
    page.close()


def test_the_simulate_plot_draws_offline(server, browser, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i / 10, "prompt_tokens": 64, "output_tokens": 64})
                             + "\n" for i in range(200)))
    server.cli("simulate", str(trace), "--policy", "fcfs", "--policy", "fsched", "--tenants", "a=3,b=1",
               "--plot", str(tmp_path / "plot.html"))
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else
               route.continue_())
    page.goto(f"file://{tmp_path / 'plot.html'}")
    page.wait_for_function("window.FSCHED_PLOT_READY === true")
    assert not errors
    policies = page.eval_on_selector_all("section.policy", "els => els.map(e => e.dataset.policy)")
    assert policies == ["fcfs", "fsched"]
    assert len(page.query_selector_all("section.policy canvas")) == 6
    page.close()

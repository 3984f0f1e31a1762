"""schemathesis against a live `fsched serve` (and a stand-in daemon), from the server's own
`/openapi.json`: no 5xx, every status and body as the schema declares, every error in OpenAI's
shape. The quick suite runs every phase over every operation with QUICK_EXAMPLES random cases each
(seed 1: the same ~900 cases each run, ~12 s); `--long N` fuzzes for N seconds instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .http_server import Server, make_server

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
REPO = Path(__file__).resolve().parents[2]
# Random cases per operation in the quick suite, beside the coverage phase's deterministic ones (~700).
# A count, not a time budget: schemathesis spends all of a --max-time on fuzzing whatever --max-examples
# says (25 s measured), while 10 a operation took 3 s. --long N fuzzes for N seconds (25 at least).
QUICK_EXAMPLES = 10
LONG_MIN_S = 25
# One worker: schemathesis's workers are threads, and CPython 3.11 can fail with "SystemError: AST
# constructor recursion depth mismatch" when two threads build code at once (hypothesis does, for the
# strategies it generates).
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,unsupported_method,allow_header_conformance,openai_error_shape")

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not SCHEMATHESIS.exists(), reason="needs schemathesis (the test extra)")]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("schemathesis"))
    s.cli("limits", "show")
    s.start_daemon("--model", "standin:0ms")
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


def test_the_schema_describes_the_real_endpoints(server):
    """Every route of the API and the dashboard's API, with its methods, and no other."""
    from fsched.api import batch, dashboard, online, responses, tokens

    routes = {(method.lower(), route.path.replace("{model_id:path}", "{model}"))
              for module in (online, responses, tokens, batch, dashboard) for route in module.router.routes
              for method in route.methods}
    routes |= {("get", "/health")}
    pages = {("get", "/dashboard"), ("get", "/dashboard/assets/{name}")}  # the page, not an API
    document = httpx.get(f"{server.url}/openapi.json").json()
    described = {(method, path) for path, item in document["paths"].items() for method in item}
    assert described == routes - pages


def test_schemathesis_finds_nothing(server, request, tmp_path):
    long = int(request.config.getoption("--long") or 0)
    seconds = max(LONG_MIN_S, long) if long else 0
    budget = ("--max-time", str(seconds)) if long else ("--max-examples", str(QUICK_EXAMPLES))
    key = server.key("fuzzer")
    env = {**server.env, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
           "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.run(
        [str(SCHEMATHESIS), "run", f"{server.url}/openapi.json", "--checks", CHECKS,
         "-H", f"Authorization: Bearer {key}", *budget, "--workers", "1",
         "--request-timeout", "30", "--seed", "1", "--suppress-health-check", "all",
         "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=seconds + 300, cwd=tmp_path)  # its cache there
    out = proc.stdout + proc.stderr
    print(out[-4000:])
    assert proc.returncode == 0, out[-6000:]
    assert "No issues found" in out or "passed" in out, out[-3000:]

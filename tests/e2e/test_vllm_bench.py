"""vLLM's own clients against `fsched serve`: its serving benchmark (`vllm bench serve`) and its
request schema.

Only with `pytest --vllm` (the vLLM environment: scripts/vllm_env.sh). The
benchmark runs unchanged with its defaults (the random dataset, streaming,
`ignore_eos`, `stream_options`, the completions payload's
`repetition_penalty` and `logprobs: null`) on both its OpenAI backends; only
the target, the key, the tokenizer folder and a short run (20 prompts of 32
tokens, 16 out) are given. The daemon is the built-in engine on the tiny model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fsched.core.openai.fields import field_for
from fsched.core.types import Endpoint
from tests.acceptance.http_server import Server, make_server
from tests.support.vllm_server import REPO, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PROMPTS, INPUT_LEN, OUTPUT_LEN = 20, 32, 16


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    s = make_server(tmp_path_factory.mktemp("bench"), str(tmp_path_factory.mktemp("cache")))
    s.cli("limits", "show")
    s.start_daemon()
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


def bench(server: Server, backend: str, endpoint: str) -> dict:
    from fsched.core.runners.hf.model import ensure_tiny_model

    tokenizer = ensure_tiny_model(Path(server.env["XDG_CACHE_HOME"]) / "fsched")  # the daemon's model
    key = server.key("bench", "streaming")
    args = ["--backend", backend, "--endpoint", endpoint, "--base-url", server.url,
            "--header", f"Authorization=Bearer {key}", "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--num-prompts", str(PROMPTS),
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
    proc = subprocess.run([vllm_python(), str(REPO / "tests" / "support" / "vllm_bench.py"), *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OPENAI_API_KEY": key})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("backend", "endpoint"), [("openai", "/v1/completions"),
                                                   ("openai-chat", "/v1/chat/completions")])
def test_vllm_bench_serve_with_its_defaults(server, backend, endpoint):
    result = bench(server, backend, endpoint)
    assert (result["completed"], result["failed"]) == (PROMPTS, 0)
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN  # the random dataset ignores EOS
    assert result["mean_ttft_ms"] > 0


def test_every_field_of_vllms_request_schema_is_in_the_table():
    script = (
        "import json\n"
        "from vllm.entrypoints.openai.completion.protocol import CompletionRequest\n"
        "from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest\n"
        "print(json.dumps({'completions': sorted(CompletionRequest.model_fields),"
        " 'chat': sorted(ChatCompletionRequest.model_fields)}))\n"
    )
    proc = subprocess.run([vllm_python(), "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    for endpoint, key in ((Endpoint.COMPLETIONS, "completions"), (Endpoint.CHAT, "chat")):
        assert [n for n in names[key] if field_for(n, endpoint) is None] == []

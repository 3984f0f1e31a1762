"""`fsched daemon --engine URL` over a real vLLM server (CPU build): outputs equal transformers'.

Only with `pytest --vllm` (scripts/test_vllm.sh runs it; the vLLM environment is
created once by scripts/vllm_env.sh and cached). For each model (the tiny Llama
and a GPT-2 style model, both random, built here): 44 mixed requests (plain
prompts and chat messages, 8-64 output tokens, greedy) and 4 of up to 960 tokens, stored by
fsched must equal one-at-a-time `generate` in transformers, token for token:
1. straight through;
2. with forced preemptions (batch of 4, realtime work arriving mid-run);
3. after `kill -9` of the daemon twice and one hard restart of the engine mid-run.
Each model starts vLLM once (and restarts it once) and generates the reference one
request at a time (`scripts/test_vllm.sh`, these and the other end-to-end tests: 6 min 0 s
on a quick 2-core machine; on a slower one 10 min 42 s with its host busy, 6 min 17 s
later, and 12 min 42 s with the front's case added). The tiny Llama runs once more over
vLLM's token interface: vLLM started with `--tokens-only` (no tokenizer, no detokenizing),
the daemon with `--engine-api tokens`; and once over fsched's front for vLLM's engine core
(core/runners/vllm_front.py) in place of vLLM's API server, the daemon at
`--engine front://...`, its metrics port scraped after the straight run and the
preempted one (a 2-core Xeon: 10 min 34 s for all of them).
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.acceptance.conftest import FSCHED
from tests.support.ports import free_port
from tests.support.vllm_server import VllmFront, VllmServer, build_gpt2_model

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

WORDS = ("the fair queue serves every tenant its share of tokens while realtime chat waits less and "
         "batch work fills what is left of the engine").split()
FILLER_TOKENS = 960


def workload(n: int = 44, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        text = " ".join(rng.choices(WORDS, k=rng.randint(3, 60)))
        line = {"custom_id": f"r{i}", "max_tokens": rng.randint(8, 64), "temperature": 0}
        if i % 3 == 0:
            line["messages"] = [{"role": "user", "content": text}]
        else:
            line["prompt"] = text
        lines.append(line)
    return lines


def reference_outputs(folder: Path, lines: list[dict]) -> dict[str, list[int]]:
    """One request at a time through transformers' greedy `generate`."""
    import torch
    from transformers import AutoModelForCausalLM

    from fsched.core.runners.hf.model import encode_prompt
    from fsched.core.runners.hf.tokenizer import load_tokenizer

    tok = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = {}
    for line in lines:
        ids = encode_prompt(tok, line.get("prompt"), line.get("messages"))
        with torch.inference_mode():
            generated = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)).long(),
                                       max_new_tokens=line["max_tokens"], do_sample=False,
                                       eos_token_id=sorted(tok.eos_token_ids),
                                       pad_token_id=tok.tokenizer.pad_token_id)
        out[line["custom_id"]] = generated[0, len(ids):].tolist()
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from fsched.core.runners.hf.model import ensure_tiny_model

    root = tmp_path_factory.mktemp("models")
    tiny = ensure_tiny_model(root)
    return {"tiny": tiny, "gpt2": build_gpt2_model(root / "gpt2-random", tiny)}


class Table:
    """A private job table and the `fsched` commands on it."""

    def __init__(self, path: Path, env: dict):
        self.path = path
        self.env = {**env, "FSCHED_DB": f"sqlite:///{path}", "USER": "tester", "LOGNAME": "tester"}

    def run(self, *args: str, timeout: float = 600) -> str:
        proc = subprocess.run([FSCHED, *args], env=self.env, capture_output=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stderr.decode()

    def submit(self, lines: list[dict], *args: str) -> None:
        path = self.path.with_suffix(f".{len(list(self.path.parent.iterdir()))}.jsonl")
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        self.run("submit", str(path), *args)

    def daemon(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([FSCHED, "daemon", *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def query(self, sql: str) -> list[tuple]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def tokens(self) -> int:
        return self.query("SELECT COALESCE(SUM(num_output_tokens), 0) FROM requests")[0][0]

    def outputs(self) -> dict[str, tuple[str, list[int]]]:
        rows = self.query("SELECT custom_id, state, output_tokens FROM requests")
        return {cid: (state, json.loads(tokens)) for cid, state, tokens in rows}


def wait_tokens(table: Table, at_least: int, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and table.tokens() < at_least:
        time.sleep(0.05)


def assert_equal(table: Table, expected: dict[str, list[int]]) -> None:
    got = table.outputs()
    assert {cid: state for cid, (state, _) in got.items()} == {cid: "done" for cid in expected}
    wrong = [cid for cid in expected if got[cid][1] != expected[cid]]
    assert not wrong, {cid: (got[cid][1], expected[cid]) for cid in wrong[:3]}


def unfinished(table: Table) -> int:
    return table.query("SELECT COUNT(*) FROM requests WHERE state IN ('queued', 'running')")[0][0]


def front_metrics(port: int) -> dict[tuple[str, str], float]:
    """The front's /metrics as Prometheus' parser reads it: each sample by its name and its labels
    (`k=v` joined by commas, vLLM's engine labels left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    own = {"engine", "model_name"}
    return {(s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in own)): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def assert_front_metrics(port: int, table: Table, requests: int) -> None:
    """After a run through the front alone: every request taken and ended, and the engine core's own
    figures (vLLM's names) agreeing with the front's counts and with the table."""
    got = front_metrics(port)
    stored = table.query("SELECT SUM(num_output_tokens) FROM requests")[0][0]
    assert got[("fsched_front_requests_added_total", "")] == requests
    ended = sum(v for (name, _), v in got.items() if name == "fsched_front_requests_ended_total")
    succeeded = sum(v for (name, _), v in got.items() if name == "vllm:request_success_total")
    assert ended == succeeded == requests, got
    assert got[("fsched_front_tokens_total", "")] == got[("vllm:generation_tokens_total", "")] == stored
    assert got[("vllm:prompt_tokens_total", "")] > 0 and got[("fsched_front_requests", "")] == 0


def stop_when_done(table: Table, d: subprocess.Popen, timeout_s: float = 600) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline and unfinished(table):
        time.sleep(0.2)
    d.send_signal(signal.SIGTERM)
    _, err = d.communicate(timeout=60)
    assert d.returncode == 0, err.decode()
    return err.decode()


@pytest.mark.parametrize(("name", "api"),
                         [("tiny", "completions"), ("gpt2", "completions"), ("tiny", "tokens"),
                          ("tiny", "front")])
def test_vllm_outputs_equal_transformers_generate(name, api, models, tmp_path):
    folder = models[name]
    lines = workload()
    # Long batch requests that still run when the realtime work arrives: of twelve candidates,
    # the four whose greedy output is longest (a random model ends some early with EOS). The
    # realtime work comes once the table shows two of them past their minimum quantum, after a
    # batch flush and a `fsched submit` (a second or two), and they must outlast that at the
    # engine's pace: at ~240 tok/s a stream, fillers of 400 tokens were ending within the
    # preemption's grace by then and nothing was preempted. Hence up to 960 (the prompts are at
    # most 36 tokens, the smaller context 1,024).
    candidates = [
        {"custom_id": f"long{i}", "prompt": " ".join(WORDS[i:]), "max_tokens": FILLER_TOKENS,
         "temperature": 0}
        for i in range(12)
    ]
    expected = reference_outputs(folder, lines + candidates)
    fillers = sorted(candidates, key=lambda x: len(expected[x["custom_id"]]), reverse=True)[:4]
    for dropped in (c for c in candidates if c not in fillers):
        del expected[dropped["custom_id"]]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    # The engine at a lower CPU priority: vLLM's CPU build polls on every core and would
    # otherwise starve the daemon for seconds at a time on a small machine (a GPU box has
    # cores to spare); see bench/remote_engine.py.
    metrics_port = free_port()
    extra = ("--tokens-only",) if api == "tokens" else ("--metrics-port", str(metrics_port)) \
        if api == "front" else ()
    server_class = VllmFront if api == "front" else VllmServer
    with server_class(folder, tmp_path / "vllm.log", extra=extra, nice=10) as server:
        common = ("--model", str(folder), "--engine", server.url, "--engine-api", api)

        straight = Table(tmp_path / "straight.db", env)
        straight.submit(lines + fillers)
        straight.run("daemon", *common, "--until-idle")
        assert_equal(straight, expected)
        if api == "front":
            assert_front_metrics(metrics_port, straight, len(expected))

        # Long batch requests fill the batch and run past their minimum quantum; then the
        # rest arrives, half of it realtime: it preempts them.
        preempted = Table(tmp_path / "preempted.db", env)
        preempted.submit(fillers)
        d = preempted.daemon(*common, "--max-batch", "4")
        deadline = time.time() + 300
        long_running = "SELECT COUNT(*) FROM requests WHERE num_output_tokens >= 40 AND state = 'running'"
        while time.time() < deadline and preempted.query(long_running)[0][0] < 2:
            time.sleep(0.05)
        preempted.submit(lines[1::2], "--class", "realtime")
        preempted.submit(lines[::2])
        log = stop_when_done(preempted, d)
        assert_equal(preempted, expected)
        if api == "front":  # a preemption ends the request in the engine: the front counts an abort
            assert front_metrics(metrics_port)[("fsched_front_requests_aborted_total", "")] >= 1
        resumed = [line for line in log.splitlines() if "engine streams:" in line]
        assert resumed and " 0 resumed" not in resumed[0], log

        crashed = Table(tmp_path / "crashed.db", env)
        crashed.submit(lines + fillers)
        # Each daemon runs until the table holds 150 tokens more than when it started: a batch flush can
        # take the count past a fixed mark at once, and the last daemon, counted from such a mark, met
        # the engine's restart before it had even reached the engine (it does not start without it).
        for _ in range(2):
            d = crashed.daemon(*common, "--max-batch", "8")
            wait_tokens(crashed, crashed.tokens() + 150)
            d.send_signal(signal.SIGKILL)
            d.communicate(timeout=60)
        d = crashed.daemon(*common, "--max-batch", "8")
        wait_tokens(crashed, crashed.tokens() + 150)
        server.restart()  # killed hard mid-run, back after its start-up
        log = stop_when_done(crashed, d, timeout_s=900)
        assert_equal(crashed, expected)
        assert log.count("unavailable") == 1 and log.count("is back after") == 1, log

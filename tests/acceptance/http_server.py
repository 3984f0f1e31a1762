"""A real `fsched serve` (and daemon) in subprocesses, for the HTTP acceptance tests."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.cli import TABLE_COMMANDS, invoke
from tests.support.ports import free_port

from .conftest import FSCHED


@dataclass
class Server:
    root: Path
    env: dict
    port: int = 0
    metrics_port: int = 0
    procs: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Where `/metrics` is served: the server's loopback metrics listener."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def db_path(self) -> Path:
        return self.root / "fsched.db"

    def cli(self, *args: str, timeout: float = 60) -> str:
        """`fsched ARGS`: a table command in this process (the server is what these tests run as a user
        does, and each `fsched` process costs a second of CPU in imports), any other in a subprocess."""
        if args and args[0] in TABLE_COMMANDS:
            proc = invoke(args, self.env)
        else:
            proc = subprocess.run([FSCHED, *args], capture_output=True, env=self.env, timeout=timeout)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.decode()

    def key(self, tenant: str, request_class: str = "streaming", admin: bool = False) -> str:
        """A new key, made in this process (the CLI's own path is tested apart: it costs a second)."""
        from fsched.core.types import RequestClass
        from fsched.storage.sql_keys import SqlKeyStore

        keys = SqlKeyStore(self.env["FSCHED_DB"])
        try:
            return keys.create_key(tenant, RequestClass(request_class), admin=admin)[1]
        finally:
            keys.db.dispose()

    def seed(self, weights: dict[str, float], jobs: list[tuple[str, str, str]]) -> None:
        """Tenants with weights and batch jobs (tenant, name, JSONL text), stored in this process (each
        CLI call costs a second or two; the CLI's own paths are tested apart)."""
        from fsched.core.openai.batchfile import parse_job_file
        from fsched.core.ports.records import JobSubmission
        from fsched.core.types import RequestClass
        from fsched.storage.jobstore import SqlJobStore

        store = SqlJobStore(self.env["FSCHED_DB"])
        try:
            for tenant, weight in weights.items():
                store.add_tenant(tenant, weight)
            store.submit([JobSubmission(parse_job_file(text.encode(), name), tenant, RequestClass.BATCH, 5,
                                        name) for tenant, name, text in jobs])
        finally:
            store.db.dispose()

    def start_daemon(self, *args: str) -> subprocess.Popen:
        # One torch thread: the suite runs two workers on two cores, and a daemon on two threads beside
        # the server, the clients and the other worker waits on descheduled threads at every step.
        proc = subprocess.Popen([FSCHED, "daemon", "--threads", "1", "--quiet", *args], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def start_server(self, *args: str, log: Path | None = None) -> None:
        """`fsched serve` with `args`; its stderr (its log) to `log` if given, else kept to read on a
        failed start."""
        self.port, self.metrics_port = free_port(), free_port()
        stderr = subprocess.PIPE if log is None else log.open("wb")
        proc = subprocess.Popen([FSCHED, "serve", "--port", str(self.port), "--metrics-port",
                                 str(self.metrics_port), "--no-access-log", *args],
                                env=self.env, stdout=subprocess.DEVNULL, stderr=stderr)
        self.procs.append(proc)

    def wait_ready(self, daemons: int = 1, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                health = httpx.get(f"{self.url}/health", timeout=2).json()
                if health.get("daemons_alive", 0) >= daemons:
                    return
            except httpx.HTTPError:
                pass
            for proc in self.procs:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "see its log"
            time.sleep(0.1)
        raise TimeoutError("the server or daemon did not come up")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()

    def described(self) -> str:
        """Each process started here: running, or its exit status and the end of its log (for a failure's
        message: a daemon that stopped says why)."""
        lines = []
        for proc in self.procs:
            name = f"fsched {proc.args[1]}"
            if proc.poll() is None:
                lines.append(f"{name}: running")
                continue
            said = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else "(see its log)"
            lines.append(f"{name}: exited {proc.returncode}: {said}")
        return "\n".join(lines)

    def rows(self, sql: str, *params) -> list:
        conn = sqlite3.connect(self.db_path)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def counts(self) -> dict[str, int]:
        """Rows per table that only an accepted request may add to."""
        return {t: self.rows(f"SELECT COUNT(*) FROM {t}")[0][0]
                for t in ("jobs", "requests", "tenants", "files", "batches", "api_keys")}


def make_server(root: Path, model_cache: str | None = None) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}
    env.update(FSCHED_DB=f"sqlite:///{root / 'fsched.db'}", USER="tester", LOGNAME="tester")
    if model_cache:
        env["XDG_CACHE_HOME"] = model_cache
    return Server(root=root, env=env)


def run_sdk_batch(client, bodies: list[dict], timeout: float = 120.0) -> tuple[object, list[dict]]:
    """Chat bodies sent as one Batch API job through the `openai` SDK's `client` (lines `c0`, `c1`, ...),
    waited for until it ends; the batch and its output lines."""
    import json

    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": b})
             for i, b in enumerate(bodies)]
    uploaded = client.files.create(file=("in.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.time() + timeout
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.time() < deadline, batch.status
        time.sleep(0.1)
    if batch.output_file_id is None:
        return batch, []
    return batch, [json.loads(x) for x in client.files.content(batch.output_file_id).content.splitlines()]

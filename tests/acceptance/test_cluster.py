"""Several daemons on one PostgreSQL queue: leases, fencing, reclaim, fairness across the cluster.

The daemons are real `fsched daemon` processes. Most serve with the
deterministic stand-in (`--model standin:<ms>`): what is tested is the job
table's protocol, and the stand-in's outputs are a pure function of each
request, so "every request ends exactly once, with the right output" can be
checked token for token. One test runs the real tiny model; one drives stand-in engine servers over
their token interface (`--engine URL --engine-api tokens`), the daemons' own engines; one has two
daemons share one engine core through fsched's vLLM front (`--engine front://...`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from fsched.core.runners.standin import (
    STANDIN_CONTEXT,
    STANDIN_EOS,
    standin_encode,
    standin_text,
    standin_token,
)
from fsched.core.runners.stopping import check_stop
from fsched.storage.jobstore import SqlJobStore
from tests.support.cli import invoke
from tests.support.fake_engine import FakeEngine
from tests.support.fake_front import FakeFront

from .conftest import FSCHED

LEASE_TTL_S = 3.0
SWEEP_S = 1.0  # DaemonConfig.sweep_s
WINDOW_TOKENS = 20_000  # the share's window: 3 daemons of standin:4ms serve ~4,000 tokens a second


def standin_expected(prompt: str, seed: int, max_tokens: int) -> str:
    """What the stand-in generates for a request, computed here without any daemon."""
    context = standin_encode(prompt)
    prompt_len = len(context)
    while True:
        token = standin_token(seed, context)
        context.append(token)
        stop = check_stop(token, len(context) - prompt_len, max_tokens, len(context), STANDIN_CONTEXT,
                          frozenset({STANDIN_EOS}))
        if stop.finished is not None:
            return standin_text(context[prompt_len:])


def write_jobs(path, n: int, tag: str, max_tokens: int = 24) -> dict[str, str]:
    """n seeded requests; returns custom_id -> the expected output."""
    expected = {}
    with open(path, "w") as f:
        for i in range(n):
            prompt = f"{tag} request {i} about the sea"
            line = {"custom_id": f"{tag}-{i}", "prompt": prompt, "max_tokens": max_tokens, "seed": 1000 + i}
            f.write(json.dumps(line) + "\n")
            expected[f"{tag}-{i}"] = standin_expected(prompt, 1000 + i, max_tokens)
    return expected


class Cluster:
    def __init__(self, url: str, env: dict, log_dir):
        self.url = url
        self.env = {**env, "FSCHED_DB": url}
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def fsched(self, *args: str) -> str:
        """A command over the cluster's table, run in this process (typer's CliRunner): the commands'
        code on PostgreSQL, without the second of imports each `fsched` process costs (the executable
        itself is tests/acceptance/test_cli.py's). The daemons are real processes."""
        ran = invoke(args, self.env)
        assert ran.returncode == 0, ran.stderr.decode()
        return ran.stdout.decode()

    def start(self, *args: str) -> subprocess.Popen:
        log = open(self.log_dir / f"daemon-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen([FSCHED, "daemon", "--lease-ttl", str(LEASE_TTL_S), *args],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.log_dir.glob("daemon-*")))


@pytest.fixture
def cluster(pg_url, fsched, tmp_path):
    c = Cluster(pg_url, fsched.env, tmp_path)
    yield c
    c.stop_all()


def owner_of(store: SqlJobStore, pid: int, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for d in store.list_daemons():
            if d.pid == pid:
                return d.id
        time.sleep(0.1)
    raise AssertionError(f"daemon pid {pid} never beat its heart")


def held_by(store: SqlJobStore, owner: str) -> int:
    from sqlalchemy import func, select

    from fsched.storage.rows import requests

    with store.db.read() as conn:
        return conn.execute(
            select(func.count()).where(requests.c.lease_owner == owner,
                                       requests.c.state == "running")
        ).scalar_one()


def wait_until(predicate, timeout: float, step: float = 0.05) -> float:
    """Seconds until `predicate()` held; fails after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def test_three_daemons_kill_and_pause_every_request_ends_once(cluster, tmp_path):
    expected = {}
    for tag in ("alice", "bob"):
        expected |= write_jobs(tmp_path / f"{tag}.jsonl", 1000, tag)
        cluster.fsched("submit", str(tmp_path / f"{tag}.jsonl"), "--tenant", tag)
    store = SqlJobStore(cluster.url)
    victim = cluster.start("--model", "standin:4ms", "-q")
    sleeper = cluster.start("--model", "standin:4ms", "-q")
    cluster.start("--model", "standin:4ms", "-q", "--until-idle")
    victim_id, sleeper_id = owner_of(store, victim.pid), owner_of(store, sleeper.pid)
    wait_until(lambda: held_by(store, victim_id) > 0 and held_by(store, sleeper_id) > 0, 30)
    # Let them get going, so the killed and paused daemons hold flushed work.
    wait_until(lambda: sum(j.counts.num_done for j in store.list_jobs()) > 300, 60)

    os.kill(victim.pid, signal.SIGKILL)
    os.kill(sleeper.pid, signal.SIGSTOP)
    killed_at = time.monotonic()
    reclaim_s = wait_until(lambda: held_by(store, victim_id) == 0, LEASE_TTL_S + SWEEP_S + 10)
    paused_reclaim_s = time.monotonic() - killed_at + wait_until(lambda: held_by(store, sleeper_id) == 0, 15)
    print(f"\nreclaim after kill -9: {reclaim_s:.2f} s; after SIGSTOP: {paused_reclaim_s:.2f} s "
          f"(lease TTL {LEASE_TTL_S} s + sweep {SWEEP_S} s)")
    # A lease lives TTL from its last renewal (before the kill: with this TTL, every
    # heartbeat), then waits for the next sweep of a live daemon. The slack is for a loaded
    # machine delaying that sweep; a reclaim waiting on anything else (a daemon's own timeout,
    # the paused one's lease) would take longer than this.
    assert reclaim_s <= LEASE_TTL_S + SWEEP_S + 5.0, cluster.logs()
    os.kill(sleeper.pid, signal.SIGCONT)  # it wakes up holding requests it lost

    def all_done():
        return all(j.state.finished for j in store.list_jobs())

    wait_until(all_done, 120, step=0.2)
    sleeper.terminate()
    assert sleeper.wait(timeout=15) == 0, cluster.logs()

    outputs = {}
    for job in store.list_jobs():
        c = job.counts
        assert (c.num_done, c.num_failed, c.num_cancelled, c.num_running) == (c.num_requests, 0, 0, 0)
        for r in store.iter_results(job.id):
            assert r.custom_id not in outputs  # results list each request once
            outputs[r.custom_id] = r.output_text
    assert outputs == expected  # nothing lost, nothing doubled, every resume exact
    failed = list(store.iter_results(1, errors=True)) + list(store.iter_results(2, errors=True))
    assert failed == []
    sleeper_row = next(d for d in store.list_daemons() if d.id == sleeper_id)
    # The paused daemon did try to carry on with what it had lost, and was refused.
    assert sleeper_row.stats.lost_leases > 0, sleeper_row.stats
    store.db.dispose()


def engine_jobs(path) -> dict[str, str]:
    """160 greedy requests of 40 tokens written to `path`; each one's text, by custom id."""
    expected = {}
    with open(path, "w") as f:
        for i in range(160):
            prompt = f"engine request {i} about the sea"
            f.write(json.dumps({"custom_id": f"e-{i}", "prompt": prompt, "max_tokens": 40, "seed": 1000 + i,
                                "temperature": 0}) + "\n")
            expected[f"e-{i}"] = standin_expected(prompt, 1000 + i, 40)
    return expected


def test_a_killed_engine_daemons_requests_resume_on_another_over_the_token_interface(cluster, tmp_path):
    """Two daemons, each in front of its own engine over the token interface: one is killed -9; the
    other takes its requests over when their leases expire and resumes each on its own engine from the
    tokens stored, exactly (greedy: the stand-in engine's tokens are the stand-in's)."""
    path = tmp_path / "jobs.jsonl"
    expected = engine_jobs(path)
    cluster.fsched("submit", str(path), "--tenant", "alice")
    engines = [FakeEngine(step_s=0.004) for _ in range(2)]
    store = SqlJobStore(cluster.url)
    try:
        victim, survivor = (cluster.start("--model", "standin", "--engine", e.url, "--engine-api", "tokens",
                                          "--max-batch", "16", "-q") for e in engines)
        victim_id = owner_of(store, victim.pid)
        wait_until(lambda: held_by(store, victim_id) > 0, 30)
        wait_until(lambda: sum(j.counts.num_done for j in store.list_jobs()) > 30, 60)
        os.kill(victim.pid, signal.SIGKILL)
        victims = {tuple(b["prompt"]) for b in engines[0].bodies}
        wait_until(lambda: all(j.state.finished for j in store.list_jobs()), 120, step=0.2)
        survivor.terminate()
        assert survivor.wait(timeout=15) == 0, cluster.logs()
        outputs = {r.custom_id: r.output_text for r in store.iter_results(1)}
        assert outputs == expected  # nothing lost, nothing doubled, every resume exact
        # The survivor's engine took some of the victim's requests (each prompt is its request's own),
        # resumed from prompt + the tokens stored.
        taken = [b for b in engines[1].bodies if any(tuple(b["prompt"][: len(v)]) == v for v in victims)]
        assert taken and {*engines[0].apis, *engines[1].apis} == {"tokens"}
    finally:
        store.db.dispose()
        for engine in engines:
            engine.stop()


def test_daemons_sharing_one_front_a_killed_ones_requests_resume_through_it(cluster, tmp_path):
    """Two daemons in front of one engine core through fsched's vLLM front (its server over a stand-in
    engine core), each on its own connection: one is killed -9, the front aborts its requests in the
    engine as its connection closes, and the other resumes them on the same front from the tokens
    stored, exactly."""
    path = tmp_path / "jobs.jsonl"
    expected = engine_jobs(path)
    cluster.fsched("submit", str(path), "--tenant", "alice")
    front = FakeFront(step_s=0.004)
    store = SqlJobStore(cluster.url)
    try:
        victim, survivor = (cluster.start("--model", "standin", "--engine", front.url, "--max-batch", "16",
                                          "-q") for _ in range(2))
        victim_id = owner_of(store, victim.pid)
        # Killed while it holds requests (once some are done: the survivor has its own), so that the
        # front has the victim's to abort: on a loaded machine the survivor may have taken the rest.
        wait_until(lambda: held_by(store, victim_id) > 0
                   and sum(j.counts.num_done for j in store.list_jobs()) > 30, 60)
        os.kill(victim.pid, signal.SIGKILL)
        opened = [tuple(b["prompt"]) for b in front.bodies]
        wait_until(lambda: front.aborted > 0, 10)  # the victim's requests, ended in the engine
        wait_until(lambda: all(j.state.finished for j in store.list_jobs()), 120, step=0.2)
        survivor.terminate()
        assert survivor.wait(timeout=15) == 0, cluster.logs()
        outputs = {r.custom_id: r.output_text for r in store.iter_results(1)}
        assert outputs == expected  # nothing lost, nothing doubled, every resume exact
        # Requests opened before the kill and again after it: the victim's, taken over by the survivor
        # (from prompt + the tokens stored, or from the prompt where none were stored yet).
        taken = [b for b in front.bodies[len(opened):]
                 if any(tuple(b["prompt"][: len(p)]) == p for p in opened)]
        assert taken and set(front.apis) == {"front"}
    finally:
        store.db.dispose()
        front.stop()


def test_weights_hold_across_three_daemons_and_realtime_waits_for_none(cluster, tmp_path):
    for tag in ("alice", "bob"):
        write_jobs(tmp_path / f"{tag}.jsonl", 3000, tag, max_tokens=48)
    cluster.fsched("tenants", "add", "alice", "--weight", "3")
    cluster.fsched("tenants", "add", "bob", "--weight", "1")
    for tag in ("alice", "bob"):
        cluster.fsched("submit", str(tmp_path / f"{tag}.jsonl"), "--tenant", tag)
    store = SqlJobStore(cluster.url)
    for _ in range(3):
        cluster.start("--model", "standin:4ms", "-q")

    def tokens() -> dict[str, int]:
        out = {"alice": 0, "bob": 0}
        for j in store.list_jobs():
            out[j.tenant] += j.num_output_tokens
        return out

    # The window is counted in tokens, not seconds: a loaded machine serves the same work, only
    # later (about 2 s to warm up and 5 s of window on a quiet 2-core machine).
    wait_until(lambda: sum(tokens().values()) > 8000, 60)
    start = tokens()
    wait_until(lambda: sum(tokens().values()) - sum(start.values()) >= WINDOW_TOKENS, 60)
    end = tokens()
    served = {t: end[t] - start[t] for t in end}
    share = served["alice"] / sum(served.values())
    print(f"\ncluster-wide token share of alice (weight 3 of 4) over {sum(served.values())} tokens: "
          f"{share:.3f}; served {served}")
    assert all(not j.state.finished for j in store.list_jobs()), "both tenants must stay backlogged"
    assert 0.70 <= share <= 0.80

    # A realtime request waits for no daemon's batch work.
    rt = tmp_path / "rt.jsonl"
    rt.write_text("".join(json.dumps({"prompt": f"quick {i}", "max_tokens": 4, "seed": i}) + "\n"
                          for i in range(5)))
    out = cluster.fsched("submit", str(rt), "--tenant", "carol", "--class", "realtime", "--json")
    job_id = json.loads(out)["job_id"]
    wait_until(lambda: store.list_jobs(job_id=job_id)[0].state.finished, 30)
    waits = [t.first_token_at - t.enqueued_at for t in store.request_timings([job_id])]
    print(f"realtime first token while 3 daemons run batch work: max {max(waits) * 1000:.0f} ms")
    # Usually under 0.1 s; in about one run of four the burst waits 0.8-1.1 s on 2 shared cores,
    # all of it before the claim (the job's started_at), while the three daemons' claims and
    # writes contend for the job rows; not yet explained. The bound is a loaded machine's slack
    # over that: waiting for the batch work itself (over 250,000 tokens still queued, a minute or
    # more) is what it catches.
    assert max(waits) < 10.0
    store.db.dispose()


def test_status_shows_every_daemon_and_flags_dead_ones(cluster, tmp_path):
    write_jobs(tmp_path / "a.jsonl", 200, "a", max_tokens=200)
    cluster.fsched("submit", str(tmp_path / "a.jsonl"), "--tenant", "alice")
    store = SqlJobStore(cluster.url)
    alive, doomed = (cluster.start("--model", "standin:5ms", "-q") for _ in range(2))
    owner_of(store, alive.pid), owner_of(store, doomed.pid)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    seen = {}

    def doomed_is_dead() -> bool:
        seen.update({d["pid"]: d for d in json.loads(cluster.fsched("status", "--json"))["daemons"]})
        return seen[doomed.pid]["state"] == "dead"

    # Dead once its heartbeat is a lease TTL old: a few seconds, later on a loaded machine.
    wait_until(doomed_is_dead, 60, step=0.5)
    daemons = seen
    assert daemons[alive.pid]["alive"] and not daemons[doomed.pid]["alive"]
    assert daemons[doomed.pid]["state"] == "dead" and daemons[alive.pid]["state"] == "alive"
    assert daemons[alive.pid]["heartbeat_age_s"] < LEASE_TTL_S and daemons[alive.pid]["device"] == "standin"
    text = cluster.fsched("status")
    assert "dead" in text and "alive" in text
    store.db.dispose()


def test_two_real_model_daemons_on_postgres_match_one_on_sqlite(cluster, fs, tmp_path, request):
    if not request.config.getoption("--long", default=0.0):
        # Three tiny-model daemon starts (torch and the model each time): 25 s here. The
        # quick suite covers PostgreSQL with the stand-in model and the real model on SQLite.
        pytest.skip("runs with --long")
    lines = [{"custom_id": f"q{i}", "prompt": f"The keeper wrote line {i} of the log", "max_tokens": 24,
              **({"temperature": 0.8, "seed": 50 + i} if i % 2 else {"temperature": 0})} for i in range(24)]
    path = tmp_path / "real.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {"XDG_CACHE_HOME": fs.env["XDG_CACHE_HOME"]}
    fs.ok("submit", str(path), "--tenant", "alice")
    fs.ok("daemon", "--until-idle", "--threads", "1", "-q", env=env, timeout=300)
    reference = {json.loads(line)["custom_id"]: json.loads(line)
                 for line in fs.ok("results", "1").splitlines()}
    cluster.env.update(env)
    cluster.fsched("submit", str(path), "--tenant", "alice")
    procs = [cluster.start("--until-idle", "--threads", "1", "-q", "--max-batch", "8") for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, cluster.logs()
    got = {json.loads(line)["custom_id"]: json.loads(line)
           for line in cluster.fsched("results", "1").splitlines()}

    def text(r):
        return r["response"]["body"]["choices"][0].get("message", {}).get("content") or \
            r["response"]["body"]["choices"][0].get("text")

    assert {k: text(v) for k, v in got.items()} == {k: text(v) for k, v in reference.items()}
    store = SqlJobStore(cluster.url)
    assert len({d.id for d in store.list_daemons()}) == 2
    store.db.dispose()


def test_every_command_works_on_postgresql(cluster, tmp_path):
    from .conftest import SAMPLE_JOBS

    cluster.fsched("tenants", "add", "alice", "--weight", "2")
    cluster.fsched("tenants", "set-weight", "alice", "3")
    out = cluster.fsched("submit", *sorted(str(p) for p in SAMPLE_JOBS.glob("*.jsonl")), "--tenant", "alice")
    assert out.count("submitted job") == 3
    write_jobs(tmp_path / "doomed.jsonl", 5, "doomed")
    cluster.fsched("submit", str(tmp_path / "doomed.jsonl"), "--tenant", "bob", "--class", "streaming")
    assert "cancelled" in cluster.fsched("cancel", "4")
    status = json.loads(cluster.fsched("status", "--json"))
    assert [j["state"] for j in status["jobs"]] == ["queued", "queued", "queued", "cancelled"]
    assert {t["name"]: t["weight"] for t in status["tenants"]} == {"alice": 3.0, "bob": 1.0}
    cluster.start("--model", "standin", "--until-idle", "-q").wait(timeout=60)
    status = json.loads(cluster.fsched("status", "--json"))
    assert [j["state"] for j in status["jobs"]] == ["completed", "completed", "completed", "cancelled"]
    results = [json.loads(line) for line in cluster.fsched("results", "3").splitlines()]
    assert len(results) == status["jobs"][2]["num_requests"] and all(r["error"] is None for r in results)
    assert "alice" in cluster.fsched("tenants", "list")
    daemon = cluster.start("--model", "standin", "-q")
    generated = json.loads(cluster.fsched("generate", "hello there", "--json", "--max-tokens", "5",
                                          "--tenant", "carol", "--seed", "3"))
    assert generated["state"] == "done" and generated["text"] == standin_expected("hello there", 3, 5)
    daemon.terminate()
    assert daemon.wait(timeout=15) == 0
    # One daemon per GPU: a GPU this machine lacks is refused with a clear message.
    proc = subprocess.run([FSCHED, "daemon", "--device", "cuda:7"], env=cluster.env, capture_output=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "cuda:7" in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()

"""What large uploads cost `fsched serve` and the job table, and what deleting them gives back.

    .venv/bin/python bench/uploads.py [--files 4] [--mb 100] [--db URL] [--fsched PATH]

Starts a real `fsched serve` (on a new SQLite file unless --db names another
table), uploads N files of M MB each through POST /v1/files, reads one back,
then deletes them all. Prints serve's peak RSS (VmHWM) and, on SQLite, the
database and WAL sizes after the uploads and after the deletes (on PostgreSQL,
pg_database_size). --fsched runs another build's `fsched` (to compare).
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sizes(db: str) -> str:
    if db.startswith("sqlite:///"):
        path = Path(db.removeprefix("sqlite:///"))
        wal = Path(f"{path}-wal")
        return (f"db {path.stat().st_size / 1e6:,.1f} MB, "
                f"WAL {(wal.stat().st_size if wal.exists() else 0) / 1e6:,.1f} MB")
    import psycopg

    with psycopg.connect(db.replace("postgresql+psycopg://", "postgresql://")) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return f"database {size / 1e6:,.1f} MB"


def upload_all(url: str, auth: dict, payload: Path, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        with payload.open("rb") as f:
            r = httpx.post(f"{url}/v1/files", headers=auth, data={"purpose": "batch"},
                           files={"file": ("upload.jsonl", f)}, timeout=600)
        r.raise_for_status()
        ids.append(r.json()["id"])
    return ids


def vacuum(db: str) -> None:
    import psycopg

    with psycopg.connect(db.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute("VACUUM")


def make_key(fsched: str, env: dict) -> str:
    out = subprocess.run([fsched, "keys", "create", "bench"], env=env, capture_output=True, check=True)
    return out.stdout.decode().strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--db", default=None)
    parser.add_argument("--fsched", default=str(Path(sys.executable).parent / "fsched"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsched-uploads-"))
    db = args.db or f"sqlite:///{work / 'fsched.db'}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FSCHED_")}, "FSCHED_DB": db}
    payload = work / "upload.jsonl"
    with payload.open("wb") as out:  # random text: PostgreSQL would compress a repeated one to nothing
        for _ in range(args.mb * 1_000):
            out.write(b'{"prompt": "' + base64.b64encode(os.urandom(735)) + b'"}\n')
    key = make_key(args.fsched, env)
    port = free_port()
    serve = subprocess.Popen([args.fsched, "serve", "--port", str(port), "--no-access-log"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {key}"}
    try:
        for _ in range(100):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        print(f"serve idle: peak RSS {peak_rss_mb(serve.pid):,.0f} MB; {sizes(db)}")
        started = time.perf_counter()
        ids = upload_all(url, auth, payload, args.files)
        took = time.perf_counter() - started
        print(f"after {args.files} x {args.mb} MB uploads ({took:.1f} s): peak RSS "
              f"{peak_rss_mb(serve.pid):,.0f} MB; {sizes(db)}")
        with httpx.stream("GET", f"{url}/v1/files/{ids[0]}/content", headers=auth, timeout=600) as r:
            got = sum(len(chunk) for chunk in r.iter_bytes())
        assert got == payload.stat().st_size, (got, payload.stat().st_size)
        print(f"read one back ({got / 1e6:,.0f} MB): peak RSS {peak_rss_mb(serve.pid):,.0f} MB")
        for file_id in ids:
            httpx.delete(f"{url}/v1/files/{file_id}", headers=auth, timeout=600).raise_for_status()
        print(f"after deleting them: {sizes(db)}")
        if not db.startswith("sqlite:///"):  # the deleted rows' space is reused once vacuumed
            vacuum(db)
            upload_all(url, auth, payload, args.files)
            print(f"after VACUUM (what autovacuum does) and the same uploads again: {sizes(db)}")
    finally:
        serve.terminate()
        serve.wait(10)


if __name__ == "__main__":
    main()

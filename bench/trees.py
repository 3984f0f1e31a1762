"""Benchmarks that measure source trees alternately: a piece of code run against one tree's sources.

A tree is a folder of fsched's sources (`git archive REV | tar -x -C DIR`, or
a worktree), imported as package `fsched` through a folder made for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run_in_tree(tree: Path, code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """`code` run by this interpreter in a process of its own, with `tree`'s sources as package `fsched`
    and `args` as its arguments: the JSON object of its output's last line (its error's end, if it fails)."""
    with tempfile.TemporaryDirectory() as folder:
        package = Path(folder)
        (package / "fsched").symlink_to(tree.resolve())
        done = subprocess.run([sys.executable, "-c", code, *args], text=True, capture_output=True,
                              env={**os.environ, **(env or {}), "PYTHONPATH": str(package)})
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

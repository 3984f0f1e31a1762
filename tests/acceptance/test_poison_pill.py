"""A model whose output holds NUL: the real daemon on the real tiny model, SQLite and PostgreSQL.

PostgreSQL's text refuses NUL; a token flush holding one used to make the
daemon exit, and every restart claimed the same request and died again. Here
`logit_bias` makes the tiny model write the byte-level token for 0x00 again
and again: the daemon must finish every request, the poisoned ones' text must
come back byte for byte, and the others must not notice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def fs(fs):
    """The table commands in process: the daemon and the bytes it stores are this file's subject."""
    fs.in_process = True
    return fs


@pytest.fixture(params=["sqlite", "postgresql"])
def table_url(request, fs) -> str:
    if request.param == "sqlite":
        return fs.env["FSCHED_DB"]
    return request.getfixturevalue("pg_url")


def nul_token(cache: str) -> int:
    from tokenizers import Tokenizer

    from fsched.core.runners.hf.model import ensure_tiny_model

    tokenizer = Tokenizer.from_file(str(ensure_tiny_model(Path(cache) / "fsched") / "tokenizer.json"))
    token = tokenizer.token_to_id("Ā")  # byte-level BPE's letter for the byte 0x00
    assert tokenizer.decode([token, token]) == "\x00\x00"
    return token


def test_a_model_writing_nul_neither_stops_the_daemon_nor_loses_a_byte(fs, table_url, tmp_path):
    env = {"FSCHED_DB": table_url}
    token = nul_token(fs.env["XDG_CACHE_HOME"])
    job = tmp_path / "job.jsonl"
    poisoned = {"max_tokens": 6, "temperature": 0, "logit_bias": {str(token): 100}}
    bodies = [("nul-1", poisoned), ("plain", {"max_tokens": 6, "temperature": 0}),
              ("nul-2", {**poisoned, "max_tokens": 3})]
    job.write_text("".join(json.dumps({"custom_id": cid, "prompt": "the fair queue", **body}) + "\n"
                           for cid, body in bodies))
    fs.ok("submit", str(job), env=env)
    fs.ok("daemon", "--until-idle", "--quiet", "--threads", "1", env=env, timeout=240)
    lines = {line["custom_id"]: line for line in
             map(json.loads, fs.ok("results", "1", env=env).split("\n")[:-1])}
    texts = {cid: line["response"]["body"]["choices"][0]["text"] for cid, line in lines.items()}
    assert texts["nul-1"] == "\x00" * 6 and texts["nul-2"] == "\x00" * 3
    assert texts["plain"] and "\x00" not in texts["plain"]
    assert all(line["error"] is None for line in lines.values())

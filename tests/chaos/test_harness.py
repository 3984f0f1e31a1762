"""The checks themselves can fail: each invariant of `check_table`, broken on purpose in a copy."""

from __future__ import annotations

import json
import sqlite3

import pytest

from .harness import Table, check_table, final_tokens
from .test_engine_faults import Served

_JOB_TOKENS = "UPDATE jobs SET num_output_tokens = (SELECT SUM(num_output_tokens) FROM requests)"
BREAKS = {
    "a counter off by one": ("UPDATE jobs SET num_done = num_done - 1", "counters"),
    "a request row lost": ("DELETE FROM requests WHERE id = 3", "partial"),
    "a token changed": ("UPDATE requests SET output_tokens = json_replace(output_tokens, '$[0]', 7), "
                        "output_text = 'w7' || substr(output_text, instr(output_text, ' ')) WHERE id = 2",
                        "differs from the reference"),
    "a job's token counter off": ("UPDATE jobs SET num_output_tokens = num_output_tokens + 1",
                                  "token counter"),
    "tokens counted wrong": ("UPDATE requests SET num_output_tokens = num_output_tokens + 1 WHERE id = 4; "
                             "UPDATE jobs SET num_output_tokens = num_output_tokens + 1", "counted"),
    "done without output": ("UPDATE requests SET output_tokens = '[]', output_text = '', "
                            "num_output_tokens = 0 WHERE id = 5; " + _JOB_TOKENS, "done without output"),
    "a running request without a holder": (
        "UPDATE requests SET state = 'running' WHERE id = 6; "
        "UPDATE jobs SET num_running = 1, num_done = num_done - 1", "holder"),
    "a cancelled job with waiting requests": (
        "UPDATE jobs SET cancel_requested_at = 1, num_done = num_done - 1; "
        "UPDATE requests SET state = 'queued' WHERE id = 7", "wait"),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    base = tmp_path_factory.mktemp("harness")
    served = Served(base, "done", lines=12)
    served.run()
    return Table.at(served.path), final_tokens(served.path)


def test_a_finished_table_passes(finished):
    table, expected = finished
    snap = check_table(table.path, expected)
    assert snap.states == {"done": 12}


@pytest.mark.parametrize("name", list(BREAKS))
def test_each_broken_invariant_is_caught(finished, tmp_path, name):
    table, expected = finished
    broken = table.copy(tmp_path / "broken.db")
    sql, message = BREAKS[name]
    conn = sqlite3.connect(broken.path)
    conn.executescript(sql)
    conn.commit()
    conn.close()
    with pytest.raises(AssertionError, match=message):
        check_table(broken.path, expected)


def test_a_request_that_ended_again_is_caught(finished, tmp_path):
    table, expected = finished
    copy = table.copy(tmp_path / "again.db")
    before = check_table(copy.path, expected)
    conn = sqlite3.connect(copy.path)
    conn.execute("UPDATE requests SET finished_at = finished_at + 1 WHERE id = 1")
    conn.commit()
    conn.close()
    with pytest.raises(AssertionError, match="ended again"):
        check_table(copy.path, expected, previous=before)


def test_stored_tokens_must_be_a_prefix_of_the_reference(finished, tmp_path):
    table, expected = finished
    copy = table.copy(tmp_path / "prefix.db")
    conn = sqlite3.connect(copy.path)
    (tokens,) = conn.execute("SELECT output_tokens FROM requests WHERE id = 8").fetchone()
    wrong = [*json.loads(tokens)[:2], 12345]
    conn.executescript(
        f"UPDATE requests SET state = 'queued', output_tokens = '{json.dumps(wrong)}', "
        f"num_output_tokens = 3, output_text = '{' '.join(f'w{t}' for t in wrong)}' WHERE id = 8; "
        f"UPDATE jobs SET num_done = num_done - 1; {_JOB_TOKENS}")
    conn.commit()
    conn.close()
    with pytest.raises(AssertionError, match="not a prefix"):
        check_table(copy.path, expected)

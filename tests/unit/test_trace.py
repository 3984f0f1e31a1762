"""Trace reading: Azure CSV (CRLF; 2023-2025), BurstGPT CSV, Mooncake JSONL, fsched JSONL, deterministic
assignment."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from fsched.core.sim.trace import TraceError, TraceWarning, load_trace, parse_assignments, parse_mix
from fsched.core.types import RequestClass

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55\r\n"
    "2023-11-16 23:59:59.5000000,10,1\r\n"
    "2023-11-17 00:00:00.5000000,20,2\r\n"
)


TRACES = Path(os.environ.get("FSCHED_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))


@pytest.fixture
def mooncake():
    path = TRACES / "mooncake_synthetic.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found (set FSCHED_TRACES to the traces folder)")
    return path


@pytest.fixture
def azure(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_bytes(AZURE.encode())
    return p


def test_azure_csv_relative_arrivals_and_lengths(azure):
    reqs = load_trace(azure)
    assert [r.prompt_tokens for r in reqs] == [374, 396, 879, 10, 20]
    assert [r.output_tokens for r in reqs] == [44, 109, 55, 1, 2]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579)
    assert reqs[4].arrival_s - reqs[3].arrival_s == pytest.approx(1.0)  # across midnight


def test_rate_scale_and_limit(azure):
    base = load_trace(azure)
    fast = load_trace(azure, rate_scale=2.0, limit=3)
    assert len(fast) == 3
    assert fast[1].arrival_s == pytest.approx(base[1].arrival_s / 2)


def test_assignment_is_deterministic_from_seed(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        "\n".join(
            json.dumps({"arrival_s": i * 0.1, "prompt_tokens": 10, "output_tokens": 5})
            for i in range(2_000)
        )
    )
    mix = {RequestClass.REALTIME: 0.1, RequestClass.STREAMING: 0.2, RequestClass.BATCH: 0.7}
    a = load_trace(p, tenants=["x", "y"], mix=mix, seed=1)
    b = load_trace(p, tenants=["x", "y"], mix=mix, seed=1)
    c = load_trace(p, tenants=["x", "y"], mix=mix, seed=2)
    assert a == b and a != c
    classes = Counter(r.request_class for r in a)
    assert 0.6 < classes[RequestClass.BATCH] / 2_000 < 0.8
    tenants = Counter(r.tenant for r in a)
    assert 0.4 < tenants["x"] / 2_000 < 0.6  # uniform: weights decide shares, not load


def test_jsonl_keeps_given_tenant_class_priority(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(
        json.dumps({"arrival_s": 2.0, "tenant": "z", "class": "realtime", "prompt_tokens": 3,
                    "output_tokens": 4, "priority": 1}) + "\n\n"
        + json.dumps({"arrival_s": 1.0, "prompt_tokens": 5, "output_tokens": 6}) + "\n"
    )
    reqs = load_trace(p, tenants=["q"])
    assert [(r.tenant, r.arrival_s) for r in reqs] == [("q", 0.0), ("z", 1.0)]
    assert reqs[1].request_class is RequestClass.REALTIME and reqs[1].priority == 1


def test_mooncake_records_timestamp_ms_and_lengths(tmp_path):
    p = tmp_path / "mooncake.jsonl"
    p.write_text(
        json.dumps({"timestamp": 1500, "input_length": 9000, "output_length": 70, "hash_ids": [1, 2]}) + "\n"
        + json.dumps({"timestamp": 500, "input_length": 200_000, "output_length": 5, "hash_ids": []}) + "\n"
    )
    reqs = load_trace(p, tenants=["a"])
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 200_000, 5),
                                                                             (1.0, 9000, 70)]
    p.write_text(json.dumps({"timestamp": 1, "input_length": 0, "output_length": 5}) + "\n"
                 + json.dumps({"timestamp": 2, "input_length": 7, "output_length": 0}) + "\n")
    with pytest.warns(TraceWarning, match="2 rows with no prompt or no output tokens skipped"):
        with pytest.raises(TraceError, match="no requests"):
            load_trace(p)
    p.write_text(json.dumps({"timestamp": 1, "input_length": -3, "output_length": 5}) + "\n")
    with pytest.raises(TraceError, match="line 1: token count -3 < 0"):
        load_trace(p)


def test_azure_traces_of_other_years_by_their_header_and_timestamps(tmp_path):
    """2024's timestamps carry an offset; 2025's multimodal trace adds a column."""
    p = tmp_path / "azure2024.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.0097170+00:00,4808,10\n"
                 "2024-05-10T00:00:01.5Z,3180,8\n"
                 "2024-05-10 02:00:02.0097170+02:00,110,27\n")
    reqs = load_trace(p)
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 1.4902830, 2.0])
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(4808, 10), (3180, 8), (110, 27)]
    p.write_text("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\r\n"
                 "2024-10-15 00:00:00.5000000,2,1024,64\r\n2024-10-15 00:00:03.0000000,0,300,5\r\n")
    reqs = load_trace(p)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 1024, 64), (2.5, 300, 5)]


def test_a_byte_order_mark_before_the_header_or_first_line_is_read_past(tmp_path):
    csv_trace, jsonl_trace = tmp_path / "bom.csv", tmp_path / "bom.jsonl"
    csv_trace.write_bytes(b"\xef\xbb\xbf" + AZURE.encode())
    jsonl_trace.write_bytes(b"\xef\xbb\xbf" + json.dumps({"timestamp": 5, "input_length": 9,
                                                          "output_length": 2}).encode() + b"\n")
    assert len(load_trace(csv_trace)) == 5
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(jsonl_trace)] == [(9, 2)]


def test_burstgpt_seconds_and_its_failed_requests_skipped(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n"
                 "7,ChatGPT,0,20,20,Conversation log\n"
                 "45,GPT-4,1087,230,1317,Conversation log\n"
                 "120,GPT-4,300,0,300,API log\n")
    with pytest.warns(TraceWarning, match="_1.csv: 2 rows with no prompt or no output tokens skipped"):
        reqs = load_trace(p)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(0.0, 472, 18),
                                                                             (40.0, 1087, 230)]
    p.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
                 "Log Type\n0.5,s1,0,ChatGPT,10,3,13,Conversation log\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(p)] == [(10, 3)]


def test_the_shared_mooncake_trace_loads_whole(mooncake):
    reqs = load_trace(mooncake, tenants=["a", "b"])
    assert len(reqs) == 3_993 and reqs[0].arrival_s == 0.0
    assert max(r.prompt_tokens for r in reqs) > 131_072  # some fit no engine here: refused one by one


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"arrival_s": 1, "prompt_tokens": 5}', "line 1: missing field 'output_tokens'"),
        ('{"arrival_s": 1, "prompt_tokens": 0, "output_tokens": 1}', "line 1: token count"),
        ('{"arrival_s": 1, "prompt_tokens": 2, "output_tokens": 1, "class": "vip"}', "line 1"),
        ("[1, 2]", "line 1: expected a JSON object"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, text, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(text + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(p)


def test_csv_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="line 1: expected header"):
        load_trace(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,3\n")
    with pytest.raises(TraceError, match="line 2"):
        load_trace(bad)
    for row in ("nan,5,3", "yesterday,5,3", "2023-11-16 18:15:46,5,-1"):
        bad.write_text(f"timestamp, contexttokens, generatedtokens\n1,2,3\n{row}\n")  # names in any case
        with pytest.raises(TraceError, match="line 3"):
            load_trace(bad)
    with pytest.raises(TraceError, match="No such file"):
        load_trace(tmp_path / "missing.csv")


def test_parse_assignments_and_mix():
    assert parse_assignments("a=3, b=1", "--tenants") == {"a": 3.0, "b": 1.0}
    for bad in ("a", "a=x", "a=1,a=2", "=3", "a=-1"):
        with pytest.raises(ValueError, match="--tenants"):
            parse_assignments(bad, "--tenants")
    assert parse_mix("realtime=1,batch=3") == {RequestClass.REALTIME: 1.0, RequestClass.BATCH: 3.0}
    with pytest.raises(ValueError, match="unknown class"):
        parse_mix("vip=1")
    with pytest.raises(ValueError, match="all be 0"):
        parse_mix("batch=0")

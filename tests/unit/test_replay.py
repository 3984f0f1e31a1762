"""The replayer's pure parts: the schedule of sends, the request bodies, prompt sizing, the stream reader,
and the report built by the simulator's code from what a client measured."""

from __future__ import annotations

import asyncio
import json

import pytest

from fsched.core.replay.driver import Observed, _read_stream
from fsched.core.replay.http import Response, ServerAddress
from fsched.core.replay.plan import WORDS, Forcing, PromptShape, Send, prompt_text, request_body, send_plan
from fsched.core.replay.report import all_outstanding, live_report, token_shares
from fsched.core.sim.costmodel import PROFILES, paced_profile
from fsched.core.sim.report import RequestRecord
from fsched.core.sim.simulator import simulate
from fsched.core.sim.trace import TraceRequest, load_trace, parse_mix
from fsched.core.types import RequestClass

RT, ST, BA = RequestClass.REALTIME, RequestClass.STREAMING, RequestClass.BATCH


def req(at: float, tenant: str = "a", cls: RequestClass = BA, prompt: int = 10, out: int = 5,
        priority: int = 5) -> TraceRequest:
    return TraceRequest(at, tenant, cls, prompt, out, priority)


# -- the schedule ------------------------------------------------------------------------------------
def test_sends_go_in_arrival_order_timed_from_the_first_arrival():
    sends = send_plan([req(7.5), req(5.0, "b"), req(6.0)])
    assert [(s.index, s.at_s, s.request.tenant) for s in sends] == \
        [(0, 0.0, "b"), (1, 1.0, "a"), (2, 2.5, "a")]


def test_a_duration_keeps_the_requests_arriving_within_it():
    sends = send_plan([req(0.0), req(0.9), req(1.0), req(3.0)], duration_s=1.0)
    assert [s.at_s for s in sends] == [0.0, 0.9]
    with pytest.raises(ValueError, match="duration"):
        send_plan([req(0.0)], duration_s=0)


def test_the_replay_sees_the_requests_simulate_sees(tmp_path):
    """Same flags, same file: the same tenants, classes and times (one reader for both)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.5, "prompt_tokens": 10 + i, "output_tokens": 3})
                             + "\n" for i in range(40)))
    loaded = load_trace(trace, tenants=["a", "b"], mix=parse_mix("5/15/80"), rate_scale=2.0, seed=3)
    sends = send_plan(loaded)
    assert [(s.request.tenant, s.request.request_class, s.at_s) for s in sends] == \
        [(r.tenant, r.request_class, r.arrival_s) for r in loaded]
    assert sends[-1].at_s == pytest.approx(39 * 0.5 / 2.0)
    assert {s.request.request_class for s in sends} >= {ST, BA}


def test_a_slashed_mix_is_realtime_streaming_batch_in_that_order():
    assert parse_mix("5/15/80") == {RT: 5.0, ST: 15.0, BA: 80.0}
    assert parse_mix("realtime=1,batch=1") == {RT: 1.0, BA: 1.0}
    with pytest.raises(ValueError, match="5/15/80"):
        parse_mix("5/95")


# -- the bodies ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cls", "tier"), [(RT, "priority"), (ST, "default"), (BA, "flex")])
def test_a_request_names_its_class_as_the_service_tier_fsched_maps_it_from(cls, tier):
    body = request_body(Send(0, 0.0, req(0, cls=cls, out=42)), model="m", chat=True, prompt="x y",
                        forcing=Forcing())
    assert body["service_tier"] == tier
    assert body["max_tokens"] == 42 and body["min_tokens"] == 42 and body["ignore_eos"] is True
    assert body["messages"] == [{"role": "user", "content": "x y"}] and "prompt" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "priority" not in body  # the neutral priority is not sent (vLLM's fcfs refuses any other)


def test_forcing_fields_are_sent_only_when_the_endpoint_takes_them():
    send = Send(0, 0.0, req(0, priority=2))
    body = request_body(send, model="m", chat=False, prompt="p", forcing=Forcing(ignore_eos=False))
    assert "ignore_eos" not in body and body["min_tokens"] == 5 and body["prompt"] == "p"
    assert body["priority"] == 2  # a trace's own priority goes with it
    plain = request_body(send, model="m", chat=False, prompt="p", forcing=Forcing(False, False))
    assert "ignore_eos" not in plain and "min_tokens" not in plain
    assert "not forced" in Forcing(False, False).describe()


# -- prompts -------------------------------------------------------------------------------------------
def test_the_prompt_shape_comes_from_two_token_counts():
    shape = PromptShape.from_counts((32, 34), (96, 98))  # one token a word, two for the chat template
    assert (shape.per_word, shape.overhead, shape.measured) == (1.0, 2, True)
    assert shape.words_for(100) == 98 and shape.words_for(1) == 1
    assert "/tokenize" in shape.describe()
    assert PromptShape.from_counts((10, 20), (20, 40)).words_for(100) == 50
    with pytest.raises(ValueError):
        PromptShape.from_counts((32, 34), (96, 34))
    assert "approximate" in PromptShape().describe() and PromptShape().words_for(7) == 7


def test_prompts_are_their_word_count_and_differ_from_their_first_words():
    a, b = prompt_text(200, 1), prompt_text(200, 2)
    assert len(a.split()) == 200 and set(a.split()) <= set(WORDS)
    assert a == prompt_text(200, 1)
    assert a.split()[:8] != b.split()[:8]  # no shared prefix for a prefix cache to reuse


# -- reading a stream ----------------------------------------------------------------------------------
def chat_events(tokens: int, usage: bool = True) -> list[bytes]:
    head = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    events = [json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    events += [json.dumps({**head, "choices": [{"index": 0, "delta": {"content": f" w{i}"}}], "usage": None})
               for i in range(tokens)]
    if usage:
        usage_of = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}
        events.append(json.dumps({**head, "choices": [], "usage": usage_of}))
    return [e.encode() for e in events] + [b"[DONE]"]


async def _aiter(items):
    for item in items:
        await asyncio.sleep(0.002)
        yield item


def read(events: list[bytes]) -> Observed:
    obs = Observed(Send(0, 0.0, req(0)))
    asyncio.run(_read_stream(_aiter(events), obs, 0.0))
    return obs


def test_the_first_token_is_the_first_chunk_with_content_and_the_usage_counts_the_tokens():
    obs = read(chat_events(3))
    assert obs.error is None and obs.completed
    assert (obs.output_tokens, obs.prompt_tokens) == (3, 9)
    assert obs.first_token_s < obs.finish_s  # the role chunk before it is not a token


def test_without_a_usage_chunk_each_content_event_is_a_token():
    assert read(chat_events(4, usage=False)).output_tokens == 4


def test_a_stream_that_ends_early_or_carries_an_error_fails():
    assert "without [DONE]" in read(chat_events(3)[:-1]).error
    assert "no token" in read(chat_events(0)).error
    errored = read([chat_events(2)[1], b'{"error": {"message": "engine gone"}}', b"[DONE]"])
    assert "engine gone" in errored.error and not errored.completed


def test_the_http_reader_undoes_chunks_and_splits_event_lines_across_them():
    async def go() -> list[bytes]:
        reader = asyncio.StreamReader()
        body = [b"data: {\"a\": 1}\n\nda", b"ta: [DO", b"NE]\n\n"]
        reader.feed_data(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in body) + b"0\r\n\r\n")
        reader.feed_eof()
        response = Response(200, {"transfer-encoding": "chunked"}, reader, None)
        return [e async for e in response.events()]

    assert asyncio.run(go()) == [b'{"a": 1}', b"[DONE]"]


def test_an_endpoint_is_a_url_with_a_scheme_and_a_host():
    e = ServerAddress.parse("http://127.0.0.1:8000/v1/")
    assert (e.host, e.port, e.tls, e.prefix) == ("127.0.0.1", 8000, False, "")
    assert ServerAddress.parse("https://api.example.com/openai").port == 443
    assert ServerAddress.parse("https://api.example.com/openai").prefix == "/openai"
    for bad in ("127.0.0.1:8000", "ftp://x", "http://:80", "http://h:99999"):
        with pytest.raises(ValueError, match="--url"):
            ServerAddress.parse(bad)


# -- shares --------------------------------------------------------------------------------------------
def rec(tenant, arrival, first, finish, tokens) -> RequestRecord:
    return RequestRecord(tenant, BA, arrival, first, finish, tokens, first - arrival)


def test_the_share_window_is_where_every_tenant_has_work_outstanding():
    records = [rec("a", 0, 1, 10, 10), rec("b", 4, 5, 6, 2), rec("b", 8, 9, 12, 4)]
    window = all_outstanding(records, ["a", "b"])
    assert (window.starts, window.ends) == ((4, 8), (6, 10))
    assert window.seconds == 4 and window.upto(5) == 1 and window.upto(9) == 3 and window.upto(99) == 4


def test_token_shares_count_each_tenants_tokens_inside_the_window():
    # Both outstanding from 1 to 6. a: its first token at 0 is outside, its other 9 spread evenly over
    # [0, 9], 5 s of which are inside: 5 tokens. b: its first token at 2 and its other 2 over [2, 6]: 3.
    records = [rec("a", 0, 0, 9, 10), rec("b", 1, 2, 6, 3)]
    shares, seconds = token_shares(records, ["a", "b"])
    assert seconds == pytest.approx(5)
    assert shares == pytest.approx({"a": 5 / 8, "b": 3 / 8})


def test_without_a_shared_window_the_shares_cover_the_whole_run():
    shares, seconds = token_shares([rec("a", 0, 1, 2, 3), rec("b", 5, 6, 7, 1)], ["a", "b"])
    assert seconds == 7 and shares == pytest.approx({"a": 0.75, "b": 0.25})


# -- the report ----------------------------------------------------------------------------------------
def observed(index, tenant, cls, sent, first, finish, tokens, asked=None, status=200, error=None):
    send = Send(index, sent, req(sent, tenant, cls, out=asked or tokens))
    return Observed(send, sent, first, finish, tokens, 10, status, error)


def test_the_live_report_is_the_simulators_report_of_what_the_client_saw():
    obs = [observed(0, "a", RT, 0.0, 0.1, 1.0, 10),
           observed(1, "b", RT, 0.5, 1.5, 2.0, 5),  # 1.0 s to its first token: off the 0.5 s target
           observed(2, "a", BA, 1.0, 1.2, 3.0, 10, asked=12),
           observed(3, "b", BA, 1.0, None, None, 0, status=400, error="HTTP 400: too long"),
           observed(4, "b", BA, 1.2, None, None, 0, status=None, error="cannot connect")]
    run = live_report("live", obs, {"a": 3, "b": 1}, url="http://x", model="m", prompt_sizing="p",
                      forcing="f")
    report = run.report
    assert (run.sent, run.completed, run.refused, run.failed, run.short_outputs) == (5, 3, 1, 1, 1)
    assert report.classes["realtime"].count == 2 and report.classes["realtime"].on_target == 0.5
    assert report.classes["realtime"].ttft_p50_s == pytest.approx(0.55)
    assert report.makespan_s == 3.0 and report.throughput_tok_s == pytest.approx(25 / 3.0)
    assert report.tenants["a"].entitled == 0.75 and report.rejected == 1
    assert {c: s.goodput_per_s for c, s in report.classes.items()} == pytest.approx(
        {"realtime": 1 / 3.0, "batch": 1 / 3.0})
    assert run.errors == {"HTTP 400: too long": 1, "cannot connect": 1}
    doc = run.to_json()
    assert doc["report"]["classes"]["batch"]["count"] == 1 and doc["completed"] == 3
    assert doc["report"]["classes"]["realtime"]["goodput_per_s"] == pytest.approx(1 / 3.0)


# -- the paced profile ---------------------------------------------------------------------------------
def test_the_paced_profile_charges_a_flat_step_whatever_the_work():
    cost = paced_profile(0.02)
    assert cost.step_s(1, 0) == cost.step_s(8000, 100_000, 5000) == 0.02
    assert PROFILES["paced"] == cost


def test_the_paced_profile_predicts_the_paced_engines_timing_of_a_lone_request():
    """The engine: a request's first token at the end of the step it joins, then one a step."""
    report = simulate([req(0.0, out=50, prompt=1000)], "fcfs", cost=PROFILES["paced"])
    (record,) = report.records
    assert record.first_token_s == pytest.approx(0.02)
    assert record.finish_s == pytest.approx(50 * 0.02)


# -- the command's flags ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--key", "a=k1"], "no key for tenant 'b'"),
    (["--key", "a=k1", "--key", "b"], "expected TENANT=KEY"),
    (["--key", "a=k1", "--key", "a=k2"], "given twice"),
    (["--key", "a=k1", "--key", "b=k2", "--key", "c=k3"], "'c' is not in --tenants"),
    (["--key", "a=k1", "--key", "b=k2", "--url", "localhost:8000"], "--url"),
    (["--key", "a=k1", "--key", "b=k2", "--endpoint", "embeddings"], "chat or completions"),
    (["--key", "a=k1", "--key", "b=k2", "--mix", "1/2"], "--mix"),
    (["--key", "a=k1", "--key", "b=k2", "--duration", "0"], "duration"),
])
def test_the_commands_flag_errors_name_the_flag_before_anything_is_sent(tmp_path, args, message):
    from typer.testing import CliRunner

    from fsched.cli.main import app

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 2}) + "\n")
    argv = ["replay", str(trace), "--tenants", "a=3,b=1", *args]
    if "--url" not in args:
        argv += ["--url", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_commands_table_is_simulates_less_what_a_client_cannot_see_plus_what_only_a_live_run_has():
    from rich.console import Console

    from fsched.cli.replay import replay_table

    obs = [observed(0, "a", RT, 0.0, 0.1, 1.0, 10), observed(1, "b", BA, 0.5, None, None, 0, status=400,
                                                            error="HTTP 400: too long")]
    run = live_report("vllm", obs, {"a": 3, "b": 1}, url="http://x", model="m", prompt_sizing="exact",
                      forcing="forced")
    console = Console(width=200, record=True)
    console.print(replay_table("t.csv", run))
    text = console.export_text()
    assert "realtime TTFT p50" in text and "tenant a served over the run / entitled" in text
    assert "realtime on target" in text and "realtime goodput (on target/s)" in text
    assert "preemptions" not in text and "backfilled" not in text
    assert "1 x" in text and "HTTP 400: too long" in text and "1 / 2" in text

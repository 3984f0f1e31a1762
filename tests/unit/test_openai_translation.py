"""OpenAI bodies to fsched requests and back: the pure translation the HTTP server uses."""

from __future__ import annotations

import json

import pytest

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.batches import BatchRecord
from fsched.core.jobs.jobstate import JobCounts, JobSummary
from fsched.core.openai.answers import AnswerChoice, Delta, chunk, response_body, usage_chunk
from fsched.core.openai.batch import batch_object, validate_metadata
from fsched.core.openai.online import BodyError, ClassRefused, failure_status, parse_online
from fsched.core.ports.records import RequestProgress
from fsched.core.types import Endpoint, JobOrigin, JobState, RequestClass, RequestStatus

CHAT = Endpoint.CHAT
COMPLETIONS = Endpoint.COMPLETIONS


def key(request_class: RequestClass) -> ApiKey:
    return ApiKey("k1", "alice", request_class, "a key", "hash", 0.0)


def body(**fields) -> str:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_a_chat_body_becomes_a_request_of_the_keys_class():
    online = parse_online(body(max_completion_tokens=7, temperature=0, seed=3, stop=["x"], user="u", n=1),
                          CHAT, key(RequestClass.STREAMING))
    spec = online.spec
    assert (spec.params.max_tokens, spec.params.temperature, spec.params.seed, spec.params.stop) == (
        7, 0.0, 3, ("x",))
    assert spec.messages[0].content == "hi" and spec.model == "m"
    assert (online.request_class, online.job.priority, online.stream, online.stream_options.include_usage
            ) == (RequestClass.STREAMING, 5, False, False)
    job = online.job  # what the catalog stores: the key's tenant, one request a choice
    assert (job.tenant, job.key_id, job.origin, job.requests) == ("alice", "k1", JobOrigin.ONLINE, (spec,))


def test_service_tier_asks_for_a_class_never_above_the_keys():
    def tier(name: str, key_class: RequestClass) -> RequestClass:
        return parse_online(body(service_tier=name), CHAT, key(key_class)).request_class

    assert tier("flex", RequestClass.STREAMING) is RequestClass.BATCH
    assert tier("priority", RequestClass.REALTIME) is RequestClass.REALTIME
    assert tier("auto", RequestClass.BATCH) is RequestClass.BATCH
    with pytest.raises(ClassRefused) as refused:
        parse_online(body(service_tier="priority"), CHAT, key(RequestClass.STREAMING))
    assert refused.value.field == "service_tier"
    with pytest.raises(ClassRefused):
        parse_online(body(service_tier="default"), CHAT, key(RequestClass.BATCH))


@pytest.mark.parametrize(("text", "param"), [
    (body(priority="high"), "priority"),
    (body(service_tier="gold"), "service_tier"),
    (body(stream_options={"include_usage": True}), "stream_options"),
    (body(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (body(n=0), "n"),
    (body(temperature=3), "temperature"),
    (body(logit_bias={"x": 1}), "logit_bias"),
    (body(tools=[{"type": "function"}]), "tools[0].function"),
    (body(temprature=1), "temprature"),
    (json.dumps({"model": "m", "prompt": "p"}), "prompt"),
    (json.dumps({"model": "m"}), "messages"),
    ('{"messages": [], "messages": []}', "messages"),
    ('{"temperature": NaN}', None),
    ("[1]", None),
    ("not json", None),
])
def test_bad_bodies_name_the_field(text, param):
    with pytest.raises(BodyError) as error:
        parse_online(text, CHAT, key(RequestClass.REALTIME))
    assert error.value.field == param and not isinstance(error.value, ClassRefused)


def test_streaming_with_usage_and_a_completions_body():
    online = parse_online(json.dumps({"model": "m", "prompt": "p", "stream": True, "priority": 0,
                                      "stream_options": {"include_usage": True}}), COMPLETIONS,
                          key(RequestClass.BATCH))
    assert online.stream and online.stream_options.include_usage and online.job.priority == 0
    assert online.spec.prompt == "p"


def test_response_objects_follow_openai():
    chat = response_body(CHAT, "chatcmpl-4", 10, "m", [AnswerChoice(0, "hello", "length", 5, 3)])
    assert chat["object"] == "chat.completion" and chat["id"] == "chatcmpl-4"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    text = response_body(COMPLETIONS, "cmpl-4", 10, "m", [AnswerChoice(0, "hello", None, 1, None)])
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "hello"
    assert text["choices"][0]["finish_reason"] == "stop" and text["usage"]["prompt_tokens"] == 0


def test_chunks_carry_deltas_then_the_finish_then_the_usage():
    first = chunk(CHAT, "c1", 0, "m", Delta(0, first=True), include_usage=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["usage"] is None
    middle = chunk(CHAT, "c1", 0, "m", Delta(0, "ab"))
    assert middle["choices"][0]["delta"] == {"content": "ab"} and "usage" not in middle
    last = chunk(CHAT, "c1", 0, "m", Delta(0, finish_reason="stop"))
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    usage = usage_chunk(CHAT, "c1", 0, "m", {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5})
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    assert chunk(COMPLETIONS, "c1", 0, "m", Delta(1, "ab"))["choices"][0] == {
        "index": 1, "text": "ab", "logprobs": None, "finish_reason": None}


def progress(state: RequestStatus, text: str) -> RequestProgress:
    return RequestProgress(1, 1, state, text, 1, 0.0, None, None, None)


def test_a_partial_character_waits_for_the_end():
    assert progress(RequestStatus.RUNNING, "ab\ufffd").visible_text == "ab"
    assert progress(RequestStatus.FINISHED_STOPPED, "ab\ufffd").visible_text == "ab\ufffd"


def test_a_request_too_long_for_the_context_is_the_clients_error():
    assert failure_status("asks for 900 tokens, over the model's context of 512; ...") == 400
    assert failure_status("the model step failed 3 times") == 500 and failure_status(None) == 500


def job(state: JobState, done=0, failed=0, cancelled=0, running=0) -> JobSummary:
    counts = JobCounts(3, done, failed, cancelled, running)
    return JobSummary(7, "alice", RequestClass.BATCH, 5, "b", state, counts, 0, 100.0, 101.0,
                      102.0 if state.finished else None)


def record(**fields) -> BatchRecord:
    return BatchRecord(**{"id": "batch_1", "tenant": "alice", "job_id": 7, "endpoint": "/v1/completions",
                          "input_file_id": "file-1", "completion_window": "24h", "metadata": {"k": "v"},
                          "created_at": 100.0, **fields})


def test_a_batch_reads_as_openai_batch_objects():
    running = batch_object(record(), job(JobState.IN_PROGRESS, done=1, running=2))
    assert running["status"] == "in_progress" and running["request_counts"] == {
        "total": 3, "completed": 1, "failed": 0}
    assert running["expires_at"] == 100 + 86400 and running["metadata"] == {"k": "v"}
    done = batch_object(record(output_file_id="file-o", error_file_id="file-e"),
                        job(JobState.FAILED, done=2, failed=1))
    assert done["status"] == "completed" and done["completed_at"] == 102
    assert (done["output_file_id"], done["request_counts"]["failed"]) == ("file-o", 1)
    assert batch_object(record(), job(JobState.CANCELLED, cancelled=3))["status"] == "cancelled"
    error = {"code": "invalid_request", "message": "bad", "param": "url", "line": 2}
    refused = batch_object(record(job_id=None, errors=[error], failed_at=100.5), None)
    assert refused["status"] == "failed" and refused["errors"]["data"][0]["line"] == 2
    assert refused["request_counts"]["total"] == 0


def test_metadata_is_bounded_string_pairs():
    assert validate_metadata(None) is None and validate_metadata({"a": "b"}) == {"a": "b"}
    for bad in ([1], {"a": 1}, {str(i): "x" for i in range(17)}, {"a": "x" * 513}):
        with pytest.raises(ValueError):
            validate_metadata(bad)


def choice_progress(choice: int, state: RequestStatus, tokens: list[int], logprobs: bool = False):
    state = RequestStatus.FINISHED_LENGTH if state.is_finished else state
    from fsched.core.types import Logprob, TokenLogprobs

    lps = tuple(TokenLogprobs(Logprob(t, -1.0, f" w{t}"), (Logprob(t, -1.0, f" w{t}"),)) for t in tokens)
    return RequestProgress(str(choice), 1, state, "".join(f" w{t}" for t in tokens), len(tokens), 0.0, None,
                           None, None, prompt_tokens=4,
                           logprobs=lps if logprobs else (), choice=choice, tokens=tuple(tokens))


def relay_of(text: str, endpoint=COMPLETIONS):
    from fsched.core.openai.streams import StreamRelay

    online = parse_online(text, endpoint, key(RequestClass.REALTIME))
    return StreamRelay(endpoint, "cmpl-1", 0, "m", online)


def test_a_stream_interleaves_choices_and_echoes_each_prompt_once():
    relay = relay_of(json.dumps({"prompt": ["A", "B"], "stream": True, "echo": True,
                                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    running, done = RequestStatus.RUNNING, RequestStatus.FINISHED_STOPPED
    first = list(relay.update([choice_progress(0, running, [5]), choice_progress(1, running, [])]))
    assert [(c["choices"][0]["index"], c["choices"][0]["text"]) for c in first] == [(0, "A w5")]
    assert first[0]["usage"]["completion_tokens"] == 1
    last = list(relay.update([choice_progress(0, done, [5, 6]), choice_progress(1, done, [7])]))
    texts = [(c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0]["finish_reason"])
             for c in last]
    assert texts == [(0, " w6", None), (0, "", "length"), (1, "B w7", None), (1, "", "length")]
    (usage,) = relay.closing([choice_progress(0, done, [5, 6]), choice_progress(1, done, [7])])
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 8, "completion_tokens": 3,
                                                         "total_tokens": 11}


def test_streamed_logprobs_carry_each_chunks_tokens_and_their_offsets():
    relay = relay_of(json.dumps({"prompt": "A", "stream": True, "logprobs": 1}))
    running = RequestStatus.RUNNING
    (first,) = relay.update([choice_progress(0, running, [5], True)])
    (second,) = relay.update([choice_progress(0, running, [5, 61], True)])
    assert first["choices"][0]["logprobs"]["tokens"] == [" w5"]
    assert second["choices"][0]["logprobs"] == {"tokens": [" w61"], "token_logprobs": [-1.0],
                                                "top_logprobs": [{" w61": -1.0}], "text_offset": [3]}


def test_chat_streams_open_every_choice_and_obfuscate_when_asked():
    relay = relay_of(json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True,
                                 "stream_options": {"include_obfuscation": True}}), CHAT)
    opening = list(relay.opening())
    assert [c["choices"][0]["delta"] for c in opening] == [{"role": "assistant", "content": ""}] * 2
    assert all(1 <= len(c["obfuscation"]) <= 16 for c in opening)


def test_two_choices_sum_their_usage_and_count_the_prompt_once():
    from fsched.core.types import AnswerOptions

    choices = [AnswerChoice(1, "b", "stop", 2, 5), AnswerChoice(0, "a", "stop", 3, 5)]
    body = response_body(CHAT, "c", 0, "m", choices, AnswerOptions(n=2))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


SCHEMA = {"type": "object"}


def test_a_responses_body_is_a_chat_body_and_its_stream_the_responses_events():
    from fsched.core.openai.responses import ResponsesRelay, to_chat_body

    asked = to_chat_body({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                          "instructions": "Be brief.", "max_output_tokens": 9, "top_logprobs": 2,
                          "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}})
    assert asked.chat_body == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 9, "logprobs": True, "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    relay = ResponsesRelay("resp_1", 0.0, "m", asked.echo, logprobs=True)
    events = list(relay.opening())
    done = choice_progress(0, RequestStatus.FINISHED_STOPPED, [3, 4], logprobs=True)
    from fsched.core.openai.online import choice_of

    events += list(relay.closing([done], choice_of(done)))
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(9))
    assert events[4]["delta"] == " w3 w4" and len(events[4]["logprobs"]) == 2
    assert events[-1]["response"]["usage"]["output_tokens"] == 2

"""Real clients of the OpenAI ecosystem, unchanged, against `fsched serve` and a tiny-model daemon.

The `openai` SDK (every endpoint fsched serves, sync and async, streaming) and
LangChain's `ChatOpenAI` and `OpenAI` (penalties, logprobs, n=2, stop,
structured output). One server and one daemon serve the module; answers are
short (a few tokens of the tiny model).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from fsched.core.openai.fields import FIELDS, Support

from .http_server import Server, make_server, run_sdk_batch

pytestmark = pytest.mark.timeout(240)
CHAT = [{"role": "user", "content": "Tell me about the river."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_cache) -> Server:
    s = make_server(tmp_path_factory.mktemp("clients"), model_cache)
    s.cli("limits", "show")  # creates the table, owned by this user: an admin of it
    s.start_daemon()
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def key(server) -> str:
    return server.key("clients", "realtime")


@pytest.fixture(scope="module")
def sdk(server, key) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=120)


def test_models_are_listed_and_retrieved(sdk):
    (listed,) = sdk.models.list().data
    assert listed.id.startswith("fsched-tiny") and sdk.models.retrieve(listed.id).id == listed.id
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-none")


def test_the_tiny_model_streams_what_it_stores_and_its_usage(server):
    """A streamed chat of the built-in tiny model: the text equals the stored output, the usage chunk the
    stored token counts."""
    key = server.key("tiny", "realtime")
    sdk = openai.OpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=120)
    chunks = list(sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}], max_tokens=16, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    # The stream can end before the daemon has written the request's row (one run read it with no text
    # yet): the row is compared once it is done.
    row = "SELECT r.state, r.output_text, r.num_output_tokens, r.prompt_tokens FROM requests r JOIN jobs j " \
          "ON j.id = r.job_id WHERE j.tenant = 'tiny'"
    deadline = time.time() + 30
    while server.rows(row)[0][0] != "done" and time.time() < deadline:
        time.sleep(0.05)
    ((state, stored, tokens, prompt_tokens),) = server.rows(row)
    assert state == "done" and text == stored and text.strip()
    assert (chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens) == (tokens, prompt_tokens)
    assert prompt_tokens > 0


def test_completions_with_two_choices_logprobs_and_penalties(sdk):
    asked = dict(model="m", prompt="Once upon a time", max_tokens=5, n=2, logprobs=3, presence_penalty=0.5,
                 frequency_penalty=0.5, seed=7, logit_bias={"5": -100})
    done = sdk.completions.create(**asked)
    assert [c.index for c in done.choices] == [0, 1] and done.choices[0].text != done.choices[1].text
    for choice in done.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
        assert "".join(lp.tokens) == choice.text and lp.text_offset[0] == 0
        assert all(len(top) >= 3 and max(top.values()) <= 0 for top in lp.top_logprobs)
    assert done.usage.completion_tokens == 10 and done.usage.prompt_tokens == 6
    again = sdk.completions.create(**asked)
    assert [c.text for c in again.choices] == [c.text for c in done.choices]  # seeded: it replays
    echoed = sdk.completions.create(model="m", prompt=["One", "Two"], max_tokens=3, echo=True, temperature=0)
    assert [c.text[:3] for c in echoed.choices] == ["One", "Two"]


def test_chat_logprobs_n_stop_and_vllm_fields(sdk):
    chat = sdk.chat.completions.create(
        model="m", messages=CHAT, max_completion_tokens=6, n=2, logprobs=True, top_logprobs=2, seed=3,
        extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 6,
                    "ignore_eos": True, "return_token_ids": True},
    )
    assert [c.index for c in chat.choices] == [0, 1] and chat.usage.completion_tokens == 12
    for choice in chat.choices:
        content = choice.logprobs.content
        assert len(content) == 6 and all(len(t.top_logprobs) == 2 for t in content)
        assert "".join(t.token for t in content) == choice.message.content
        assert len(choice.model_extra["token_ids"]) == 6
    tokenized = httpx.post(f"{sdk.base_url}".removesuffix("/v1/") + "/tokenize", json={"messages": CHAT},
                           headers={"Authorization": f"Bearer {sdk.api_key}"}, timeout=120).json()
    assert chat.model_extra["prompt_token_ids"] == tokenized["tokens"]
    assert chat.usage.prompt_tokens == tokenized["count"]
    first = sdk.chat.completions.create(model="m", messages=CHAT, max_tokens=12, temperature=0)
    stop = first.choices[0].message.content.split()[1]
    cut = sdk.chat.completions.create(model="m", messages=CHAT, max_tokens=12, temperature=0, stop=[stop])
    assert stop not in cut.choices[0].message.content and cut.choices[0].finish_reason == "stop"


def test_a_streamed_chat_of_two_choices_interleaves_them_and_sums_the_usage(sdk):
    chunks = list(sdk.chat.completions.create(model="m", messages=CHAT, max_tokens=8, n=2, stream=True,
                                              stream_options={"include_usage": True}, logprobs=True,
                                              extra_body={"ignore_eos": True}))
    texts, logprobs, finished = {0: "", 1: ""}, {0: 0, 1: 0}, {}
    for ch in chunks[:-1]:
        (choice,) = ch.choices
        texts[choice.index] += choice.delta.content or ""
        logprobs[choice.index] += len(choice.logprobs.content) if choice.logprobs else 0
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
    assert finished == {0: "length", 1: "length"} and logprobs == {0: 8, 1: 8}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    indexes = [ch.choices[0].index for ch in chunks[:-1]]
    assert indexes[:2] == [0, 1] and set(indexes[2:]) == {0, 1}  # both roles first, then both choices
    assert all(texts.values())


def test_the_responses_api_whole_and_streamed(sdk):
    # Greedy: the random tiny model, sampled, can draw its end token within a few tokens.
    done = sdk.responses.create(model="m", input="Say hello", instructions="Be brief.", max_output_tokens=5,
                                temperature=0)
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert done.output_text and done.usage.output_tokens == 5 and done.usage.input_tokens > 5
    events = list(sdk.responses.create(model="m", input=[{"role": "user", "content": "Hi"}],
                                       max_output_tokens=4, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.incomplete" and "response.output_text.delta" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_tokenize_and_detokenize_round_trip(server, key):
    auth = {"Authorization": f"Bearer {key}"}
    tokens = httpx.post(f"{server.url}/tokenize", headers=auth, timeout=120,
                        json={"prompt": "Once upon a time", "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) == 6
    assert "".join(tokens["token_strs"]) == "Once upon a time"
    text = httpx.post(f"{server.url}/detokenize", headers=auth, json={"tokens": tokens["tokens"]}).json()
    assert text == {"prompt": "Once upon a time"}
    refused = httpx.post(f"{server.url}/tokenize", headers=auth, json={"prompt": "x", "chat_template": "t"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


def test_structured_output_parses_with_the_sdk(sdk):
    for seed in range(3):
        parsed = sdk.chat.completions.parse(model="m", messages=CHAT, response_format=Person, max_tokens=60,
                                            seed=seed)
        assert isinstance(parsed.choices[0].message.parsed, Person)


def test_the_async_sdk_streams_and_answers(server, key):
    async def main():
        client = openai.AsyncOpenAI(api_key=key, base_url=f"{server.url}/v1", max_retries=0, timeout=120)
        stream = await client.completions.create(model="m", prompt="A", max_tokens=4, stream=True,
                                                 extra_body={"ignore_eos": True})
        pieces = [c.choices[0].text async for c in stream if c.choices]
        chat, response = await asyncio.gather(
            client.chat.completions.create(model="m", messages=CHAT, max_tokens=3, n=2),
            client.responses.create(model="m", input="x", max_output_tokens=3, temperature=0))
        events = [e.type async for e in await client.responses.create(model="m", input="y",
                                                                       max_output_tokens=2, temperature=0,
                                                                       stream=True)]
        await client.close()
        return pieces, chat, response, events

    pieces, chat, response, events = asyncio.run(main())
    assert len("".join(pieces)) > 0 and len(chat.choices) == 2 and response.usage.output_tokens == 3
    assert events[0] == "response.created" and events[-1] == "response.incomplete"


def test_every_field_at_its_neutral_value_in_one_request(sdk):
    """Every field the table names, at a neutral value, all at once: the request runs."""
    for endpoint, base in (("chat", {"messages": CHAT}), ("completions", {"prompt": "p"})):
        body = {**base, "max_tokens": 2}
        for f in FIELDS:
            if any(e.name.lower() == endpoint for e in f.endpoints) and f.name not in body and f.neutral:
                body[f.name] = f.neutral[0]
        body["stream"] = False
        answer = httpx.post(f"{sdk.base_url}{endpoint}".replace("/chat", "/chat/completions"), json=body,
                            headers={"Authorization": f"Bearer {sdk.api_key}"}, timeout=120)
        assert answer.status_code == 200, answer.text
        refused = [f for f in FIELDS if f.support is Support.REFUSED]
        assert refused  # and each one is named when given (tests/unit/test_fields.py walks them all)


def test_langchain_chat_model(server, key):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_tokens=6, max_retries=0,
                     presence_penalty=0.3, frequency_penalty=0.3, logprobs=True, top_logprobs=2,
                     stop=["zzz"], seed=1)
    answer = llm.invoke("Hello there")
    assert answer.content and len(answer.response_metadata["logprobs"]["content"]) >= 1
    two = ChatOpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_tokens=4, n=2, max_retries=0)
    (generations,) = two.generate([[HumanMessage("Hi")]]).generations
    assert len(generations) == 2
    streamed = "".join(c.content for c in llm.stream("Go on"))
    assert streamed
    structured = ChatOpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_tokens=60,
                            max_retries=0).with_structured_output(Person)
    assert isinstance(structured.invoke("Describe a person"), Person)


def test_langchain_completions_model(server, key):
    from langchain_openai import OpenAI

    llm = OpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_tokens=5, max_retries=0,
                 logprobs=2, n=2, best_of=2, frequency_penalty=0.2, presence_penalty=0.2,
                 seed=1)  # seeded: the random tiny model, sampled, can draw its end token first
    result = llm.generate(["Once upon a time"], stop=["zzz"])
    (choices,) = result.generations
    assert len(choices) == 2 and all(c.generation_info["logprobs"]["tokens"] for c in choices)
    assert llm.invoke("The end") is not None
    assert json.dumps(result.llm_output["token_usage"])


def test_a_batch_of_choices_logprobs_and_schemas_through_the_sdk(sdk):
    closed = {**Person.model_json_schema(), "additionalProperties": False}  # as the SDK's strict schemas
    schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": closed}}
    bodies = [
        {"model": "m", "messages": CHAT, "max_tokens": 60, "response_format": schema, "seed": 1},
        {"model": "m", "messages": CHAT, "max_tokens": 3, "n": 2, "logprobs": True, "top_logprobs": 1,
         "ignore_eos": True},  # counted below: the random tiny model, sampled, can draw its end token
    ]
    batch, out = run_sdk_batch(sdk, bodies)
    assert batch.status == "completed" and batch.request_counts.failed == 0
    assert [x["custom_id"] for x in out] == ["c0", "c1"]
    structured, two = (x["response"]["body"] for x in out)
    Person.model_validate_json(structured["choices"][0]["message"]["content"])
    assert [c["index"] for c in two["choices"]] == [0, 1] and two["usage"]["completion_tokens"] == 6
    assert all(len(c["logprobs"]["content"]) == 3 for c in two["choices"])

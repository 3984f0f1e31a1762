"""Agent frameworks calling tools, unchanged, against `fsched serve` and a tiny-model daemon, on the
built-in engine and in front of a remote one (`fsched daemon --engine URL` over the stand-in engine
of tests/support/fake_engine.py, with the tiny model's tokenizer).

The tiny model has random weights and never decides to call a tool by itself, so what runs on both
engines is what the grammar guarantees: pydantic-ai's `output_type` (a required call), LangChain's
`with_structured_output(method="function_calling")` (a named call, as instructor's Mode.TOOLS sends
it), `bind_tools(tool_choice="required")` and an openai-agents Agent held to its `@function_tool`
(chat completions and Responses), instructor's Mode.TOOLS (whole and streamed as partials) and
Mode.JSON_SCHEMA, each parsed into the framework's own objects. The
tools are strict: a random model given a schema open to extra properties may write one without end.
In front of the remote engine, whose answers can be scripted, `auto` runs too: the openai SDK's and
openai-agents' two-turn loops (the call, its output fed back, the final answer); in process, with a
scripted runner, they run in tests/unit/test_agent_loop.py. One server and one daemon serve each
engine's tests; the schemas are bounded so answers stay short.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True, scope="module")
def no_traces():
    """openai-agents would post its traces to OpenAI."""
    from agents import set_tracing_disabled

    set_tracing_disabled(True)

ANSWER = "It is 21 C and sunny in Paris."
CALL_TEXT = ('<think>I should look it up.</think>Let me check.\n<tool_call>\n'
             '{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=10)
    country: str = Field(max_length=10)
    population: int = Field(ge=0, le=1000)


def scripted_weather(tokenizer: str):
    """The remote engine's script: call `weather` for Paris; once a tool answered, say what it said.
    (The tiny model's template writes each message as `role: content`, tools not at all.)"""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)

    def script(prompt: list[int]) -> list[int]:
        turns = tok.decode(prompt, skip_special_tokens=True).split("\n")
        text = f"<think>The tool said so.</think>{ANSWER}" if turns[-2].startswith("tool:") else CALL_TEXT
        return tok.encode(text, add_special_tokens=False)

    return script


@pytest.fixture(scope="module", params=["builtin", "remote"])
def server(request, tmp_path_factory, model_cache) -> Server:
    from fsched.core.runners.hf.model import ensure_tiny_model
    from tests.support.fake_engine import FakeEngine

    s = make_server(tmp_path_factory.mktemp("agents"), model_cache)
    s.engine = None
    if request.param == "remote":
        tokenizer = str(ensure_tiny_model(Path(model_cache) / "fsched"))
        s.engine = FakeEngine(step_s=0.002, vocab=2000, eos=2, tokenizer=tokenizer, context=2048,
                              script=scripted_weather(tokenizer))
    s.cli("limits", "show")
    s.start_daemon(*(("--engine", s.engine.url) if s.engine else ()))
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()
    if s.engine:
        s.engine.stop()


@pytest.fixture(scope="module")
def key(server) -> str:
    return server.key("agents", "realtime")


def test_pydantic_ai_output_type(server, key):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{server.url}/v1", api_key=key)
    agent = Agent(OpenAIChatModel("m", provider=provider), output_type=City, retries=0)
    result = agent.run_sync("Name a city.", model_settings={"max_tokens": 120, "temperature": 0.7})
    assert isinstance(result.output, City)


def test_langchain_named_call_and_required_bind_tools(server, key):
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_retries=0, max_tokens=120,
                       temperature=0.7, seed=7)
    city = model.with_structured_output(City, method="function_calling", strict=True).invoke("Name a city.")
    assert isinstance(city, City)
    message = model.bind_tools([City], tool_choice="required", strict=True).invoke("Name a city.")
    # required, with parallel calls allowed (the default): one call or several, each to City, each valid
    assert message.tool_calls
    assert all(call["name"] == "City" and City(**call["args"]) for call in message.tool_calls)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_required_function_tool(server, key, api):
    """An Agent held to one tool call (`tool_choice="required"`), stopping at the tool's output. (With
    parallel calls, the default, a random model may go on writing calls past max_tokens.)"""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
    )
    from openai import AsyncOpenAI

    asked = []

    @function_tool
    def weather(city: Annotated[str, Field(max_length=10)]) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    model = OpenAIChatCompletionsModel("m", client) if api == "chat" else OpenAIResponsesModel("m", client)
    settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=120,
                             temperature=0.7)
    agent = Agent(name="w", tools=[weather], model=model, tool_use_behavior="stop_on_first_tool",
                  model_settings=settings)
    result = Runner.run_sync(agent, "Weather?")
    assert result.final_output == "21 C, sunny" and asked and all(len(city) <= 10 for city in asked)


class Town(BaseModel):
    """A town: closed to other properties (instructor's Mode.TOOLS sends no `strict`, so the schema
    itself keeps a random model from writing extra ones)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=10)
    population: int = Field(ge=0, le=1000)


def test_instructor_tools_whole_and_partial(server, key):
    """instructor's default mode (Mode.TOOLS: a named tool_choice), whole and streamed as partials."""
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0))
    ask = {"model": "m", "messages": [{"role": "user", "content": "Name a town."}], "max_tokens": 120,
           "temperature": 0.7}
    assert isinstance(client.chat.completions.create(response_model=Town, **ask), Town)
    partials = list(client.chat.completions.create_partial(response_model=Town, **ask))
    assert partials and Town.model_validate(partials[-1].model_dump())


def test_instructor_json_schema_mode(server, key):
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0),
                                    mode=instructor.Mode.JSON_SCHEMA)
    town = client.chat.completions.create(
        model="m", response_model=Town, messages=[{"role": "user", "content": "Name a town."}],
        max_tokens=120, temperature=0.7)
    assert isinstance(town, Town)


# The tiny model never decides to call a tool: `auto` runs in front of the scripted remote engine.
REMOTE = pytest.mark.parametrize("server", ["remote"], indirect=True)


@REMOTE
def test_openai_sdk_tool_loop_whole_and_streamed(server, key):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "weather in Paris?"}]
    whole = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Paris"})
    assert choice.message.model_extra["reasoning_content"] == "I should look it up."

    content, calls, reasons = "", {}, []
    for chunk in client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or ():
            entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "Let me check." and reasons[-1] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [("weather", call.function.arguments)]

    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]
    final = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert final.choices[0].message.content == ANSWER and final.choices[0].finish_reason == "stop"


@REMOTE
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_function_tool_loop(server, key, api):
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from openai import AsyncOpenAI

    asked = []

    @function_tool
    def weather(city: str) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    model = OpenAIChatCompletionsModel("m", client) if api == "chat" else OpenAIResponsesModel("m", client)
    result = Runner.run_sync(Agent(name="w", tools=[weather], model=model), "weather in Paris?")
    assert asked == ["Paris"] and result.final_output == ANSWER


@REMOTE
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # langgraph 1.x: create_react_agent moves
def test_langchain_bind_tools_auto_and_langgraph_react_agent(server, key):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    model = ChatOpenAI(model="m", api_key=key, base_url=f"{server.url}/v1", max_retries=0)
    message = model.bind_tools([WEATHER], tool_choice="auto").invoke("weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("weather", {"city": "Paris"})]

    asked = []

    @tool
    def weather(city: str) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    state = create_react_agent(model, [weather]).invoke({"messages": [("user", "weather in Paris?")]})
    assert asked == ["Paris"] and state["messages"][-1].content == ANSWER


@REMOTE
def test_pydantic_ai_tool_loop(server, key):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{server.url}/v1", api_key=key)
    agent = Agent(OpenAIChatModel("m", provider=provider))
    asked = []

    @agent.tool_plain
    def weather(city: str) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    result = agent.run_sync("weather in Paris?")
    assert asked == ["Paris"] and result.output == ANSWER

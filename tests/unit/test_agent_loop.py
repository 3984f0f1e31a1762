"""Tool calls end to end through the HTTP app: a scripted model that decides to call a tool, the
openai SDK, openai-agents, LangChain, LangGraph and pydantic-ai unchanged, non-streamed and
streamed, over a two-turn agent loop.

In process (tests/support/inprocess.py): the real app and daemon loop over an in-memory table, the
scripted runner (tests/support/scripted.py) writing what each turn calls for.
"""

from __future__ import annotations

import json

import pytest

from tests.support.inprocess import served
from tests.support.scripted import ScriptedRunner

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ANSWER = "It is 21 C and sunny in Paris."


def reply(messages: list[dict], render: dict | None, forced: bool) -> str:
    """Think, then call the first tool; once a tool answered, say what it said."""
    if messages and messages[-1]["role"] == "tool":
        return f"<think>The tool said {messages[-1]['content']}.</think>{ANSWER}"
    tools = (render or {}).get("tools") or []
    if not tools:
        return "I have no tools."
    call = {"name": tools[0]["function"]["name"], "arguments": _arguments(tools[0]["function"])}
    if forced:
        return json.dumps([call])
    return f"<think>I should look it up.</think>Let me check.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _arguments(function: dict) -> dict:
    props = (function.get("parameters") or {}).get("properties", {})
    return {name: "Paris" if spec.get("type") == "string" else 1 for name, spec in props.items()}


@pytest.fixture
def anyio_backend():
    return "asyncio"


RUNNERS: list[ScriptedRunner] = []


@pytest.fixture
async def rig():
    RUNNERS.append(ScriptedRunner(reply))
    async with served(runner=RUNNERS[-1]) as made:
        yield made


async def test_a_call_whole_and_streamed_and_the_loop_closed(rig):
    client = rig.server.openai(rig.key("agent"))
    messages = [{"role": "user", "content": "weather in Paris?"}]
    whole = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Paris"})
    assert choice.message.model_extra["reasoning_content"] == "I should look it up."

    stream = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], stream=True)
    content, reasoning, calls, reasons = "", "", {}, []
    async for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for d in delta.tool_calls or ():
            entry = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "Let me check." and reasoning == "I should look it up."
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [("weather", call.function.arguments)]
    assert calls[0]["id"].startswith("call_") and reasons[-1] == "tool_calls"

    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}]
    final = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert final.choices[0].message.content == ANSWER and final.choices[0].finish_reason == "stop"
    history, render = RUNNERS[-1].rendered[-1]  # what the last turn's template was given
    assert render["tools"] == [WEATHER] and [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[1]["tool_calls"][0]["function"]["arguments"] == call.function.arguments
    assert history[2]["tool_call_id"] == call.id
    assert history[1]["reasoning_content"] == "I should look it up."  # given back, as frameworks do


async def test_required_is_read_as_the_grammars_array_and_none_reads_nothing(rig):
    client = rig.server.openai(rig.key("agent"))
    messages = [{"role": "user", "content": "weather?"}]
    forced = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER],
                                                  tool_choice="required")
    (call,) = forced.choices[0].message.tool_calls
    assert forced.choices[0].finish_reason == "tool_calls" and call.function.name == "weather"
    plain = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER],
                                                 tool_choice="none")
    assert plain.choices[0].message.tool_calls is None
    assert "<tool_call>" in plain.choices[0].message.content


async def test_langchain_bind_tools_reads_the_call(rig):
    bound = _chat_model(rig, "lc").bind_tools([WEATHER], tool_choice="auto")
    message = await bound.ainvoke("weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("weather", {"city": "Paris"})]


def _chat_model(rig, tenant: str):
    import httpx
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="m", api_key=rig.key(tenant), base_url="http://127.0.0.1/v1", max_retries=0,
                      http_async_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.server.app)))


async def test_langgraph_react_agent_calls_the_tool_and_answers(rig):
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    asked = []

    @tool
    def weather(city: str) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    agent = create_react_agent(_chat_model(rig, "graph"), [weather])
    state = await agent.ainvoke({"messages": [("user", "weather in Paris?")]})
    assert asked == ["Paris"] and state["messages"][-1].content == ANSWER


async def test_pydantic_ai_output_type_through_a_required_call(rig):
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        name: str
        country: str

    provider = OpenAIProvider(openai_client=rig.server.openai(rig.key("pyd")))
    agent = Agent(OpenAIChatModel("m", provider=provider), output_type=City)
    result = await agent.run("Which city?")
    assert result.output == City(name="Paris", country="Paris")
    (script,) = RUNNERS[-1].scripts.values()
    assert script.startswith("[")  # pydantic-ai asked for a required call: the grammar's form


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}


async def test_responses_function_call_items_whole_and_streamed_and_the_loop_closed(rig):
    client = rig.server.openai(rig.key("resp"))
    first = await client.responses.create(model="m", input="weather in Paris?", tools=[RESPONSES_WEATHER])
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "message", "function_call"]
    call = first.output[2]
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Paris"})
    assert first.output[1].content[0].text == "Let me check."

    events = [e async for e in await client.responses.create(model="m", input="weather in Paris?",
                                                             tools=[RESPONSES_WEATHER], stream=True)]
    assert events[-1].type == "response.completed"
    streamed = events[-1].response.output
    assert [i.type for i in streamed] == kinds and streamed[2].arguments == call.arguments
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments

    history = [{"role": "user", "content": "weather in Paris?"}, *[i.model_dump(exclude_none=True)
                                                                  for i in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}]
    final = await client.responses.create(model="m", input=history, tools=[RESPONSES_WEATHER])
    assert final.output_text == ANSWER
    rendered, _ = RUNNERS[-1].rendered[-1]
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool"]


async def test_an_operator_named_family_reads_its_syntax_only():
    async with served(runner=ScriptedRunner(reply), tool_parser="mistral") as rig:
        client = rig.server.openai(rig.key("ops"))
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}],
                                                      tools=[WEATHER])
    message = answer.choices[0].message
    assert message.tool_calls is None and "<tool_call>" in message.content
    assert answer.choices[0].finish_reason == "stop"


def _agents_weather(asked: list[str]):
    from agents import function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export: the SDK would post traces to OpenAI

    @function_tool
    def weather(city: str) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    return weather


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_function_tool_loop(rig, api, streamed):
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner

    client = rig.server.openai(rig.key("oa"))
    model = OpenAIChatCompletionsModel("m", client) if api == "chat" else OpenAIResponsesModel("m", client)
    asked: list[str] = []
    agent = Agent(name="w", instructions="Answer.", tools=[_agents_weather(asked)], model=model)
    if streamed:
        result = Runner.run_streamed(agent, "weather in Paris?")
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, "weather in Paris?")
    assert asked == ["Paris"] and result.final_output == ANSWER
    history, render = RUNNERS[-1].rendered[-1]  # the second turn: the call and its output fed back
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool"]
    assert history[2]["tool_calls"][0]["function"]["name"] == "weather"
    assert history[3]["content"] == "21 C, sunny"
    assert render["tools"][0]["function"]["strict"] is True  # the SDK's strict schema reached the template

"""Agent frameworks calling tools, unchanged, against `fsched serve` and a tiny-model daemon.

The tiny model has random weights and never decides to call a tool by itself, so what runs here is
what the grammar guarantees: pydantic-ai's `output_type` (a required call), LangChain's
`with_structured_output(method="function_calling")` (a named call, as instructor's Mode.TOOLS sends
it), `bind_tools(tool_choice="required")` and an openai-agents Agent held to its `@function_tool`
(chat completions and Responses), each parsed into the framework's own objects. The
tools are strict: a random model given a schema open to extra properties may write one without end.
`auto` and the agent loop run with a scripted model in tests/unit/test_agent_loop.py. One server and
one daemon serve the module; the schemas are bounded so answers stay short.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from .http_server import Server, make_server

pytestmark = pytest.mark.timeout(300)


class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=10)
    country: str = Field(max_length=10)
    population: int = Field(ge=0, le=1000)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_cache) -> Server:
    s = make_server(tmp_path_factory.mktemp("agents"), model_cache)
    s.cli("limits", "show")
    s.start_daemon()
    s.start_server()
    s.wait_ready()
    yield s
    s.stop()


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
    """An Agent held to a tool call (`tool_choice="required"`), stopping at the tool's output."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export: the SDK would post traces to OpenAI
    asked = []

    @function_tool
    def weather(city: Annotated[str, Field(max_length=10)]) -> str:
        """The forecast for a city."""
        asked.append(city)
        return "21 C, sunny"

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    model = OpenAIChatCompletionsModel("m", client) if api == "chat" else OpenAIResponsesModel("m", client)
    agent = Agent(name="w", tools=[weather], model=model, tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0.7))
    result = Runner.run_sync(agent, "Weather?")
    assert result.final_output == "21 C, sunny" and asked and all(len(city) <= 10 for city in asked)

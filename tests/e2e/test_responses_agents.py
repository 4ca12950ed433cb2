"""The openai-agents SDK against the gateway's Responses endpoint, on every backend type.

An ``Agent`` with one ``@function_tool``, its model ``OpenAIResponsesModel`` over an ``AsyncOpenAI``
pointed at the gateway, runs a task that needs the tool: the backend's model calls it (the
simulated servers of ``tests.e2e.model_upstreams`` call the tool the message names, with the JSON
it carries), the SDK runs it and sends the output back, and the run ends with the model's answer,
which on the simulated servers quotes the tool's output (so the output reached the model).
Streamed runs too. Ollama refuses a strict tool by name (it holds no call to a schema); the same
agent with a non-strict tool works there.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.e2e.model_upstreams import KINDS, model_of

agents = pytest.importorskip("agents")

pytestmark = pytest.mark.asyncio(loop_scope="module")
agents.set_tracing_disabled(True)  # the SDK would export its traces to OpenAI

ASK = 'Call get_weather with {"city": "Paris"}'
CALLED: list[str] = []


def _weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    CALLED.append(city)
    return f"21 degrees in {city}"


strict_tool = agents.function_tool(_weather, name_override="get_weather")
loose_tool = agents.function_tool(_weather, name_override="get_weather", strict_mode=False)


def agent_for(kind: str, client: openai.AsyncOpenAI, tool: Any) -> Any:
    model = agents.OpenAIResponsesModel(model=model_of(kind), openai_client=client)
    return agents.Agent(name="weather", instructions="Answer with the tool's result.", tools=[tool], model=model)


def tool_for(kind: str) -> Any:
    return loose_tool if kind == "ollama" else strict_tool


def check_run(result: Any, kind: str) -> None:
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert [item.output for item in outputs] == ["21 degrees in Paris"]
    assert CALLED[-1] == "Paris"
    assert isinstance(result.final_output, str) and result.final_output
    if kind not in ("openai", "mock"):  # the simulated servers quote the result they read
        assert result.final_output == "Tool said: 21 degrees in Paris"


@pytest.mark.parametrize("kind", KINDS)
async def test_an_agent_run_that_needs_its_tool(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    CALLED.clear()
    result = await agents.Runner.run(agent_for(kind, resp_client, tool_for(kind)), ASK, max_turns=4)
    check_run(result, kind)
    assert len(result.raw_responses) == 2  # the call, then the answer to its output


@pytest.mark.parametrize("kind", KINDS)
async def test_a_streamed_agent_run(resp_client: openai.AsyncOpenAI, kind: str) -> None:
    CALLED.clear()
    result = agents.Runner.run_streamed(agent_for(kind, resp_client, tool_for(kind)), ASK, max_turns=4)
    kinds = [event.type async for event in result.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    check_run(result, kind)


async def test_a_strict_tool_is_refused_by_name_on_ollama(resp_client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await agents.Runner.run(agent_for("ollama", resp_client, strict_tool), ASK, max_turns=4)
    body: Any = err.value.body
    assert body["code"] == "unsupported_parameter" and body["param"] == "tools"

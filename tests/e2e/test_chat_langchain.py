"""LangChain's ``ChatOpenAI`` against the gateway's chat endpoint (mock backend): invoke, stream,
``bind_tools`` and ``with_structured_output`` work unchanged."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from tests.conftest import MOCK_MODEL, RunningGateway

langchain_openai = pytest.importorskip("langchain_openai")


def chat_model(gateway: RunningGateway) -> object:
    return langchain_openai.ChatOpenAI(
        model=MOCK_MODEL, base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20, max_tokens=20
    )


class Weather(BaseModel):
    """The weather in a city."""

    city: str
    celsius: float


async def test_invoke_and_stream(gateway: RunningGateway) -> None:
    llm = chat_model(gateway)
    reply = await llm.ainvoke("Say hello")  # type: ignore[attr-defined]
    assert isinstance(reply.content, str) and reply.content
    assert reply.usage_metadata["total_tokens"] > 0
    parts = [chunk async for chunk in llm.astream("Say hello")]  # type: ignore[attr-defined]
    assert "".join(str(p.content) for p in parts)


async def test_bind_tools_and_structured_output(gateway: RunningGateway) -> None:
    llm = chat_model(gateway)
    with_tools = llm.bind_tools([Weather], tool_choice="required")  # type: ignore[attr-defined]
    reply = await with_tools.ainvoke("Weather in Oslo?")
    assert [call["name"] for call in reply.tool_calls] == ["Weather"]
    Weather.model_validate(reply.tool_calls[0]["args"])
    structured = llm.with_structured_output(Weather, method="json_schema")  # type: ignore[attr-defined]
    result = await structured.ainvoke("Weather in Oslo as JSON")
    assert isinstance(result, Weather)
    # and the sync client, from a worker thread
    sync = await asyncio.to_thread(llm.invoke, "hi")  # type: ignore[attr-defined]
    assert sync.content

"""Integers beyond 64 bits in a native server's tool call arguments reach the client as sent.

TGI 2.x and Ollama send ``arguments`` as a JSON object, which the gateway writes out as
OpenAI's JSON text; orjson reads integers outside [-2**63, 2**64) as floats, so an id
like 2**64 used to reach the client as ``1.8446744073709552e+19``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest
import respx

from tests.backends.native.chat_helpers import LOOSE_WEATHER, WEATHER, chat_call, chat_route, reassemble
from tests.backends.native.helpers import drain, fixture, make_backend, stream_response

ARGS = b'{"city":"Paris","account":18446744073709551616,"floor":-9223372036854775809}'


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def answer(kind: str, name: str) -> bytes:
    body = fixture(f"{kind}/{name}")
    return body.replace(b'{"city":"Paris"}', ARGS, 1)


@pytest.mark.parametrize(
    ("kind", "name", "tool"), [("tgi", "chat_tool.json", WEATHER), ("ollama", "chat_tools.json", LOOSE_WEATHER)]
)
async def test_answer_keeps_big_integers_in_tool_arguments(
    mock: respx.MockRouter, kind: str, name: str, tool: object
) -> None:
    chat_route(mock, kind).mock(return_value=httpx.Response(200, content=answer(kind, name)))
    result = await make_backend(kind).chat(chat_call(kind, tools=[tool]))
    (first, *_) = orjson.loads(result.body)["choices"][0]["message"]["tool_calls"]
    assert first["function"]["arguments"].encode() == ARGS


async def test_ollama_stream_keeps_big_integers_in_tool_arguments(mock: respx.MockRouter) -> None:
    body = answer("ollama", "chat_tools_stream.ndjson")
    chat_route(mock, "ollama").mock(return_value=stream_response(body, "application/x-ndjson"))
    events = await drain(
        await make_backend("ollama").chat_stream(chat_call("ollama", tools=[LOOSE_WEATHER], stream=True))
    )
    assert reassemble(events)[0]["calls"][0]["arguments"].encode() == ARGS

"""The chat relay in the bridge's service (``BridgeChatCall``): the upstream's events once, vouched.

A Responses stream on an OpenAI-wire family reads the upstream's chat events as the relay vouched
them for a client (whole events, every choice finished, an error event raised, the usage chunk
last) without the client's rewrite (model name, ``"usage": null``, vLLM's null keys and reasoning
name). What the bridge builds from them is what it built from the client's rewrite.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from backends.base import BridgeChatCall, ChatCall, ResponsesCall
from backends.errors import UpstreamError
from backends.openai.chat import ChatStreamRelay
from backends.openai.relay import OpenAIStreamRelay
from backends.openai.wire import OpenAIWire
from backends.responses.bridge import chat_call_of
from backends.responses.events import ChatResponseEvents
from backends.vllm.stream import VLLMChatStreamRelay
from schemas.responses import ResponsesRequest
from tests.backends.openai.test_openai_relay import FakeResponse
from tests.backends.responses.test_bridge_text_shape import parse

GOLDEN = Path(__file__).parents[2] / "fixtures" / "chat" / "vllm" / "0.32.0" / "stream_vllm_keys.json"
WIRE: Any = SimpleNamespace(backend="b", max_event=1 << 20)  # what OpenAIWire.relay reads of its wire


def upstream_events() -> list[bytes]:
    """vLLM 0.32's chat stream (null keys, a stop_reason, a usage chunk), 40 more tokens, reasoning."""
    events = [e.encode() + b"\n\n" for e in json.loads(GOLDEN.read_text())["events"]]
    thought = orjson.loads(events[1][6:])
    thought["choices"][0]["delta"] = {"reasoning": "hmm"}
    return [events[0], b"data: " + orjson.dumps(thought) + b"\n\n", *[events[1]] * 40, *events[1:]]


def calls(kind: type[ChatCall]) -> tuple[ChatCall, ResponsesCall]:
    request = ResponsesRequest.model_validate({"model": "pub", "input": "x", "stream": True})
    responses = ResponsesCall(request, "org/tiny", "pub", "r")
    chat, _ = chat_call_of(responses)
    return kind(chat.request, chat.upstream_model, chat.public_model, chat.request_id), responses


async def relayed(relay_type: type[OpenAIStreamRelay], kind: type[ChatCall], reads: list[bytes]) -> bytes:
    return (await relayed_with_usage(relay_type, kind, reads))[0]


async def relayed_with_usage(
    relay_type: type[OpenAIStreamRelay], kind: type[ChatCall], reads: list[bytes]
) -> tuple[bytes, Any]:
    relay = OpenAIWire.relay(WIRE, relay_type, FakeResponse(reads), calls(kind)[0])
    out = b"".join([piece async for piece in relay])
    await relay.aclose()
    return out, relay.usage_fields


async def responses_events(
    relay_type: type[OpenAIStreamRelay], kind: type[ChatCall], reads: list[bytes], frame: Any = None
) -> bytes:
    chat, responses = calls(kind)
    frame = frame or chat_call_of(responses)[1]
    relay = OpenAIWire.relay(WIRE, relay_type, FakeResponse(reads), chat)
    return b"".join([piece async for piece in ChatResponseEvents(relay, frame, "b")])


@pytest.mark.parametrize("one_read", [True, False])
async def test_the_bridge_gets_the_upstreams_events_as_sent(one_read: bool) -> None:
    events = upstream_events()
    reads = [b"".join(events)] if one_read else events
    bridged, usage = await relayed_with_usage(VLLMChatStreamRelay, BridgeChatCall, reads)
    assert bridged == b"".join(events[:-2])  # all but the usage chunk and [DONE]
    assert usage == orjson.loads(events[-2][6:])["usage"]  # the usage chunk's object, handed over as read
    client, client_usage = await relayed_with_usage(VLLMChatStreamRelay, ChatCall, reads)
    last = client[client.rfind(b"data: ", 0, -2) :]
    assert client_usage is None and orjson.loads(last[6:])["usage"] == usage  # the client's last event
    assert b'"model":"pub"' in client and b"token_ids" not in client and b'"reasoning_content"' in client


@pytest.mark.parametrize("relay_type", [VLLMChatStreamRelay, ChatStreamRelay])
@pytest.mark.parametrize("one_read", [True, False])
async def test_the_responses_events_are_those_built_from_the_clients_stream(
    relay_type: type[OpenAIStreamRelay], one_read: bool
) -> None:
    events = upstream_events()
    reads = [b"".join(events)] if one_read else events
    frame = chat_call_of(calls(BridgeChatCall)[1])[1]  # one Response id and time for both
    bridged = parse(await responses_events(relay_type, BridgeChatCall, reads, frame))
    assert bridged == parse(await responses_events(relay_type, ChatCall, reads, frame))
    final = bridged[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 3
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["content"][0]["text"] == "Sunny" + "Sunny" * 40 + " and warm"


@pytest.mark.parametrize("relay_type", [VLLMChatStreamRelay, ChatStreamRelay])
async def test_the_usage_details_reach_the_bridged_response(relay_type: type[OpenAIStreamRelay]) -> None:
    """Cached and reasoning tokens: read from the object the relay hands over, as from the client's chunk."""
    events = upstream_events()
    chunk = orjson.loads(events[-2][6:])
    chunk["usage"]["prompt_tokens_details"] = {"cached_tokens": 5}
    chunk["usage"]["completion_tokens_details"] = {"reasoning_tokens": 2}
    events[-2] = b"data: " + orjson.dumps(chunk) + b"\n\n"
    frame = chat_call_of(calls(BridgeChatCall)[1])[1]
    bridged = await responses_events(relay_type, BridgeChatCall, events, frame)
    assert parse(bridged) == parse(await responses_events(relay_type, ChatCall, events, frame))  # but the ids
    usage = parse(bridged)[-1]["response"]["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 5}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 2}


def finishing(reason: str) -> list[bytes]:
    events = upstream_events()
    return [*events[:-3], events[-3].replace(b'"finish_reason":"stop"', b'"finish_reason":"%s"' % reason.encode())]


async def test_vllms_own_finish_reasons_still_end_a_bridged_stream_right() -> None:
    """``repetition`` is a stop; ``abort`` is a failure (the bridge ends with response.failed)."""
    events = finishing("repetition") + upstream_events()[-2:]
    final = parse(await responses_events(VLLMChatStreamRelay, BridgeChatCall, events))[-1]
    assert final["type"] == "response.completed"
    with pytest.raises(UpstreamError):
        await responses_events(VLLMChatStreamRelay, BridgeChatCall, finishing("abort") + upstream_events()[-2:])

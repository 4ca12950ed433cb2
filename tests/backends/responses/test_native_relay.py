"""The relay of an upstream's own ``/v1/responses`` (backends/responses/native.py): what reaches the client
is the upstream's events with only the model renamed, however the reads are cut, on the byte path and
the parsed one alike; an upstream failure ends the relay with the one ``response.failed`` the gateway
writes, numbered after the last event; a snapshot stands in for the store."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import ResponsesCall, TokenUsage
from backends.errors import UpstreamProtocolError
from backends.responses.native import NativeResponseEvents, native_payload, relay_response_body
from schemas.responses import ResponsesRequest
from tests.backends.openai.test_openai_relay import FakeResponse

UP, PUB = "up-model", "public-model"
CALL = ResponsesCall(ResponsesRequest.model_validate({"model": PUB, "input": "hi"}), UP, PUB, "req-1")


def event(seq: int, kind: str, **fields: Any) -> bytes:
    return (
        b"event: "
        + kind.encode()
        + b"\ndata: "
        + orjson.dumps({"type": kind, "sequence_number": seq, **fields})
        + b"\n\n"
    )


def response(status: str, text: str = "", model: str = UP) -> dict[str, Any]:
    done = status != "in_progress"
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    usage = {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}
    return {"id": "resp_1", "object": "response", "status": status, "model": model,
            "output": [item] if done else [], "usage": usage if done else None}  # fmt: skip


def stream(deltas: list[str], *, model: str = UP) -> list[bytes]:
    at = {"item_id": "msg_1", "output_index": 0}
    events = [event(0, "response.created", response=response("in_progress", model=model)),
              event(1, "response.in_progress", response=response("in_progress", model=model))]  # fmt: skip
    seq = 2
    for piece in deltas:
        events.append(event(seq, "response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[]))
        seq += 1
    final = response("completed", "".join(deltas), model)
    events.append(event(seq, "response.output_item.done", output_index=0, item=final["output"][0]))
    events.append(event(seq + 1, "response.completed", response=final))
    return events


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    reads, at = [], 0
    for size in sizes:
        if at >= len(data):
            break
        reads.append(data[at : at + size])
        at += size
    if at < len(data):
        reads.append(data[at:])
    return reads


async def relay_all(reads: list[bytes | BaseException]) -> tuple[list[dict[str, Any]], NativeResponseEvents]:
    relay = NativeResponseEvents(FakeResponse(reads), CALL, "up")  # type: ignore[arg-type]
    out = b""
    try:
        async for piece in relay:
            assert piece
            out += piece
    finally:
        await relay.aclose()
    parsed = []
    for raw in out.split(b"\n\n"):
        if raw:
            kind, data = raw.split(b"\n", 1)
            obj = orjson.loads(data.removeprefix(b"data: "))
            assert kind == b"event: " + obj["type"].encode()
            parsed.append(obj)
    return parsed, relay


def expected(events: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for raw in events:
        obj = orjson.loads(raw.split(b"data: ", 1)[1])
        if isinstance(obj.get("response"), dict):
            obj["response"]["model"] = PUB
        out.append(obj)
    return out


# Text with what a byte path could trip on: quotes, escapes, the markers themselves inside text.
TEXT = st.lists(st.sampled_from([*'ab "\\\n{}:,', '"response":', '"error"', "é", "🙂"]), max_size=8).map("".join)


@settings(max_examples=150, deadline=None)
@given(deltas=st.lists(TEXT, max_size=12), sizes=st.lists(st.integers(1, 400), max_size=40),
       upstream=st.sampled_from([UP, "up-model-2026-01-01"]))  # fmt: skip
async def test_any_cut_of_any_stream_relays_the_same_events(deltas: list[str], sizes: list[int], upstream: str) -> None:
    events = stream(deltas, model=upstream)
    parsed, relay = await relay_all(cut(b"".join(events), sizes))  # type: ignore[arg-type]
    assert parsed == expected(events)
    assert relay.usage == TokenUsage(3, 5)
    assert relay.final is not None and relay.final["model"] == PUB
    assert relay.snapshot("cancelled") == relay.final


async def test_an_upstream_error_event_ends_in_one_gateway_response_failed() -> None:
    events = [*stream(["a", "b", "c"])[:4], event(4, "error", code="server_error", message="engine died")]
    relay = NativeResponseEvents(FakeResponse(events), CALL, "up")  # type: ignore[arg-type]
    got = b""
    with pytest.raises(UpstreamProtocolError) as err:
        async for piece in relay:
            got += piece
    assert b'"error"' not in got  # the upstream's own error event is not relayed
    tail = orjson.loads(relay.failed_event(err.value).split(b"data: ", 1)[1])
    assert tail["type"] == "response.failed" and tail["sequence_number"] == 4
    assert tail["response"]["model"] == PUB and "engine died" in tail["response"]["error"]["message"]


async def test_a_stream_cut_before_its_last_event_is_an_error_not_an_end() -> None:
    with pytest.raises(UpstreamProtocolError):
        await relay_all(stream(["a", "b"])[:3])


async def test_a_client_that_left_is_snapshotted_cancelled_from_the_kept_bytes() -> None:
    events = stream(["a", "b"])
    relay = NativeResponseEvents(FakeResponse([b"".join(events[:3])]), CALL, "up")  # type: ignore[arg-type]
    await relay.__anext__()
    snapshot = relay.snapshot("cancelled")
    assert snapshot is not None and snapshot["status"] == "cancelled" and snapshot["model"] == PUB


def test_non_streamed_body_keeps_the_upstream_bytes_with_the_model_swapped() -> None:
    body = orjson.dumps(response("completed", "hi"))
    result = relay_response_body(body, CALL, "up")
    assert result.body == body.replace(b'"model":"up-model"', b'"model":"public-model"')
    assert result.usage == TokenUsage(3, 5) and result.answer is not None and result.answer["model"] == PUB


def test_the_payload_is_what_the_client_set_with_the_upstream_id() -> None:
    tool = {"type": "function", "name": "f", "parameters": None, "strict": None}
    request = ResponsesRequest.model_validate(
        {"model": PUB, "input": "hi", "tools": [tool, {"type": "web_search"}], "temperature": None, "store": False}
    )
    body = native_payload(ResponsesCall(request, UP, PUB, "r"))
    assert body == {"model": UP, "input": "hi", "tools": [tool, {"type": "web_search"}], "store": False}

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


def expected(events: list[bytes], public: str = PUB) -> list[dict[str, Any]]:
    out = []
    for raw in events:
        obj = orjson.loads(raw.split(b"data: ", 1)[1])
        if isinstance(obj.get("response"), dict):
            obj["response"]["model"] = public
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


def render(obj: dict[str, Any], lines: bool) -> bytes:
    kind = obj["type"].encode()
    return (b"event: " + kind + b"\n" if lines else b"") + b"data: " + orjson.dumps(obj) + b"\n\n"


def relayed(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(raw.split(b"data: ", 1)[1]) for raw in out.split(b"\n\n") if b"data: " in raw]


# A stream in any layout the relay meets: event lines or data lines alone, numbered or not, reasoning
# deltas before the text's, keep-alive comments, an upstream error anywhere; cut into any reads.
@settings(max_examples=120, deadline=None)
@given(texts=st.lists(TEXT, max_size=10), thoughts=st.lists(TEXT, max_size=4), lines=st.booleans(),
       numbered=st.booleans(), same=st.booleans(), comments=st.lists(st.integers(0, 20), max_size=2),
       error_at=st.one_of(st.none(), st.integers(0, 20)),
       sizes=st.one_of(st.none(), st.lists(st.integers(1, 900), max_size=20)))  # fmt: skip
async def test_every_layout_relays_the_events_a_parse_would(
    texts: list[str], thoughts: list[str], lines: bool, numbered: bool, same: bool, comments: list[int],
    error_at: int | None, sizes: list[int] | None,
) -> None:  # fmt: skip
    text, think = {"item_id": "msg_1", "output_index": 1, "content_index": 0}, {"item_id": "rs_1", "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.in_progress", "response": response("in_progress")},
        *({"type": "response.reasoning_summary_text.delta", **think, "summary_index": 0, "delta": t} for t in thoughts),
        {"type": "response.output_item.added", "output_index": 1, "item": response("completed")["output"][0]},
        *({"type": "response.output_text.delta", **text, "delta": t, "logprobs": []} for t in texts),
        {"type": "response.output_text.done", **text, "text": "".join(texts), "logprobs": []},
        {"type": "response.output_item.done", "output_index": 1, "item": response("completed")["output"][0]},
        {"type": "response.completed", "response": response("completed", "".join(texts))},
    ]
    if error_at is not None and error_at < len(events):
        error = {"type": "error", "code": "server_error", "message": "engine died", "param": None}
        events = [*events[:error_at], error]
    for seq, obj in enumerate(events):
        if numbered:
            obj["sequence_number"] = seq
    raw = [render(obj, lines) for obj in events]
    for at in sorted(comments, reverse=True):
        raw.insert(min(at, len(raw) - 1), b": keep-alive\n\n")
    public = UP if same else PUB  # (the same name: nothing to rename)
    call = ResponsesCall(ResponsesRequest.model_validate({"model": public, "input": "hi"}), UP, public, "req-1")
    reads = raw if sizes is None else cut(b"".join(raw), sizes)  # (None: a read per event, as tokens arrive)
    relay = NativeResponseEvents(FakeResponse(reads), call, "up")  # type: ignore[arg-type]
    out = b""
    failed = events[-1]["type"] == "error"
    try:
        async for piece in relay:
            out += piece
    except UpstreamProtocolError:
        assert failed
    else:
        assert not failed
    finally:
        await relay.aclose()
    expect = expected([render(obj, True) for obj in (events[:-1] if failed else events)], public)
    assert relayed(out) == expect
    assert relay.relayed_events == sum(obj["type"].endswith(".delta") for obj in expect)
    if failed and numbered:  # the gateway's response.failed (or error) takes the upstream error's number
        assert (
            orjson.loads(relay.failed_event(UpstreamProtocolError("x", backend="up")).split(b"data: ", 1)[1])[
                "sequence_number"
            ]
            == len(events) - 1
        )


@pytest.mark.parametrize(
    "first",
    [
        b'data: {"type":"response.output_text.delta","delta":"x"}\n\n',  # a bare delta, no Response opened
        b"data: [DONE]\n\n",
        b'data: "hello"\n\n',
        b"data: not json\n\n",
        b'event: message\ndata: {"choices": []}\n\n',  # a chat chunk: a chat endpoint behind a Responses URL
    ],
)
async def test_a_stream_that_opens_no_response_is_refused_before_a_byte(first: bytes) -> None:
    relay = NativeResponseEvents(FakeResponse([first, *stream(["a"])]), CALL, "up")  # type: ignore[arg-type]
    got = b""
    with pytest.raises(UpstreamProtocolError, match=r"not response\.created") as err:
        async for piece in relay:
            got += piece
    assert got == b"" and err.value.reason == "stream_garbage"


@pytest.mark.parametrize(
    "opening",
    [
        [b": keep-alive\n\n", *stream(["a", "b"])],  # a comment first: the next event decides
        [
            b'data: {"type": "response.created", "sequence_number": 0, "response": {"model": "up-model"}}\n\n',
            *stream(["a"])[1:],
        ],
        stream(["a"])[1:],  # in_progress first: a lifecycle event is taken as the opening
    ],
)
async def test_a_stream_that_opens_a_response_is_relayed(opening: list[bytes]) -> None:
    relay = NativeResponseEvents(FakeResponse(opening), CALL, "up")  # type: ignore[arg-type]
    got = b""
    async for piece in relay:
        got += piece
    await relay.aclose()
    assert relay.final is not None and b"response.completed" in got


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize(
    "status", ["completed", "incomplete", "failed", "cancelled", "queued", "in_progress", None, "bogus", 1]
)
def test_a_non_streamed_response_must_be_finished_unless_it_runs_in_the_background(
    status: Any, background: bool
) -> None:
    """A Response still running (or of no known status) would be stored so and read so forever: refused
    (a 502), unless the client asked for a background run, whose Response is queued or in progress."""
    obj = response("completed", "hi")
    obj["status"] = status
    call = ResponsesCall(
        ResponsesRequest.model_validate({"model": PUB, "input": "hi", "background": background}), UP, PUB, "req-1"
    )
    finished = status in ("completed", "incomplete", "failed", "cancelled")
    if finished or (background and status in ("queued", "in_progress")):
        assert relay_response_body(orjson.dumps(obj), call, "up").answer is not None
    else:
        with pytest.raises(UpstreamProtocolError, match="not a finished one"):
            relay_response_body(orjson.dumps(obj), call, "up")

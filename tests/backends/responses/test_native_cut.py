"""A relayed Responses stream cut short (backends/responses/native_events.py, native_output.py): the
Response the store keeps, and the one ``response.failed`` carries, hold the output as far as it was
relayed (the items done as sent, the one in progress with its text so far, ``incomplete``), as the
chat bridge's snapshot does for the same events."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import backends.responses.native_events as native_events
from backends.errors import UpstreamProtocolError
from backends.responses.answer import ResponseFrame
from backends.responses.capabilities import chat_request_of
from backends.responses.events import ChatResponseEvents
from backends.responses.native import NativeResponseEvents
from schemas.responses import ResponsesRequest
from tests.backends.openai.test_openai_relay import FakeResponse
from tests.backends.responses.test_bridge import ChatChunks, _delta
from tests.backends.responses.test_native_relay import CALL, PUB, TEXT, cut, event, response

MSG = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
PART = {"type": "output_text", "text": "", "annotations": []}
CALL_ITEM = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "",
             "status": "in_progress"}  # fmt: skip
THOUGHT = {"id": "rs_1", "type": "reasoning", "summary": []}


def events_of(*bodies: tuple[str, dict[str, Any]]) -> list[bytes]:
    """A numbered upstream stream: created and in_progress, then ``bodies`` (type, fields)."""
    head = [("response.created", {"response": response("in_progress")}),
            ("response.in_progress", {"response": response("in_progress")})]  # fmt: skip
    return [event(seq, kind, **fields) for seq, (kind, fields) in enumerate([*head, *bodies])]


def text_events(index: int, pieces: list[str], *, done: bool) -> list[tuple[str, dict[str, Any]]]:
    at = {"item_id": "msg_1", "output_index": index, "content_index": 0}
    out: list[tuple[str, dict[str, Any]]] = [
        ("response.output_item.added", {"output_index": index, "item": MSG}),
        ("response.content_part.added", {**at, "part": PART}),
        *(("response.output_text.delta", {**at, "delta": p, "logprobs": []}) for p in pieces),
    ]
    if done:
        text = "".join(pieces)
        item = {**MSG, "status": "completed", "content": [{**PART, "text": text}]}
        out += [("response.output_text.done", {**at, "text": text, "logprobs": []}),
                ("response.content_part.done", {**at, "part": {**PART, "text": text}}),
                ("response.output_item.done", {"output_index": index, "item": item})]  # fmt: skip
    return out


async def relay_of(reads: list[bytes]) -> NativeResponseEvents:
    """The relay after it relayed ``reads`` (the client then leaves, or the upstream failed)."""
    relay = NativeResponseEvents(FakeResponse(reads), CALL, "up")  # type: ignore[arg-type]
    with pytest.raises(UpstreamProtocolError):  # (the reads end before the stream's last event)
        async for _ in relay:
            pass
    return relay


async def test_a_client_that_left_keeps_the_items_done_and_the_text_so_far() -> None:
    sealed = {**THOUGHT, "encrypted_content": "e"}
    thought = [("response.output_item.added", {"output_index": 0, "item": THOUGHT}),
               ("response.output_item.done", {"output_index": 0, "item": sealed})]  # fmt: skip
    relay = await relay_of(events_of(*thought, *text_events(1, ["Hel", "lo", ' "w\\'], done=False)))
    snapshot = relay.snapshot("cancelled")
    assert snapshot is not None and snapshot["status"] == "cancelled" and snapshot["model"] == PUB
    assert snapshot["output"] == [
        sealed,
        {**MSG, "status": "incomplete", "content": [{**PART, "text": 'Hello "w\\'}]},
    ]
    assert snapshot["usage"] is None  # not known yet: the upstream says it at the end


async def test_a_call_cut_mid_arguments_keeps_them_as_far_as_they_came() -> None:
    at = {"item_id": "fc_1", "output_index": 1}
    relay = await relay_of(
        events_of(
            *text_events(0, ["Let me look."], done=True),
            ("response.output_item.added", {"output_index": 1, "item": CALL_ITEM}),
            ("response.function_call_arguments.delta", {**at, "delta": '{"city":'}),
            ("response.function_call_arguments.delta", {**at, "delta": '"Par'}),
        )
    )
    output = relay.snapshot("cancelled")["output"]  # type: ignore[index]
    assert output[0]["status"] == "completed" and output[0]["content"][0]["text"] == "Let me look."
    assert output[1] == {**CALL_ITEM, "arguments": '{"city":"Par', "status": "incomplete"}


@pytest.mark.parametrize("failure", ["error", "response.failed"])
async def test_a_failure_midway_carries_the_output_so_far_and_the_store_keeps_it(failure: str) -> None:
    reads = events_of(*text_events(0, ["a", "b"], done=False))
    if failure == "error":
        reads.append(event(len(reads), "error", code="server_error", message="engine died", param=None))
    else:  # the upstream's own Response (its output is its word, not what was relayed)
        error = {"code": "server_error", "message": "engine died"}
        gone = {**response("in_progress"), "status": "failed", "error": error, "output": [MSG]}
        reads.append(event(len(reads), "response.failed", response=gone))
    reads.append(event(len(reads), "response.output_text.delta", item_id="msg_1", output_index=0,
                       content_index=0, delta="never relayed"))  # fmt: skip
    relay = await relay_of([b"".join(reads[:3]), b"".join(reads[3:])])
    failed = orjson.loads(relay.failed_event(UpstreamProtocolError("x", backend="up")).split(b"data: ", 1)[1])
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["output"] == [{**MSG, "status": "incomplete", "content": [{**PART, "text": "ab"}]}]
    assert relay.snapshot("cancelled") == failed["response"]


async def test_a_long_stream_folded_on_the_way_snapshots_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = events_of(*text_events(0, ["x"] * 5, done=True), *text_events(1, [" y"] * 7, done=False))
    kept = (await relay_of(reads)).snapshot("cancelled")
    monkeypatch.setattr(native_events, "_KEEP", 1)  # every read folded as it comes
    assert (await relay_of(reads)).snapshot("cancelled") == kept
    assert kept is not None and kept["output"][1]["content"][0]["text"] == " y" * 7


# Any stream cut anywhere, in any reads: the text kept is the text relayed.
@settings(max_examples=100, deadline=None)
@given(first=st.lists(TEXT, max_size=6), second=st.lists(TEXT, max_size=6), stop=st.integers(0, 30),
       sizes=st.lists(st.integers(1, 300), max_size=30))  # fmt: skip
async def test_the_text_kept_is_the_text_relayed(
    first: list[str], second: list[str], stop: int, sizes: list[int]
) -> None:
    reads = events_of(*text_events(0, first, done=True), *text_events(1, second, done=False))
    data = b"".join(reads[: min(stop, len(reads))])
    relay = NativeResponseEvents(FakeResponse(cut(data, sizes)), CALL, "up")  # type: ignore[arg-type]
    deltas: dict[int, str] = {}
    done: set[int] = set()
    with pytest.raises(UpstreamProtocolError):
        async for piece in relay:
            for raw in piece.split(b"\n\n")[:-1]:
                obj = orjson.loads(raw.split(b"data: ", 1)[1])
                if obj["type"] == "response.output_item.added":
                    deltas[obj["output_index"]] = ""
                elif obj["type"] == "response.output_text.delta":
                    deltas[obj["output_index"]] += obj["delta"]
                elif obj["type"] == "response.output_item.done":
                    done.add(obj["output_index"])
    snapshot = relay.snapshot("cancelled")
    if stop < 1:
        assert snapshot is None  # not even response.created came
        return
    assert snapshot is not None and len(snapshot["output"]) == len(deltas)
    for index, item in enumerate(snapshot["output"]):
        assert "".join(part["text"] for part in item["content"]) == deltas[index]
        assert item["status"] == ("completed" if index in done else "incomplete")


# The chat bridge's events, relayed: a cut anywhere keeps what the bridge's own snapshot keeps.
BRIDGED = [
    _delta({"role": "assistant", "reasoning_content": "thin"}),
    _delta({"reasoning_content": "k"}),
    _delta({"content": "Hel"}),
    _delta({"content": "lo"}),
    _delta({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
    _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
    _delta({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
]  # fmt: skip


@pytest.mark.parametrize("chunks", range(1, len(BRIDGED) + 1))
async def test_the_relay_keeps_what_the_bridge_keeps_for_the_same_events(chunks: int) -> None:
    request = ResponsesRequest.model_validate({"model": PUB, "input": "x", "stream": True})
    frame = ResponseFrame(request, PUB, chat_request_of(request)[1])
    bridge = ChatResponseEvents(ChatChunks(BRIDGED[:chunks], fail=True), frame, "b")
    sent: list[bytes] = []
    with pytest.raises(UpstreamProtocolError):
        async for piece in bridge:
            sent.append(piece)
    expected = bridge.snapshot("cancelled")
    relay = await relay_of(sent)
    got = relay.snapshot("cancelled")
    assert expected is not None and got is not None
    assert got["status"] == expected["status"] == "cancelled"
    assert got["output"] == expected["output"]

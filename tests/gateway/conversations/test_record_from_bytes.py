"""A stored record cut from the Response's bytes (gateway/conversations/records.py ``encode``'s
``dumped``) is byte for byte the record dumped from the Response dict: for the bridge's non-stream
answers (``CompletionResult.dumped``) and the last event of its streams, completed, incomplete
and cut short, with tools, reasoning, calls and logprobs; bytes that are not the dict's are not used."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.capabilities import chat_request_of
from backends.responses.events import ChatResponseEvents
from gateway.conversations.records import decode, encode, text_input_line
from gateway.conversations.store import ConversationStore
from gateway.flow.responses_turns import ResponsesTurns, own_items
from gateway.responses_state import NO_AUTH_TENANT
from gateway.store import MemoryStore
from schemas.responses import ResponsesRequest
from tests.fakes import Reads

FIXTURE = Path(__file__).parents[2] / "fixtures" / "responses" / "codex-0.171-turn1.json"
CODEX = json.loads(FIXTURE.read_text())["body"]
ITEMS = [{"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 2}}
REQUESTS: list[dict[str, Any]] = [
    {"model": "m", "input": "hi"},
    {"model": "m", "input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 1,
     "reasoning": {"effort": "low", "summary": "auto"}, "instructions": 'say "usage":', "metadata": {"output": "[1]"}},
    CODEX,
]  # fmt: skip
MESSAGES: list[dict[str, Any]] = [
    {"role": "assistant", "content": 'plain ,"output":[] ,"usage":null'},
    {"role": "assistant", "content": None, "reasoning_content": "think",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"a":1}'}}]},
    {"role": "assistant", "content": "", "refusal": "no"},
]  # fmt: skip


def _frame(body: dict[str, Any], stream: bool = False) -> ResponseFrame:
    request = ResponsesRequest.model_validate_json(orjson.dumps({**body, "stream": stream}))
    return ResponseFrame(request, "public", chat_request_of(request)[1])


def _same_record(response: dict[str, Any], dumped: bytes, chain: list[str]) -> bytes:
    before = orjson.dumps(response)
    record = encode(response, ITEMS, chain, dumped)
    assert record == encode(response, ITEMS, chain)
    assert orjson.dumps(response) == before  # the dict is as it was
    marked = dumped.replace(b'"object":"response"', b'"object":"RESPONSE"', 1)  # the record is cut from the bytes
    assert encode(response, ITEMS, chain, marked) == record.replace(b'"object":"response"', b'"object":"RESPONSE"', 1)
    return record


@pytest.mark.parametrize("body", REQUESTS)
@pytest.mark.parametrize("message", MESSAGES)
@pytest.mark.parametrize("finish", ["stop", "length"])
@pytest.mark.parametrize("usage", [USAGE, None])
def test_a_non_stream_answers_record_is_cut_from_its_body(
    body: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, Any] | None
) -> None:
    logprobs = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [], "output": [1]}]}
    choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
    chat = {"id": "c", "object": "chat.completion", "choices": [choice], **({"usage": usage} if usage else {})}
    frame = _frame(body)
    result, response = response_from_chat(orjson.dumps(chat), frame, "b")
    assert result.dumped and result.body == orjson.dumps(response)
    assert response["status"] == ("completed" if finish == "stop" else "incomplete")
    record = _same_record(response, result.body, ["resp_a", "resp_b"])
    assert decode(record).response == response
    output_at = result.output_at
    if output_at:  # the body written around the echo: the output's place noted
        assert result.body[output_at:].startswith(b',"output":' + orjson.dumps(response["output"]) + b',"usage":')
        assert encode(response, ITEMS, ["resp_a", "resp_b"], result.body, output_at) == record
        marked = result.body.replace(b'"object":"response"', b'"object":"RESPONSE"', 1)  # (before the output)
        cut = record.replace(b'"object":"response"', b'"object":"RESPONSE"', 1)
        assert encode(response, ITEMS, ["resp_a", "resp_b"], marked, output_at) == cut
    else:
        assert body is not REQUESTS[0]  # the plain request's body is always written around the echo


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice], **extra}
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("body", REQUESTS)
@pytest.mark.parametrize("finish", ["stop", "length", "tool_calls"])
async def test_a_streams_record_is_cut_from_its_last_events_response(body: dict[str, Any], finish: str) -> None:
    reads = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": 'a ,"usage":1'}),
        _chunk({"content": "b"}),
    ]
    if finish == "tool_calls":
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
        reads.append(_chunk({"tool_calls": [call]}))
    reads += [_chunk({}, finish), _chunk({}, choices=[], usage=USAGE)]
    stream = ChatResponseEvents(Reads(reads), _frame(body, stream=True), "b")
    out = b"".join([piece async for piece in stream])
    last = out.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].split(b"data: ", 1)[1]
    response_bytes = last[last.index(b'"response":') + len(b'"response":') : -1]
    final = stream.snapshot("cancelled")
    assert final is not None and final["status"] == ("incomplete" if finish == "length" else "completed")
    assert response_bytes == orjson.dumps(final)  # the last event holds the Response's dumps
    _same_record(final, response_bytes, [])


async def test_a_stream_cut_short_keeps_its_record_from_its_snapshots_bytes() -> None:
    stream = ChatResponseEvents(Reads([_chunk({"role": "assistant", "content": "half"})]), _frame(CODEX, True), "b")
    await anext(aiter(stream))
    snapshot = stream.snapshot("cancelled")
    assert snapshot is not None and snapshot["status"] == "cancelled"
    _same_record(snapshot, orjson.dumps(snapshot), [])


def test_bytes_that_are_not_the_responses_are_not_used() -> None:
    result, response = response_from_chat(
        orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}),
        _frame({"model": "m", "input": "hi"}),
        "b",
    )
    expected = encode(response, ITEMS, [])
    other = dict(response, output=[{"type": "message", "content": []}])
    for dumped in (b"", b"{}", orjson.dumps(other), result.body.replace(b'"usage"', b'"usagE"'), result.body[:40]):
        assert encode(response, ITEMS, [], dumped) == expected


async def test_the_stored_record_is_cut_at_the_output_place_its_answer_noted() -> None:
    """The handler's hook cuts the record at the place the answer noted (CompletionResult.output_at):
    the record every other way would write, for an answer whose text holds ``,"output":`` itself."""
    chat = {"choices": [{"message": {"role": "assistant", "content": 'x ,"output":[1]'}, "finish_reason": "stop"}]}
    frame = _frame({"model": "m", "input": "hi"})
    result, response = response_from_chat(orjson.dumps(chat), frame, "b")
    assert result.dumped and result.output_at and result.body[result.output_at :].startswith(b',"output":[')
    store = ConversationStore(MemoryStore("responses", ttl=60, max_items=10, max_bytes=1 << 20))
    await ResponsesTurns().end(frame.request, response, store, None, result.body, result.output_at)
    assert store.store is not None
    (blob,) = await store.store.get(NO_AUTH_TENANT, [response["id"]])
    assert blob is not None
    _, items, *_ = blob.split(b"\n", 3)
    assert blob == encode(response, orjson.loads(items), [])  # as the Response's own dumps writes it
    record = decode(blob)
    assert record.response == response and record.output == response["output"]
    assert [item["content"] for item in record.input] == [ITEMS[0]["content"]]


class _WaitingStore(MemoryStore):
    """A memory store by another type: the conversation store awaits its writes (as Redis's)."""


async def test_end_now_saves_at_once_or_hands_back_the_save_to_await() -> None:
    """The handler's hook: the gateway's memory store keeps the turn before end_now returns (nothing to
    await); a store to wait for gets the save handed back, the turn kept once it is awaited; store: false
    keeps nothing. The record is the same either way."""
    chat = {"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}
    for kind in (MemoryStore, _WaitingStore):
        frame = _frame({"model": "m", "input": "hi"})
        result, response = response_from_chat(orjson.dumps(chat), frame, "b")
        memory = kind("responses", ttl=60, max_items=10, max_bytes=1 << 20)
        store = ConversationStore(memory)
        saving = ResponsesTurns().end_now(frame.request, response, store, None, result.body, result.output_at)
        assert (saving is None) == (kind is MemoryStore)
        if saving is not None:
            assert memory.get_now(NO_AUTH_TENANT, [response["id"]]) == [None]  # not yet
            await saving
        (blob,) = memory.get_now(NO_AUTH_TENANT, [response["id"]])
        assert blob is not None
        record = decode(blob)
        assert record.response == response and record.chain == [] and record.output == response["output"]
        assert [item["content"] for item in record.input] == [ITEMS[0]["content"]]
    unstored = _frame({"model": "m", "input": "hi", "store": False})
    result, response = response_from_chat(orjson.dumps(chat), unstored, "b")
    memory = MemoryStore("responses", ttl=60, max_items=10, max_bytes=1 << 20)
    assert ResponsesTurns().end_now(unstored.request, response, ConversationStore(memory), None, result.body) is None
    assert memory.stats().items == 0


@settings(max_examples=200, deadline=None)
@given(text=st.text() | st.sampled_from(['"', "\\", "\u2028", "%b", "\x00", "", "é" * 300]))
def test_a_string_inputs_line_is_the_dumps_of_its_items(text: str) -> None:
    """text_input_line writes what encode would of own_items' message for that input, byte for byte."""
    line = text_input_line(text)
    (item,) = orjson.loads(line)
    assert re.fullmatch(r"msg_[0-9a-f]{48}", item["id"])
    request = ResponsesRequest.model_validate({"model": "m", "input": text})
    (own,) = own_items(request)
    assert line == orjson.dumps([{**own, "id": item["id"]}])
    assert encode({"id": "r", "output": []}, line, []) == encode({"id": "r", "output": []}, [item], [])

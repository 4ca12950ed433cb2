"""The bridge's lifecycle events from bytes (backends/responses/response_writer.py: ``_start``,
``_close_part``, ``_item_done``, ``_complete``; lifecycle_bytes.py: ``START``, ``TEXT_END``,
``final_bytes``): ``response.created`` and ``in_progress`` from the echo serialised once, and
``output_text.done``, ``content_part.done``, ``output_item.done`` and ``response.completed`` (or
``incomplete``) written from the first Response's bytes and each item's (the common end, an open
text part, in one template; a reasoning item's and a call's closing events from templates too:
``_closed_from_bytes``), not serialised again. For generated streams (text, refusal,
reasoning with or without a summary, function and custom calls, logprobs, usage, a finish that
cuts, a failure midway, an echoed integer beyond 64 bits) every byte is what each event's dict
gives (``lifecycle_bytes`` off), and the stored Response is the same."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from backends.errors import UpstreamProtocolError
from backends.responses import answer as answer_module
from backends.responses import events as events_module
from backends.responses import lifecycle_bytes
from backends.responses.answer import ResponseFrame
from backends.responses.capabilities import chat_request_of
from backends.responses.events import ChatResponseEvents
from gateway.conversations import ConversationStore
from gateway.conversations.records import encode
from gateway.flow.responses_turns import ResponsesTurns, StreamEnd
from gateway.responses_state import NO_AUTH_TENANT
from gateway.store import MemoryStore
from schemas.responses import ResponsesRequest
from tests.backends.responses.test_bridge_text_shape import Reads

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}
TOOLS = [
    {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}},
    {"type": "custom", "name": "c"},
]


class General(ChatResponseEvents):
    lifecycle_bytes = False  # every event from its dict: the reference


def frame(logprobs: bool, summary: bool, long_int: bool) -> ResponseFrame:
    body: dict[str, Any] = {"model": "m", "input": "x", "stream": True, "tools": TOOLS}
    if logprobs:
        body["include"] = ["message.output_text.logprobs"]
    if summary:
        body["reasoning"] = {"summary": "auto"}
    request = ResponsesRequest.model_validate(body)
    shared = ResponseFrame(request, "public", chat_request_of(request)[1])
    if long_int:  # (the schema refuses one: the general serialiser's way, in case)
        shared._template = {**shared._template, "metadata": {"n": 2**70}}
        shared._data = None
    return shared


def chunk(step: tuple[str, Any]) -> bytes:
    kind, value = step
    choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": None}
    body: dict[str, Any] = {**HEAD, "choices": [choice]}
    if kind == "text":
        choice["delta"] = {"content": value}
        choice["logprobs"] = {"content": [{"token": value, "logprob": -0.5e-5, "bytes": [1], "top_logprobs": []}]}
    elif kind in ("refusal", "reasoning_content"):
        choice["delta"] = {kind: value}
    elif kind == "call":
        index, call_id, args = value
        choice["delta"] = {
            "tool_calls": [{"index": index, "id": call_id, "function": {"name": "f", "arguments": args}}]
        }
    elif kind == "custom":
        custom = {"name": "c", "input": "i"}
        choice["delta"] = {"tool_calls": [{"index": value, "id": "cc", "type": "custom", "custom": custom}]}
    elif kind == "finish":
        choice["finish_reason"] = value
    else:  # usage
        body = {**HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": value, "total_tokens": 9}}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


# A call id nested as deep as orjson writes it in an item's event but not in the Response's (and
# a float, which the stdlib's serialiser writes otherwise): that item is written the general way.
DEEP: Any = [1e-05]
for _ in range(251):
    DEEP = [DEEP]
TEXT = st.sampled_from(["a", "é", '"q"', "\\", "\n", "😀 b"])
STEP = st.one_of(
    st.tuples(st.just("text"), TEXT),
    st.tuples(st.just("refusal"), TEXT),
    st.tuples(st.just("reasoning_content"), TEXT),
    st.tuples(st.just("call"), st.tuples(st.integers(0, 2), st.sampled_from(["call_1", None, 5, DEEP]), TEXT)),
    st.tuples(st.just("custom"), st.integers(3, 4)),
    st.tuples(st.just("finish"), st.sampled_from(["stop", "length", "content_filter", "tool_calls"])),
    st.tuples(st.just("usage"), st.sampled_from([3, 2**70])),
)


async def written(
    cls: type[ChatResponseEvents], reads: list[bytes], shared: ResponseFrame, fail: bool
) -> tuple[bytes, Any, bytes | None]:
    ids = itertools.count()
    with pytest.MonkeyPatch.context() as patch:  # the same item ids in both runs
        for module in (events_module, answer_module):
            patch.setattr(module, "new_id", lambda prefix: f"{prefix}_{next(ids)}")
        stream = cls(Reads(list(reads)), shared, "b")
        out = b""
        async for piece in stream:
            out += piece
            if fail:
                out += stream.failed_event(UpstreamProtocolError("upstream went away", backend="b"))
                break
        return out, stream.snapshot("cancelled"), stream.final_dumped


@settings(max_examples=120, deadline=None)
@given(
    steps=st.lists(STEP, max_size=10),
    cut=st.integers(1, 3),
    logprobs=st.booleans(),
    summary=st.booleans(),
    long_int=st.booleans(),
    fail=st.booleans(),
)
@example(
    steps=[("text", "a"), ("text", "b"), ("finish", "length"), ("usage", 3)],
    cut=9, logprobs=False, summary=False, long_int=False, fail=False,
)  # fmt: skip
@example(
    steps=[("call", (0, DEEP, "{")), ("finish", "tool_calls")],
    cut=1, logprobs=False, summary=False, long_int=False, fail=False,
)  # fmt: skip
@example(
    steps=[("reasoning_content", "r"), ("call", (0, "c", "{")), ("text", "a")],
    cut=1, logprobs=False, summary=True, long_int=False, fail=False,
)  # fmt: skip
@example(
    steps=[("reasoning_content", "r"), ("text", "a"), ("finish", "content_filter"), ("usage", 3)],
    cut=2, logprobs=False, summary=False, long_int=False, fail=False,
)  # fmt: skip
@example(
    steps=[("text", "a"), ("finish", "stop"), ("usage", 2**70)],
    cut=1, logprobs=False, summary=False, long_int=False, fail=False,
)  # fmt: skip
@example(steps=[], cut=1, logprobs=False, summary=False, long_int=True, fail=False)
async def test_the_closing_events_from_bytes_are_those_of_their_dicts(
    steps: list[tuple[str, Any]], cut: int, logprobs: bool, summary: bool, long_int: bool, fail: bool
) -> None:
    chunks = [chunk(("text", "A")), *map(chunk, steps)]
    reads = [b"".join(chunks[at : at + cut]) for at in range(0, len(chunks), cut)]
    shared = frame(logprobs, summary, long_int)
    fast, fast_final, dumped = await written(ChatResponseEvents, reads, shared, fail)
    general, general_final, _ = await written(General, reads, shared, fail)
    assert fast == general
    assert fast_final == general_final
    if dumped is not None:  # the store's bytes (StreamEnd): the last event's Response, the final's dumps
        assert not fail and dumped == orjson.dumps(fast_final)
        assert fast.endswith(b'"response":' + dumped + b"}\n\n")


async def test_a_plain_answer_takes_the_byte_path() -> None:
    """The common stream (text, then a finish and usage) is written without its lifecycle events'
    dicts, its end in one template (no part or item closed on its own), and the last event holds
    the Response the store keeps."""
    reads = [b"".join(map(chunk, [("text", "A"), ("text", "b"), ("finish", "length"), ("usage", 2)]))]
    stream = ChatResponseEvents(Reads(reads), frame(False, False, False), "b")
    emitted: list[str] = []
    real = ChatResponseEvents._emit

    def counting(self: ChatResponseEvents, out: list[bytes], event: dict[str, Any]) -> None:
        emitted.append(event["type"])
        real(self, out, event)

    def not_called(self: ChatResponseEvents, out: list[bytes], *args: Any) -> None:
        raise AssertionError("closed on its own")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChatResponseEvents, "_emit", counting)
        patch.setattr(ChatResponseEvents, "_close_part", not_called)
        patch.setattr(ChatResponseEvents, "_item_done", not_called)
        out = b"".join([piece async for piece in stream])
    assert emitted == []  # every lifecycle event from bytes
    events = [orjson.loads(line.removeprefix(b"data: ")) for line in out.splitlines() if line.startswith(b"data: ")]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"] == stream.snapshot("cancelled")
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["content"][0]["text"] == "Ab"
    assert events[0]["response"] == {**last["response"], "status": "in_progress", "incomplete_details": None,
                                     "output": [], "usage": None}  # fmt: skip


async def test_reasoning_and_calls_open_and_close_from_bytes() -> None:
    """A coding agent's turn (reasoning with a summary, a function call, a custom tool call) opens its
    reasoning and closes every item without an event dict (only a call's opening is one); the bytes
    are the dicts' (the test above)."""
    steps = [("reasoning_content", "r"), ("call", (0, "call_1", "{")), ("custom", 3), ("finish", "tool_calls")]
    reads = [b"".join(map(chunk, steps))]
    emitted: list[str] = []
    real = ChatResponseEvents._emit

    def counting(self: ChatResponseEvents, out: list[bytes], event: dict[str, Any]) -> None:
        emitted.append(event["type"])
        real(self, out, event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChatResponseEvents, "_emit", counting)
        stream = ChatResponseEvents(Reads(reads), frame(False, True, False), "b")
        out = b"".join([piece async for piece in stream])
    assert emitted == ["response.output_item.added"] * 2  # the calls' openings
    kinds = [line.removeprefix(b"event: ").decode() for line in out.splitlines() if line.startswith(b"event: ")]
    assert kinds.count("response.output_item.done") == 3 and kinds[-1] == "response.completed"
    assert "response.reasoning_summary_part.done" in kinds and "response.custom_tool_call_input.done" in kinds
    assert "response.function_call_arguments.done" in kinds


@pytest.mark.parametrize("finish", ["stop", "length"])
async def test_a_streamed_turn_is_stored_from_its_last_events_bytes(finish: str) -> None:
    """StreamEnd hands the last event's Response bytes (``final_dumped``) to the store, which cuts the
    record from them (a byte marked in them shows in it): the record the Response dict gives."""
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", "stream": True})
    reads = [b"".join(map(chunk, [("text", "A"), ("text", "b"), ("finish", finish), ("usage", 2)]))]
    stream = ChatResponseEvents(Reads(reads), ResponseFrame(request, "public", chat_request_of(request)[1]), "b")
    out = b"".join([piece async for piece in stream])
    final = stream.snapshot("cancelled")
    assert final is not None and stream.final_dumped == orjson.dumps(final)
    assert out.endswith(b'"response":' + stream.final_dumped + b"}\n\n")
    expected = encode(final, [], []).split(b"\n")
    mark = (b'"object":"response"', b'"object":"RESPONSE"', 1)
    stream.final_dumped = stream.final_dumped.replace(*mark)
    memory = MemoryStore("responses", ttl=60, max_items=10, max_bytes=1 << 20)
    await StreamEnd(ResponsesTurns(), request, stream, ConversationStore(memory), None)()
    (blob,) = await memory.get(NO_AUTH_TENANT, [final["id"]])
    assert blob is not None
    assert blob.split(b"\n")[2:] == [expected[2], expected[3].replace(*mark)]


async def test_a_failed_stream_hands_no_bytes_over() -> None:
    """After response.failed the store's Response is the failed one: no last event's bytes go with it."""
    reads = [b"".join(map(chunk, [("text", "A"), ("finish", "stop"), ("usage", 2)]))]
    stream = ChatResponseEvents(Reads(reads), frame(False, False, False), "b")
    async for _ in stream:
        pass
    assert stream.final_dumped is not None
    stream.failed_event(UpstreamProtocolError("upstream went away", backend="b"))
    assert stream.final_dumped is None


@pytest.mark.parametrize(
    "steps",
    [
        [("text", "A"), ("text", '"b"\\'), ("finish", "stop"), ("usage", 2)],  # the common end (TEXT_END)
        [("text", "A"), ("finish", "length")],  # incomplete, no usage
        [("reasoning_content", "r"), ("text", "é"), ("finish", "stop")],  # an item before the text
        [("text", "A"), ("call", (0, "call_1", "{}")), ("finish", "tool_calls"), ("usage", 3)],  # final_bytes
        [("reasoning_content", "r"), ("finish", "length"), ("usage", 3)],  # final_bytes, incomplete
    ],
)
async def test_a_streamed_turn_says_where_its_output_is(steps: list[tuple[str, Any]]) -> None:
    """The last Response's bytes (``final_dumped``) come with where their ``,"output":`` starts
    (``final_output_at``), which StreamEnd hands to the store: the record cut there is the dict's, and
    its output line is cut from those bytes (a byte marked in the output shows in it). After
    response.failed: neither."""
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", "stream": True, "tools": TOOLS})
    shared = ResponseFrame(request, "public", chat_request_of(request)[1])
    stream = ChatResponseEvents(Reads([b"".join(map(chunk, steps))]), shared, "b")
    [_ async for _ in stream]
    final, dumped, at = stream.snapshot("cancelled"), stream.final_dumped, stream.final_output_at
    assert final is not None and dumped == orjson.dumps(final)
    output, usage = orjson.dumps(final["output"]), orjson.dumps(final["usage"])
    assert dumped[at:] == b',"output":' + output + b',"usage":' + usage + b"}"
    assert encode(final, [], [], dumped, at) == encode(final, [], [])
    memory = MemoryStore("responses", ttl=60, max_items=10, max_bytes=1 << 20)
    stream.final_dumped = dumped[:at] + dumped[at:].replace(b'"type":', b'"TYPE":', 1)
    await StreamEnd(ResponsesTurns(), request, stream, ConversationStore(memory), None)()
    (blob,) = await memory.get(NO_AUTH_TENANT, [final["id"]])
    assert blob is not None and blob.split(b"\n")[2] == output.replace(b'"type":', b'"TYPE":', 1)
    stream.failed_event(UpstreamProtocolError("upstream went away", backend="b"))
    assert stream.final_dumped is None and stream.final_output_at == 0


@pytest.mark.parametrize("reason", sorted(lifecycle_bytes.INCOMPLETE.values()))
def test_an_echo_takes_its_incomplete_reason_where_the_replace_would_put_it(reason: str) -> None:
    """``detailed`` sets the echo's own incomplete_details (its fixed members' slice; else the first key's),
    what a replace of the first ``null`` one gives, for the frame's echo and for one that does not start with
    the fixed members."""
    made = frame(logprobs=False, summary=False, long_int=False).around_status()
    assert made is not None
    echo = made[1]
    assert echo.startswith(lifecycle_bytes.FIXED + b"null,")  # (the slice's way: the usual echo)
    wanted = echo.replace(lifecycle_bytes.NO_DETAILS, lifecycle_bytes.DETAILS[reason], 1)
    assert lifecycle_bytes.detailed(echo, reason) == wanted != echo
    assert orjson.loads(b"{" + lifecycle_bytes.detailed(echo, reason) + b"}")["incomplete_details"] == {
        "reason": reason
    }
    moved = b'"user":null,' + echo  # (the replace's way)
    assert lifecycle_bytes.detailed(moved, reason) == moved.replace(
        lifecycle_bytes.NO_DETAILS, lifecycle_bytes.DETAILS[reason], 1
    )


@pytest.mark.parametrize("reason", [None, *sorted(lifecycle_bytes.INCOMPLETE.values())])
def test_each_end_template_is_text_end_with_its_own_last_event_type(reason: str | None) -> None:
    """``ENDS``: per incomplete reason (None: completed), its status and TEXT_END with the last event's type
    written in: the same bytes as TEXT_END given that type, and only a completed Response's says completed."""
    status, template = lifecycle_bytes.ENDS[reason]
    assert status == (b"completed" if reason is None else b"incomplete")
    kind = b"response." + status
    parts = (7, b',"item_id":"m","output_index":0,"content_index":0', b'"t%"', 8, b"x", b'"t%"', 9, 0, b"{}")
    assert template % (*parts, 10, b"{%d}") == lifecycle_bytes.TEXT_END % (*parts, kind, kind, 10, b"{%d}")
    assert (b"response.completed" in template) == (reason is None)

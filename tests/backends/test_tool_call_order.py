"""Chat streams with tool calls leave the gateway one call after another (backends/tool_call_order.py)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from backends.base import CompletionStream, TokenUsage
from backends.errors import UpstreamProtocolError
from backends.tool_call_order import SequentialToolCalls

ENVELOPE = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}, "strict": True}}
    for name in ("a", "b", "c")
]
# Per choice: three calls, arguments cut where a parser would (inside strings, escapes and nesting).
ARGUMENTS = {
    (0, 0): '{"city": "Pa\\"ris", "n": [1, {"x": "}"}]}',
    (0, 1): '{"city": "Rome"}',
    (0, 2): '{"q": "[{\\\\"}',
    (1, 0): "{}",
    (1, 1): '{"deep": {"deeper": ["]", "{"]}}',
    (1, 2): '{"u": "\\u00e9t\\u00e9"}',
}


class Blocks(CompletionStream):
    """A finished upstream's events, one read per block."""

    def __init__(self, blocks: list[bytes]) -> None:
        self.blocks = list(blocks)
        self.closed = False

    async def __anext__(self) -> bytes:
        if not self.blocks:
            raise StopAsyncIteration
        block = self.blocks.pop(0)
        self.finished = not self.blocks
        if self.finished:
            self.usage = TokenUsage(3, 4)
        return block

    async def aclose(self) -> None:
        self.closed = True


def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return b"data: " + orjson.dumps({**ENVELOPE, "choices": choices, **extra}) + b"\n\n"


def fragment(choice: int, call: int, part: str, *, first: bool) -> bytes:
    head: dict[str, Any] = {"id": f"call-{choice}-{call}", "type": "function", "function": {"name": "abc"[call]}}
    tool = {"index": call, **(head if first else {"function": {}})}
    tool["function"]["arguments"] = part
    return event([{"index": choice, "delta": {"tool_calls": [tool]}, "logprobs": None, "finish_reason": None}])


def interleaved() -> list[bytes]:
    """Both choices' three calls, fragments round-robin across calls and choices, 3-4 pieces per call."""
    pieces = {key: [text[i : i + 5] for i in range(0, len(text), 5)] or [""] for key, text in ARGUMENTS.items()}
    out = [event([{"index": c, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]) for c in (0, 1)]
    sent = dict.fromkeys(pieces, 0)
    while any(sent[key] < len(pieces[key]) for key in pieces):
        for key in pieces:  # one piece of every call in turn: call 0, 1, 2 of choice 0, then choice 1's
            if sent[key] < len(pieces[key]):
                out.append(fragment(*key, pieces[key][sent[key]], first=sent[key] == 0))
                sent[key] += 1
    out += [event([{"index": c, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]) for c in (0, 1)]
    return [*out, event([], usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})]


async def relay(blocks: list[bytes]) -> tuple[list[dict[str, Any]], SequentialToolCalls]:
    stream = SequentialToolCalls(Blocks(blocks))
    out = b"".join([block async for block in stream])
    await stream.aclose()
    return [json.loads(e.removeprefix(b"data: ")) for e in out.split(b"\n\n") if e], stream


def calls_in_order(chunks: list[dict[str, Any]], choice: int) -> list[dict[str, Any]]:
    """Every tool-call delta of one choice, in the order the client gets them."""
    return [
        tool
        for chunk in chunks
        for c in chunk["choices"]
        if c["index"] == choice
        for tool in (c["delta"].get("tool_calls") or [])
    ]


async def test_interleaved_calls_in_two_choices_leave_one_after_another() -> None:
    chunks, stream = await relay(interleaved())
    assert stream.finished and stream.usage == TokenUsage(3, 4) and isinstance(stream._inner, Blocks)
    assert stream._inner.closed
    for choice in (0, 1):
        deltas = calls_in_order(chunks, choice)
        order = [d["index"] for d in deltas]
        assert order == sorted(order), order  # never back to an earlier call
        assert sorted(set(order)) == [0, 1, 2]
        for call in (0, 1, 2):
            mine = [d for d in deltas if d["index"] == call]
            first, rest = mine[0], mine[1:]
            assert (first["id"], first["type"], first["function"]["name"]) == (
                f"call-{choice}-{call}",
                "function",
                "abc"[call],
            )
            assert all("id" not in d and "type" not in d and "name" not in d["function"] for d in rest)
            arguments = "".join(d["function"]["arguments"] for d in mine)
            assert arguments == ARGUMENTS[(choice, call)]  # byte for byte
        finishes = [c for chunk in chunks for c in chunk["choices"] if c["index"] == choice and c["finish_reason"]]
        assert [c["finish_reason"] for c in finishes] == ["tool_calls"]
        last = max(i for i, chunk in enumerate(chunks) for c in chunk["choices"] if c["index"] == choice)
        assert chunks[last]["choices"][0]["finish_reason"] == "tool_calls"  # nothing of the choice after it
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7
    assert all(c["id"] == "chatcmpl-x" and c["model"] == "m" for c in chunks)


async def test_the_official_stream_helper_reads_the_reordered_stream() -> None:
    chunks, _ = await relay(interleaved())
    state = ChatCompletionStreamState(input_tools=TOOLS)
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))  # raises on a call closed half-way
    final = state.get_final_completion()
    for choice in final.choices:
        calls = choice.message.tool_calls or []
        assert [c.function.arguments for c in calls] == [ARGUMENTS[(choice.index, i)] for i in range(3)]  # type: ignore[union-attr]
        assert [c.function.parsed_arguments for c in calls] == [  # type: ignore[union-attr]
            json.loads(ARGUMENTS[(choice.index, i)]) for i in range(3)
        ]


async def test_interleaved_input_really_breaks_the_helper() -> None:
    """The premise: relayed as they come, the same fragments fail in the official helper."""
    state = ChatCompletionStreamState(input_tools=TOOLS)
    with pytest.raises(ValueError):  # json.JSONDecodeError: call 0 parsed when call 1 appears
        for block in interleaved():
            state.handle_chunk(ChatCompletionChunk.model_validate_json(block.removeprefix(b"data: ")))


async def test_sequential_calls_stream_live_fragment_by_fragment() -> None:
    """Calls already in order (OpenAI, TGI, Ollama) keep their fragments: later calls are not held to the end."""
    blocks = [
        fragment(0, 0, '{"a": ', first=True),
        fragment(0, 0, "1}", first=False),
        fragment(0, 1, '{"b"', first=True),
        fragment(0, 1, ": 2}", first=False),
        event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]),
    ]
    stream = SequentialToolCalls(Blocks(blocks))
    out = [block async for block in stream]
    assert out == blocks  # byte for byte, read for read


async def test_a_stream_without_tool_calls_is_passed_through_untouched() -> None:
    blocks = [event([{"index": 0, "delta": {"content": 'say "tool_calls"'}, "finish_reason": None}]), b"data: {}\n\n"]
    stream = SequentialToolCalls(Blocks(blocks))
    out = [block async for block in stream]
    assert all(a is b for a, b in zip(out, blocks, strict=True))  # the same objects: no copy, no parse


async def test_held_calls_are_released_when_the_stream_ends_without_a_finish_reason() -> None:
    blocks = [fragment(0, 0, '{"a": ', first=True), fragment(0, 1, "{}", first=True), fragment(0, 0, "1", first=False)]
    chunks, _ = await relay(blocks)
    deltas = calls_in_order(chunks, 0)
    assert [d["index"] for d in deltas] == [0, 0, 1]
    assert deltas[-1] == {
        "index": 1,
        "id": "call-0-1",
        "type": "function",
        "function": {"name": "b", "arguments": "{}"},
    }


def _call_event(index: Any, arguments: str, **head: Any) -> bytes:
    function = {"arguments": arguments, **({"name": head.pop("name")} if "name" in head else {})}
    tool = {"index": index, **head, "function": function}
    return event([{"index": 0, "delta": {"tool_calls": [tool]}, "logprobs": None, "finish_reason": None}])


_FINISH = event([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}])


@pytest.mark.parametrize("indexes", [(0, 2), (5, 3), (7, 1)])
async def test_call_indexes_are_the_clients_in_the_order_calls_leave(indexes: tuple[int, int]) -> None:
    first, second = indexes
    blocks = [
        _call_event(first, '{"a": 1}', id="x", type="function", name="f"),
        _call_event(second, '{"b": 2}', id="y", type="function", name="g"),
        _FINISH,
    ]
    chunks, _ = await relay(blocks)
    assert [(d["index"], d.get("id")) for d in calls_in_order(chunks, 0)] == [(0, "x"), (1, "y")]
    state = ChatCompletionStreamState()  # the SDK's own accumulation (it indexes a list with them)
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    calls = state.get_final_completion().choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("f", '{"a": 1}'), ("g", '{"b": 2}')]  # type: ignore[union-attr]


async def test_a_call_id_and_name_repeated_on_every_fragment_leave_once() -> None:
    blocks = [
        _call_event(0, '{"city', id="x", type="function", name="get_weather"),
        _call_event(0, '": "Paris"}', id="x", type="function", name="get_weather"),
        _call_event(1, "{", id="y", type="function", name="get_"),
        _call_event(1, "}", name="time"),  # a name streamed in pieces: the rest passes
        _FINISH,
    ]
    chunks, _ = await relay(blocks)
    deltas = calls_in_order(chunks, 0)
    assert deltas[1] == {"index": 0, "function": {"arguments": '": "Paris"}'}}
    assert deltas[3] == {"index": 1, "function": {"arguments": "}", "name": "time"}}


@pytest.mark.parametrize("index", [None, "0", 1.0, True])
async def test_a_call_fragment_without_an_integer_index_is_an_error(index: Any) -> None:
    stream = SequentialToolCalls(Blocks([_call_event(index, "{}", id="x", type="function", name="f"), _FINISH]))
    with pytest.raises(UpstreamProtocolError, match="integer index"):
        async for _ in stream:
            pass

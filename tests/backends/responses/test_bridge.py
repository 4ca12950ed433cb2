"""The chat bridge: a Responses request as the chat request that means the same, and chat answers and
streams as Responses (backends/responses: to_chat, capabilities, answer, events)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
import pytest

from backends.base import BridgeChatCall, CompletionStream, ResponsesCall, TokenUsage
from backends.errors import UpstreamProtocolError
from backends.mock.capabilities import MOCK_RESPONSES
from backends.native.ollama_capabilities import OLLAMA_RESPONSES
from backends.native.tgi_capabilities import TGI_RESPONSES
from backends.openai.capabilities import OPENAI_RESPONSES, OPENAI_RESPONSES_UPSTREAM_STORE
from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.bridge import chat_call_of
from backends.responses.capabilities import chat_request_of
from backends.responses.events import ChatResponseEvents
from backends.vllm.capabilities import vllm_responses_capabilities
from backends.vllm.versions import VLLMChatFeatures
from schemas.responses import ResponsesRequest

NS = {
    "type": "namespace",
    "name": "agents",
    "description": "sub-agents",
    "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
}
FN = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}


def req(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **fields})


def chat_of(request: ResponsesRequest) -> dict[str, Any]:
    chat, _ = chat_request_of(request)
    return chat.upstream_fields()


def test_instructions_lead_and_a_string_input_is_the_user_message() -> None:
    chat = chat_of(req(instructions="Be brief", input="hi", max_output_tokens=9, temperature=0.2))
    assert chat["messages"] == [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 9 and chat["temperature"] == 0.2
    assert "stream" not in chat


def test_calls_join_the_assistant_message_they_follow_and_outputs_become_tool_messages() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21C"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
    ]
    messages = chat_of(req(input=items, tools=[FN, NS]))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]  # the reasoning item is not sent
    assistant = messages[1]
    assert assistant["content"] == [{"type": "text", "text": "Checking."}]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_weather", "agents__spawn"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "ok"}]}


def test_tools_and_choices_one_to_one() -> None:
    request = req(
        input="x",
        tools=[FN, NS, {"type": "web_search"}],
        tool_choice={"type": "function", "name": "spawn"},
        parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        reasoning={"effort": "low", "summary": "auto"},
        include=["message.output_text.logprobs"],
        top_logprobs=3,
        stream=True,
    )
    request.omit_builtin_tools()
    chat = chat_of(request)
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_weather", "agents__spawn"]  # web_search omitted
    assert chat["tools"][0]["function"]["strict"] is True
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "agents__spawn"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"]["json_schema"] == {"name": "w", "schema": {"type": "object"}, "strict": True}
    assert chat["reasoning_effort"] == "low"
    assert chat["logprobs"] is True and chat["top_logprobs"] == 3
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_auto_without_tools_is_chats_default() -> None:
    assert "tool_choice" not in chat_of(req(input="x", tool_choice="auto"))


@pytest.mark.parametrize(
    ("table", "fields", "param", "says"),
    [
        (MOCK_RESPONSES, {"tools": [{"type": "web_search"}]}, "tools", "web_search"),
        (MOCK_RESPONSES, {"background": True}, "background", "background"),
        (MOCK_RESPONSES, {"input": [{"type": "item_reference", "id": "x"}]}, "input", "item_reference"),
        (OLLAMA_RESPONSES, {"tools": [FN], "tool_choice": "required"}, "tool_choice", "required"),
        (TGI_RESPONSES, {"include": ["message.output_text.logprobs"], "top_logprobs": 9}, "top_logprobs", "above 5"),
        (
            vllm_responses_capabilities(VLLMChatFeatures.of(None)),
            {"reasoning": {"effort": "low"}},
            "reasoning.effort",
            "",
        ),
        (
            MOCK_RESPONSES,
            {"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
            "input[0].content[0]",
            "chat",
        ),
        (OPENAI_RESPONSES, {"top_k": 5}, "top_k", "vLLM extra"),
        # a function or custom tool's options only OpenAI runs (request_forms reads them per tool's type)
        (MOCK_RESPONSES, {"tools": [FN, {**FN, "name": "g", "defer_loading": True}]}, "tools", "defer_loading"),
        (MOCK_RESPONSES, {"tools": [{**FN, "allowed_callers": ["direct"]}]}, "tools", "allowed_callers"),
        (MOCK_RESPONSES, {"tools": [{**FN, "output_schema": {"type": "object"}}]}, "tools", "output_schema"),
    ],
)
def test_refusals_name_the_responses_field(table: Any, fields: dict[str, Any], param: str, says: str) -> None:
    error = table.refusal(req(input=fields.pop("input", "x"), **fields), "b", "kind")
    assert error is not None and error.param == param and says in error.message


EMPTY = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"role": "user", "content": []}], {"role": "user", "content": ""}),
        ([{"type": "message", "role": "system", "content": []}, *EMPTY[:1]], {"role": "system", "content": ""}),
        ([{"role": "developer", "content": []}, *EMPTY[:1]], {"role": "developer", "content": ""}),
        ([*EMPTY, {"role": "user", "content": "and?"}], {"role": "assistant", "content": ""}),
        (
            [*EMPTY[:1], {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": []}],
            {"role": "tool", "tool_call_id": "c", "content": ""},
        ),
    ],
)  # fmt: skip
def test_an_empty_content_array_is_an_empty_message(items: list[Any], message: dict[str, Any]) -> None:
    """OpenAI's schema sets no minimum on a message's parts or a tool output's: an empty array is an
    empty message, sent as chat's empty string (chat wants at least one part in an array)."""
    assert message in chat_of(req(input=items, tools=[{"type": "function", "name": "f"}]))["messages"]


U = {"role": "user", "content": "hi"}
CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
IMAGE = {"type": "input_image", "image_url": "https://x/y.png"}


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"input": [U, CALL, {"type": "function_call_output", "call_id": "c", "output": [IMAGE]}]},
         "input[2].output[0]", "input_image"),
        ({"input": [U, {"type": "custom_tool_call", "call_id": "c", "name": "f", "input": "x"},
                    {"type": "custom_tool_call_output", "call_id": "c",
                     "output": [{"type": "input_text", "text": "a"}, {"type": "input_file", "file_id": "f"}]}]},
         "input[2].output[1]", "input_file"),
        ({"instructions": "be brief", "input": [U, {"type": "reasoning", "summary": []}, CALL,
                                                 {"role": "developer", "content": [IMAGE]}]},
         "input[3].content[0]", "developer"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "reasoning"),
        ({"input": "x", "tools": [FN],
          "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp", "server_label": "s"}]}},
         "tool_choice", "no function or custom tool"),
        # A namespace function's flattened name past chat's 64 characters: that function, by its path.
        ({"input": "x", "tools": [FN, {"type": "function", "name": "h"}, {**NS, "name": "n" * 40, "tools": [
            FN, {"type": "function", "name": "f" * 40}]}]},
         "tools[2].tools[1].name", "n" * 40 + "__" + "f" * 40),
        ({"input": "x", "tools": [{**NS, "tools": [{"type": "function", "name": f"g{i}"} for i in range(100)]},
                                  *({"type": "function", "name": f"f{i}"} for i in range(40))]},
         "tools", "each namespace function is a tool"),
    ],
)  # fmt: skip
def test_what_chat_cannot_carry_is_named_by_the_clients_path(fields: dict[str, Any], param: str, says: str) -> None:
    """Never a 500 (a tool output's image had no text to read) nor the chat request's path
    (``messages.0.system.content.str``): the item and part the client wrote."""
    error = MOCK_RESPONSES.refusal(req(**fields), "b", "mock")
    assert error is not None and error.param == param and says in error.message, error
    assert "messages." not in error.message


@pytest.mark.parametrize(
    ("own", "param", "says"),
    [
        ([{"role": "user", "content": "go on"}], "previous_response_id", "an earlier turn's"),
        ([{"role": "system", "content": [IMAGE]}], "input[0].content[0]", "a system message"),
    ],
)
def test_what_previous_response_id_put_ahead_is_named_by_that_field(
    own: list[dict[str, Any]], param: str, says: str
) -> None:
    """The client never wrote the expanded history's indexes: an earlier turn's item is the
    previous_response_id's, the client's own items keep their own indexes."""
    history = [U, CALL, {"type": "function_call_output", "call_id": "c", "output": [IMAGE]}]
    ok = [U, CALL, {"type": "function_call_output", "call_id": "c", "output": "fine"}]
    request = req(input=own, tools=[{"type": "function", "name": "f"}])
    earlier = req(input=history if param == "previous_response_id" else ok).input
    assert isinstance(earlier, list) and isinstance(request.input, list)
    expanded = request.with_input([*earlier, *request.input])  # as ResponsesTurns.begin expands it
    expanded.keep_stored_input([{"id": f"msg_{i}"} for i in range(len(own))])
    error = MOCK_RESPONSES.refusal(expanded, "b", "mock")
    assert error is not None and error.param == param and says in error.message, error


def test_omit_is_not_a_refusal_but_forcing_an_omitted_tool_is() -> None:
    request = req(input="x", tools=[{"type": "web_search"}])
    request.omit_builtin_tools()
    assert MOCK_RESPONSES.refusal(request, "b", "mock") is None
    forced = req(input="x", tools=[{"type": "file_search"}], tool_choice={"type": "file_search"})
    forced.omit_builtin_tools()
    error = MOCK_RESPONSES.refusal(forced, "b", "mock")
    assert error is not None and error.param == "tool_choice"


def test_openai_takes_builtin_tools() -> None:
    request = req(input="x", tools=[{"type": "web_search"}, {"type": "mcp", "server_label": "s"}])
    assert OPENAI_RESPONSES.refusal(request, "b", "openai") is None
    # background needs the upstream's own store: served where the operator keeps it (upstream_store)
    background = req(input="x", background=True)
    assert OPENAI_RESPONSES_UPSTREAM_STORE.refusal(background, "b", "openai") is None
    refused = OPENAI_RESPONSES.refusal(background, "b", "openai")
    assert refused is not None and refused.param == "background"


# --- answers ---------------------------------------------------------------------------------------


def _chat_body(message: dict[str, Any], finish: str = "stop") -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "logprobs": None, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }
    return orjson.dumps(body)


def test_the_chat_attempt_is_the_dataclass_its_init_makes() -> None:
    """chat_call_of sets BridgeChatCall's slots itself: every field (an unset one would raise), each the
    attempt's own."""
    request = req(input="x")
    trace: Any = object()
    for call in (ResponsesCall(request, "up", "public", "rid-1", trace), ResponsesCall(request, "u2", "p2", "rid-2")):
        chat_call, frame = chat_call_of(call)
        chat = chat_request_of(request)[0]
        expected = BridgeChatCall(chat, call.upstream_model, call.public_model, call.request_id, call.trace)
        assert type(chat_call) is BridgeChatCall and chat_call == expected
        assert all(getattr(chat_call, f.name) is getattr(expected, f.name) for f in dataclasses.fields(expected))
        assert frame.envelope("completed", [])["model"] == call.public_model


def test_a_chat_answer_as_a_response() -> None:
    request = req(input="x", tools=[NS], reasoning={"summary": "auto"})
    _, names = chat_request_of(request)
    frame = ResponseFrame(request, "public", names)
    calls = [{"id": "call_1", "type": "function", "function": {"name": "agents__spawn", "arguments": "{}"}}]
    result, response = response_from_chat(
        _chat_body({"content": None, "reasoning_content": "hmm", "tool_calls": calls}, "tool_calls"), frame, "b"
    )
    assert result.usage == TokenUsage(5, 7) and response["status"] == "completed" and response["model"] == "public"
    reasoning, call = response["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "hmm"}]  # asked for: the whole text
    assert call == {**call, "type": "function_call", "call_id": "call_1", "name": "spawn", "namespace": "agents"}
    assert response["usage"]["input_tokens"] == 5 and response["usage"]["total_tokens"] == 12


def test_a_kept_chat_answer_is_not_parsed_again() -> None:
    """The family's chat result hands over its object and counts (``answer``, ``usage``): the body is not read."""
    request = req(input="x")
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    answer = orjson.loads(_chat_body({"content": "abc"}, "stop"))
    result, response = response_from_chat(b"", frame, "b", answer, TokenUsage(5, 7, cached_tokens=2))
    assert result.usage == TokenUsage(5, 7, cached_tokens=2) and result.answer is response
    assert response["output"][0]["content"][0]["text"] == "abc" and response["usage"]["total_tokens"] == 12
    _, parsed = response_from_chat(_chat_body({"content": "abc"}, "stop"), frame, "b")  # the body read instead
    parsed["output"][0]["id"] = response["output"][0]["id"]  # a new item id each time
    assert response == parsed


def test_a_cut_answer_is_incomplete() -> None:
    request = req(input="x", max_output_tokens=7)
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    _, response = response_from_chat(_chat_body({"content": "abc"}, "length"), frame, "b")
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_an_answer_holding_an_integer_beyond_64_bits_is_written_exactly() -> None:
    """What orjson cannot write (an upstream's call id past 64 bits) is written by the exact serialiser."""
    request = req(input="x", tools=[FN])
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    answer = orjson.loads(_chat_body({"content": None}, "tool_calls"))
    call = {"id": 2**70, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    answer["choices"][0]["message"]["tool_calls"] = [call]
    result, response = response_from_chat(json.dumps(answer).encode(), frame, "b")
    assert response["output"][0]["call_id"] == 2**70
    assert b'"call_id":1180591620717411303424,' in result.body and json.loads(result.body) == response


# --- streams ----------------------------------------------------------------------------------------


class ChatChunks(CompletionStream):
    """A chat stream of the given chunks (each one read), optionally failing after them."""

    def __init__(self, chunks: list[dict[str, Any]], fail: bool = False) -> None:
        self._reads = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]
        self._fail = fail
        self.closed = False

    async def __anext__(self) -> bytes:
        if self._reads:
            return self._reads.pop(0)
        if self._fail:
            raise UpstreamProtocolError(
                "the upstream failed mid-stream: engine died", backend="b", reason="stream_error"
            )
        self.finished = True
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


async def _events(stream: ChatResponseEvents) -> list[dict[str, Any]]:
    out = b""
    async for chunk in stream:
        out += chunk
    events = []
    for raw in out.split(b"\n\n"):
        if raw:
            kind, data = raw.split(b"\n", 1)
            event = orjson.loads(data.removeprefix(b"data: "))
            assert kind == b"event: " + event["type"].encode()
            events.append(event)
    return events


async def test_a_chat_stream_as_responses_events() -> None:
    request = req(input="x", tools=[FN], stream=True)
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    calls = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]
    chunks = [
        _delta({"role": "assistant", "reasoning_content": "let me "}),
        _delta({"reasoning_content": "see"}),
        _delta({"content": "Checking"}),
        _delta({"tool_calls": calls}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, "tool_calls"),
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 6},
        },
    ]
    stream = ChatResponseEvents(ChatChunks(chunks), frame, "b")
    events = await _events(stream)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert kinds[-1] == "response.completed"
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][2]["arguments"] == '{"city":"Paris"}'
    assert final["usage"]["output_tokens"] == 6 and stream.usage == TokenUsage(4, 6)
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [d["item"] for d in done] == final["output"]  # what was streamed is what completed
    assert stream.finished


async def test_a_failure_midway_ends_in_response_failed_with_what_was_produced() -> None:
    request = req(input="x", stream=True)
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    stream = ChatResponseEvents(
        ChatChunks([_delta({"content": "Hel"}), _delta({"content": "lo"})], fail=True), frame, "b"
    )
    got = b""
    with pytest.raises(UpstreamProtocolError) as err:
        async for chunk in stream:
            got += chunk
    tail = stream.failed_event(err.value)
    event = orjson.loads(tail.split(b"data: ", 1)[1])
    assert event["type"] == "response.failed"
    assert event["sequence_number"] == got.count(b"event: ")  # numbered after the last event sent
    response = event["response"]
    assert response["status"] == "failed" and "engine died" in response["error"]["message"]
    assert response["output"][0]["content"][0]["text"] == "Hello" and response["output"][0]["status"] == "incomplete"
    assert stream.snapshot("cancelled") == response  # the store keeps the failed response


async def test_a_client_that_left_is_stored_cancelled() -> None:
    request = req(input="x", stream=True)
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    stream = ChatResponseEvents(ChatChunks([_delta({"content": "Hel"}), _delta({"content": "lo"})]), frame, "b")
    await stream.__anext__()
    await stream.aclose()
    snapshot = stream.snapshot("cancelled")
    assert snapshot is not None and snapshot["status"] == "cancelled"
    assert snapshot["output"][0]["content"][0]["text"] == "Hel"

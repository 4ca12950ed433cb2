"""vLLM non-streamed answers keep integers beyond 64 bits (``created``, ``token_ids``, usage) as integers.

The adapter rebuilds vLLM's body in OpenAI's shape (``normalise_body``); orjson read
integers outside [-2**63, 2**64) as floats, so they reached the client as ``1.8446744073709552e+19``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import respx

from backends.base import ChatCall, UpstreamCall
from backends.vllm.adapter import VLLMBackend
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig

URL = "http://vllm.test/v1"
BIG = 18446744073709551616  # 2**64
NEG = -9223372036854775809  # -2**63 - 1


def backend() -> VLLMBackend:
    data: dict[str, Any] = {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx", "version": "0.32.0"}
    return VLLMBackend(VLLMBackendConfig.model_validate(data))


def completion_body() -> bytes:
    choice = {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop", "token_ids": [BIG, NEG, 7]}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return json.dumps(
        {"id": "c", "object": "text_completion", "created": BIG, "model": "up", "choices": [choice], "usage": usage}
    ).encode()


def chat_body() -> bytes:
    message = {"role": "assistant", "content": "hi", "tool_calls": []}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return json.dumps(
        {"id": "c", "object": "chat.completion", "created": NEG, "model": "up", "choices": [choice], "usage": usage}
    ).encode()


async def test_completion_keeps_big_integers() -> None:
    with respx.mock(assert_all_mocked=True) as mock:
        mock.post(f"{URL}/completions").mock(return_value=httpx.Response(200, content=completion_body()))
        request = CompletionRequest.model_validate({"model": "m", "prompt": "x", "return_token_ids": True})
        b = backend()
        result = await b.complete(UpstreamCall(request, "up", "m", "r"))
        await b.close()
    obj = json.loads(result.body)
    assert (obj["created"], obj["model"], obj["choices"][0]["token_ids"]) == (BIG, "m", [BIG, NEG, 7])
    assert b"e+" not in result.body


async def test_chat_keeps_big_integers() -> None:
    with respx.mock(assert_all_mocked=True) as mock:
        mock.post(f"{URL}/chat/completions").mock(return_value=httpx.Response(200, content=chat_body()))
        request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
        b = backend()
        result = await b.chat(ChatCall(request, "up", "m", "r"))
        await b.close()
    obj = json.loads(result.body)
    assert (obj["created"], obj["model"], obj["choices"][0]["message"]["content"]) == (NEG, "m", "hi")
    assert result.usage is not None and result.usage.prompt_tokens == 1

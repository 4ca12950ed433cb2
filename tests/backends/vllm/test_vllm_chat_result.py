"""A vLLM chat answer handed to the Responses bridge as vLLM sent it (backends/vllm/chat.py chat_result,
``for_client`` false) gives the very Response the answer rebuilt for a client gives: either reasoning
name, an empty tool_calls list, the "" content beside calls, vLLM's own finish reasons; abort and error
are still no answer."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from backends.base import BridgeChatCall, ChatCall
from backends.errors import UpstreamGenerationError
from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.capabilities import chat_request_of
from backends.vllm.chat import chat_result
from schemas.responses import ResponsesRequest

CALL = {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
LOGPROBS = {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]}
MESSAGES: list[tuple[dict[str, Any], Any]] = [
    ({"role": "assistant", "content": "Hi", "tool_calls": [], "reasoning_content": None}, "stop"),  # 0.12-0.15
    ({"role": "assistant", "content": "Hi", "reasoning": "think", "reasoning_content": "think"}, "length"),
    ({"role": "assistant", "content": "Hi", "reasoning": "think"}, "repetition"),  # 0.16+, 0.33's finish
    ({"role": "assistant", "content": "", "tool_calls": [CALL]}, "tool_calls"),  # a forced call's ""
    ({"role": "assistant", "content": None, "refusal": "no"}, None),
    ({"role": "assistant", "content": "Hi"}, 7),
]


def answer(message: dict[str, Any], finish: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "upstream-id",
        "choices": [{"index": 0, "message": message, "logprobs": LOGPROBS, "finish_reason": finish,
                     "stop_reason": None, "token_ids": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": None},
        "system_fingerprint": "vllm-0.32.0-x", "kv_transfer_params": None,
    }  # fmt: skip


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "output": [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]}


@pytest.mark.parametrize(("message", "finish"), MESSAGES)
def test_the_bridge_gets_the_response_a_rebuilt_answer_gives(message: dict[str, Any], finish: Any) -> None:
    request = ResponsesRequest.model_validate(
        {"model": "public", "input": "x", "tools": [TOOL], "include": ["message.output_text.logprobs"],
         "reasoning": {"summary": "auto"}}
    )  # fmt: skip
    chat, names = chat_request_of(request)
    frame = ResponseFrame(request, "public", names)
    for_client = chat_result(answer(copy.deepcopy(message), finish), ChatCall(chat, "u", "public", "r"), "b", 1)
    assert orjson.loads(for_client.body) == for_client.answer and for_client.answer["model"] == "public"
    bridged = chat_result(answer(copy.deepcopy(message), finish), BridgeChatCall(chat, "u", "public", "r"), "b", 1)
    assert bridged.body == b"" and bridged.usage == for_client.usage  # nothing serialised for the gateway itself
    _, want = response_from_chat(for_client.body, frame, "b")
    _, got = response_from_chat(bridged.body, frame, "b", bridged.answer, bridged.usage)
    assert without_ids(got) == without_ids(want)


@pytest.mark.parametrize(("finish", "retryable"), [("abort", True), ("error", False)])
def test_abort_and_error_are_no_answer_for_the_bridge_either(finish: str, retryable: bool) -> None:
    request = ResponsesRequest.model_validate({"model": "public", "input": "x"})
    chat, _ = chat_request_of(request)
    with pytest.raises(UpstreamGenerationError) as caught:
        chat_result(answer({"role": "assistant", "content": "Hi"}, finish), BridgeChatCall(chat, "u", "p", "r"), "b", 1)
    assert caught.value.retryable is retryable

"""llama.cpp's server, ``POST /v1/chat/completions``, as OpenAI chat.

Request, defaults made explicit (llama.cpp's own: temperature 0.8, top_p 0.95, top_k 40,
min_p 0.05, ``parallel_tool_calls`` false, ``top_logprobs`` 20):

- sampling as completions do (``explicit_sampling``): ``temperature`` 1, ``top_p`` 1, ``top_k``
  0 (off), ``min_p`` 0, ``repeat_penalty`` 1, penalties 0 unless the client set them; ``seed``
  as a non-negative 32-bit value (llama.cpp reads -1 as "random");
- ``parallel_tool_calls`` always sent with tools (OpenAI's default is true, llama.cpp's false);
- ``tool_choice`` as a string only: llama.cpp reads an object as ``"auto"``, so a named choice
  is refused (table) instead of being downgraded;
- ``top_logprobs`` always sent with ``logprobs`` (at least 1: with 0 llama.cpp returns no
  probabilities at all; the gateway cuts the alternatives to what was asked);
- ``logit_bias`` as ``[[token_id, bias], ...]`` (every build reads that form); ``n`` is fanned
  out by the gateway (llama.cpp answers 500 "Only one completion choice is allowed");
- ``stream_options.include_usage`` always asked for (builds before PR #15444 send no usage
  otherwise); the client sees the usage chunk only when it asked.

Response: OpenAI's shape (``backends.native.chat_openai_shaped``); finish reasons ``stop``,
``length``, ``tool_calls``; ids are the gateway's, call ids llama.cpp's when it sends them.
"""

from __future__ import annotations

from typing import Any

from backends.native.chat_openai_shaped import OpenAIShapedChat, openai_messages, openai_tools
from backends.native.common import explicit_sampling, logit_bias_pairs, native_seed, stops_of
from backends.native.llamacpp_capabilities import LLAMACPP_CHAT
from schemas.chat import ChatCompletionRequest

__all__ = ["LlamaCppChat"]


class LlamaCppChat(OpenAIShapedChat):
    table = LLAMACPP_CHAT
    finishes = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}

    def payload(self, request: ChatCompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": openai_messages(request),
            "stream": stream,
            **explicit_sampling(request),
        }
        if request.max_output_tokens is not None:
            body["max_tokens"] = request.max_output_tokens
        if request.seed is not None:
            body["seed"] = native_seed(request.seed)
        if request.stop is not None:
            body["stop"] = stops_of(request)
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = max(request.top_logprobs or 0, 1)
        if request.logit_bias:
            body["logit_bias"] = logit_bias_pairs(request.logit_bias)
        if request.ignore_eos:
            body["ignore_eos"] = True
        tools = openai_tools(request, strict=True)
        if tools is not None:
            body["tools"] = tools
            body["tool_choice"] = request.tool_choice if isinstance(request.tool_choice, str) else "auto"
            body["parallel_tool_calls"] = request.parallel_tool_calls is not False
        if request.response_format is not None and request.response_format.type != "text":
            body["response_format"] = request.response_format.model_dump(exclude_none=True, by_alias=True)
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

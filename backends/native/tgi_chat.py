"""TGI's Messages API (``POST /v1/chat/completions``, v3.3.7) as OpenAI chat.

Request, every trap of spec chat-protocol.md (TGI) closed:

- ``model: "tgi"`` always: any other value selects a LoRA adapter of that name (2.2.0+);
- sampling: ``temperature: 0`` (or ``top_p: 0``) is greedy; otherwise ``temperature`` (1 when
  unset) and ``top_p`` only below 1 (TGI refuses 1.0); ``seed`` as TGI's u64;
- ``presence_penalty`` is refused (table): TGI would turn it into
  ``repetition_penalty = presence_penalty + 2``, a different and much stronger penalty;
- ``n`` and ``logit_bias`` are accepted by TGI and not used: ``n`` is fanned out by the
  gateway, ``logit_bias`` refused (table);
- ``response_format`` as TGI's grammar ``{"type": "json", "value": schema}`` (``json_object``:
  any object); refused together with ``tools`` (TGI: "Grammar and tools are mutually exclusive");
- tools: TGI constrains a call with a JSON grammar and makes **at most one** call per reply.
  ``parallel_tool_calls: false`` is therefore always honoured; ``parallel_tool_calls: true``
  with ``tool_choice: "required"`` (the client insists on calls and allows several) is
  refused by name, since only one can come back. ``strict`` is not sent (TGI has no such key:
  its grammar holds every call's arguments to the function's ``properties`` and ``required``
  with no extra keys, strict or not); a strict tool whose parameters lean on anything else at
  the top (``$defs``, ``anyOf``, ...) is refused by name, since TGI's grammar drops it;
  ``tool_choice`` is sent explicitly;
- ``stream_options.include_usage`` is always asked for (2.3.0+), so the gateway has counts
  for every stream; the client sees the usage chunk only when it asked.

Response: ``finish_reason`` ``eos_token`` / ``stop_sequence`` / ``stop`` -> ``stop``, ``length``
-> ``length``, ``tool_calls`` when a call was made; ids are the gateway's (``chatcmpl-``;
TGI's are ``""``), call ids minted (TGI's are ``""`` or ``"0"``).
"""

from __future__ import annotations

from typing import Any

from backends.emulation.best_of import is_greedy
from backends.native.chat_openai_shaped import OpenAIShapedChat, openai_messages, openai_tools
from backends.native.common import stops_of
from backends.native.tgi_capabilities import TGI_CHAT
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import FunctionTool, JSONSchemaResponseFormat

__all__ = ["TGIChat"]

# The top-level keys of a function's parameters TGI's tool grammar keeps or needs not keep
# (router/src/infer/tool_grammar.rs copies properties and required, sets additionalProperties false).
_GRAMMAR_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "title", "description", "$schema"})


class TGIChat(OpenAIShapedChat):
    table = TGI_CHAT
    finishes = {"eos_token": "stop", "stop_sequence": "stop", "stop": "stop", "length": "length"}
    trusts_call_ids = False

    def check(self, request: ChatCompletionRequest) -> None:
        super().check(request)
        if request.parallel_tool_calls and request.tool_choice == "required":
            raise self.refuse(
                "parallel_tool_calls",
                'TGI makes at most one tool call per reply, so "required" with parallel calls cannot be honoured '
                "(send parallel_tool_calls: false)",
            )
        for tool in request.tools or ():
            if isinstance(tool, FunctionTool) and tool.function.strict:
                dropped = sorted(set(tool.function.parameters or {}) - _GRAMMAR_KEYS)
                if dropped:
                    raise self.refuse(
                        "tools",
                        f"TGI's tool grammar keeps only properties and required, so strict cannot hold "
                        f"{', '.join(dropped)} of {tool.function.name}'s parameters",
                    )

    def payload(self, request: ChatCompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "tgi", "messages": openai_messages(request), "stream": stream}
        if request.max_output_tokens is not None:
            body["max_tokens"] = request.max_output_tokens
        if is_greedy(request.temperature) or request.top_p == 0:
            body["temperature"] = 0.0  # TGI: greedy
        else:
            body["temperature"] = 1.0 if request.temperature is None else request.temperature
            if request.top_p is not None and request.top_p < 1:
                body["top_p"] = request.top_p
            if request.seed is not None:
                body["seed"] = request.seed % 2**64
        if request.frequency_penalty:
            body["frequency_penalty"] = request.frequency_penalty
        if request.stop is not None:
            body["stop"] = stops_of(request)
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs or 0
        tools = openai_tools(request, strict=False)
        if tools is not None:
            body["tools"] = tools
            choice = request.tool_choice or "auto"
            body["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump(exclude_none=True)
        response_format = request.response_format
        if isinstance(response_format, JSONSchemaResponseFormat):
            schema = response_format.json_schema.schema_
            body["response_format"] = {"type": "json", "value": schema if schema is not None else {}}
        elif response_format is not None and response_format.type == "json_object":
            body["response_format"] = {"type": "json", "value": {"type": "object"}}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

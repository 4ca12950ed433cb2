"""What a span says about a request, in the OpenTelemetry GenAI conventions (docs/tracing.md names the version).

Built only for a recorded request, once, at its end: a dict the exporter thread turns into a
span. Nothing here imports OpenTelemetry. Content (prompts, completions, tool arguments and
definitions) is read only when ``telemetry.capture_content`` is on; nothing else in a request
body ever becomes an attribute, and no header but ``User-Agent`` is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

__all__ = [
    "OPERATIONS",
    "PROVIDERS",
    "error_type",
    "finish_reasons_in",
    "input_messages",
    "output_messages",
    "request_attributes",
    "response_attributes",
    "stream_output",
]

# ``gen_ai.operation.name`` per served endpoint, keyed by ``Endpoint`` value (a test checks that every
# endpoint has one). The Responses API is ``chat`` with ``openai.api.type`` ``responses`` (the
# conventions' OpenAI page); rerank and the tokenizer have no well-known value, so they keep their own names.
OPERATIONS: Mapping[str, str] = MappingProxyType(
    {
        "completions": "text_completion",
        "chat": "chat",
        "responses": "chat",
        "embeddings": "embeddings",
        "rerank": "rerank",
        "tokenize": "tokenize",  # vLLM's tokenizer API: no well-known value either
        "detokenize": "detokenize",
    }
)
API_TYPES: Mapping[str, str] = MappingProxyType({"chat": "chat_completions", "responses": "responses"})

# ``gen_ai.provider.name`` per backend type: the conventions' well-known value where one applies,
# otherwise the server's own name (a custom value, as the conventions allow).
PROVIDERS: Mapping[str, str] = MappingProxyType(
    {
        "openai": "openai",
        "vllm": "vllm",
        "vllm-pool": "vllm",
        "tgi": "tgi",
        "tei": "tei",
        "ollama": "ollama",
        "llamacpp": "llama.cpp",
        "mock": "completions-gateway.mock",
    }
)

# (attribute, request field) copied when set; bounded numbers and words only, never text.
_REQUEST_FIELDS = (
    ("gen_ai.request.temperature", "temperature"),
    ("gen_ai.request.top_p", "top_p"),
    ("gen_ai.request.top_k", "top_k"),
    ("gen_ai.request.frequency_penalty", "frequency_penalty"),
    ("gen_ai.request.presence_penalty", "presence_penalty"),
    ("gen_ai.request.seed", "seed"),
    ("gen_ai.embeddings.dimension.count", "dimensions"),
    ("gen_ai.request.reasoning.level", "reasoning_effort"),
    ("gen_ai.request.previous_response.id", "previous_response_id"),
)
_FINISH = re.compile(rb'"finish_reason":\s*"([a-z_]{1,32})"')
_SCALAR = (bool, int, float, str)
# Per request type, the _REQUEST_FIELDS it has: a pydantic model answers a missing attribute slowly.
_FIELDS_OF: dict[type, tuple[tuple[tuple[str, str], ...], frozenset[str]]] = {}


def _fields_of(kind: type) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
    """(the _REQUEST_FIELDS a request type has, all its field names), computed once per type."""
    fields = _FIELDS_OF.get(kind)
    if fields is None:
        names = frozenset(getattr(kind, "model_fields", None) or ())
        fields = _FIELDS_OF[kind] = (tuple((a, n) for a, n in _REQUEST_FIELDS if n in names), names)
    return fields


def request_attributes(request: Any, attrs: dict[str, Any]) -> None:
    """The GenAI request attributes of ``request`` (any endpoint's validated type) into ``attrs``."""
    model = getattr(request, "model", None)
    if isinstance(model, str):
        attrs["gen_ai.request.model"] = model
    if getattr(request, "output_limit_set", False):
        limit = getattr(request, getattr(request, "output_limit_param", "max_tokens"), None)
        if isinstance(limit, int):
            attrs["gen_ai.request.max_tokens"] = limit
    fields, names = _fields_of(type(request))
    for attribute, name in fields:
        value = getattr(request, name)
        if value is not None and isinstance(value, _SCALAR):
            attrs[attribute] = value
    n = request.n if "n" in names else None
    if isinstance(n, int) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    stop = request.stop if "stop" in names else None
    if isinstance(stop, str):
        attrs["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        attrs["gen_ai.request.stop_sequences"] = [s for s in stop if isinstance(s, str)]
    if "stream" in names and request.stream:
        attrs["gen_ai.request.stream"] = True
    fmt = request.encoding_format if "encoding_format" in names else None
    if isinstance(fmt, str):
        attrs["gen_ai.request.encoding_formats"] = [fmt]


def finish_reasons_in(data: bytes) -> list[str]:
    """Every ``finish_reason`` value in a body or stream chunk, in order (a byte scan: no parse)."""
    return [m.decode() for m in _FINISH.findall(data)]


def response_attributes(body: bytes, attrs: dict[str, Any], *, capture: bool) -> None:
    """``gen_ai.response.id`` and finish reasons (and, with ``capture``, the output) of a whole JSON answer."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(obj, dict):
        return
    response_id = obj.get("id")
    if isinstance(response_id, str):
        attrs["gen_ai.response.id"] = response_id[:256]
    choices = obj.get("choices")
    if isinstance(choices, list):
        reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
        attrs["gen_ai.response.finish_reasons"] = [r if isinstance(r, str) else "error" for r in reasons]
        if capture:
            attrs["gen_ai.output.messages"] = output_messages(choices)
    elif capture and "output" in obj:  # a Responses answer
        attrs["gen_ai.output.messages"] = orjson.dumps(obj["output"]).decode()


def _parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One message's content and tool calls as the conventions' parts."""
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            function = call.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            parts.append({"type": "tool_call", "id": call.get("id"), "name": name, "arguments": arguments})
    if message.get("role") == "tool":
        parts = [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}]
    return parts


def input_messages(request: Any) -> str | None:
    """``gen_ai.input.messages`` (JSON) of a request; only called with ``capture_content`` on."""
    messages = getattr(request, "messages", None)
    if isinstance(messages, list):
        dumped = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else m for m in messages]
        out = [{"role": m.get("role"), "parts": _parts(m)} for m in dumped if isinstance(m, dict)]
        return orjson.dumps(out).decode()
    prompt = getattr(request, "prompt", None)
    if prompt is not None:
        prompts = [prompt] if isinstance(prompt, str) or not isinstance(prompt[0], str) else prompt
        out = [{"role": "user", "parts": [{"type": "text", "content": p}]} for p in prompts]
        return orjson.dumps(out).decode()
    for name in ("input", "query"):  # Responses, embeddings, rerank
        value = getattr(request, name, None)
        if value is not None:
            return orjson.dumps(value, default=lambda v: v.model_dump(exclude_none=True)).decode()
    return None


def tool_definitions(request: Any) -> str | None:
    tools = getattr(request, "tools", None)
    if not tools:
        return None
    return orjson.dumps(tools, default=lambda v: v.model_dump(exclude_none=True)).decode()


def output_messages(choices: list[Any]) -> str:
    """``gen_ai.output.messages`` (JSON) of an answer's choices."""
    out = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {"role": "assistant", "content": choice.get("text")}
        out.append({"role": "assistant", "parts": _parts(message), "finish_reason": choice.get("finish_reason")})
    return orjson.dumps(out).decode()


def stream_output(chunks: list[bytes]) -> str:
    """``gen_ai.output.messages`` (JSON) of a relayed stream's events: each choice's text and tool calls
    put back together. Only called with ``capture_content`` on."""
    choices: dict[int, dict[str, Any]] = {}
    for event in b"".join(chunks).split(b"\n\n"):
        data = event.strip().removeprefix(b"data:").strip()
        if not data.startswith(b"{"):
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            into = choices.setdefault(int(choice.get("index") or 0), {"text": [], "calls": {}, "finish": None})
            inner = choice.get("delta")
            delta: dict[str, Any] = inner if isinstance(inner, dict) else choice
            if isinstance(delta.get("content"), str):
                into["text"].append(delta["content"])
            elif isinstance(delta.get("text"), str):
                into["text"].append(delta["text"])
            for call in delta.get("tool_calls") or ():
                slot = into["calls"].setdefault(call.get("index", 0), {"id": None, "name": None, "arguments": []})
                function = call.get("function") or {}
                slot["id"] = slot["id"] or call.get("id")
                slot["name"] = slot["name"] or function.get("name")
                if isinstance(function.get("arguments"), str):
                    slot["arguments"].append(function["arguments"])
            if choice.get("finish_reason"):
                into["finish"] = choice["finish_reason"]
    out = []
    for _, c in sorted(choices.items()):
        parts: list[dict[str, Any]] = [{"type": "text", "content": "".join(c["text"])}] if c["text"] else []
        for _, call in sorted(c["calls"].items()):
            arguments = "".join(call["arguments"])
            parts.append({"type": "tool_call", "id": call["id"], "name": call["name"], "arguments": arguments})
        out.append({"role": "assistant", "parts": parts, "finish_reason": c["finish"]})
    return orjson.dumps(out).decode()


def error_type(error: BaseException | None, status: int) -> str | None:
    """``error.type``: the error taxonomy's code (``upstream_timeout``, ``model_not_found`` ...) or type,
    ``cancelled`` for a client that left, the status for any other failure; None for a success."""
    if error is not None:
        code = getattr(error, "code", None) or getattr(error, "type", None)
        if isinstance(code, str):
            return code
        return "cancelled" if type(error).__name__ == "CancelledError" else type(error).__qualname__
    if status == 499:
        return "cancelled"
    if status >= 400:
        return str(status)
    return None

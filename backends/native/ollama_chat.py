"""Ollama's native chat API (``POST /api/chat``, NDJSON when streaming) as OpenAI chat.

Request, defaults made explicit (Ollama's own: temperature 0.8, top_p 0.9, top_k 40,
repeat_penalty 1.1, streaming on):

- ``options``: ``num_predict`` (the client's limit, or -1: until the model stops, OpenAI's
  default), ``temperature`` 1, ``top_p`` 1, ``top_k`` 0 (off), ``min_p`` 0, ``repeat_penalty`` 1
  and both penalties 0 unless the client set them (``explicit_sampling``, as completions);
  ``stop``; ``seed`` as a non-negative 32-bit value (Ollama reads -1 as "random");
- messages: ``content`` a string (text parts joined); images as ``images`` (base64) only from
  ``data:`` URLs (a remote URL is refused by name: Ollama would not fetch it); ``developer``
  as ``system``; an assistant's ``tool_calls`` with ``arguments`` as the JSON object Ollama
  wants; a tool message gets ``tool_name`` from the earlier assistant call with its
  ``tool_call_id`` (Ollama matches results by name); ``name`` on a message is refused (Ollama
  has no participant names);
- ``tools`` (function tools), left out for ``tool_choice: "none"``; Ollama cannot force a call
  or limit a reply to one (refused by the table);
- ``format``: ``"json"`` for ``json_object``, the schema for ``json_schema``;
- ``logprobs`` + ``top_logprobs`` (Ollama 0.12.11+; an older server that answers without them
  is an error naming ``logprobs``); ``think`` from ``reasoning_effort`` (``none`` -> false,
  ``low``/``medium``/``high`` as they are, as Ollama's own OpenAI layer does).

Response: tool-call ``arguments`` arrive as JSON objects and are serialised to strings; call ids
are Ollama's (0.12.10+) or minted, stable per request and choice; ``thinking`` becomes
``reasoning_content``. ``done_reason`` ``stop``/``length`` map to themselves (``tool_calls`` when
calls were made); ``load``/``unload`` (or ``""``: the runner went away) is no answer and
becomes an error naming it, never a fake ``stop``. Usage: ``prompt_eval_count`` and
``eval_count``; Ollama omits ``prompt_eval_count`` when the whole prompt came from its cache, and
the prompt count is then **estimated** from the messages (about 4 characters a token).
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import TokenUsage
from backends.errors import UpstreamProtocolError
from backends.native.chat import (
    CallPiece,
    ChatPiece,
    ChatTranslator,
    arguments_text,
    as_dict,
    call_objects,
    chat_logprobs,
    estimate_prompt_tokens,
    text_field,
    text_of,
)
from backends.native.common import count, explicit_sampling, native_seed, ollama_finish, stops_of, upstream_failed
from backends.native.ollama_capabilities import OLLAMA_CHAT
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import (
    AssistantMessage,
    DeveloperMessage,
    FunctionToolCall,
    ImageURLPart,
    JSONSchemaResponseFormat,
    ToolMessage,
)
from schemas.errors import InvalidRequestError

__all__ = ["OllamaChat"]

_THINK: dict[str, bool | str] = {"none": False, "low": "low", "medium": "medium", "high": "high"}


def _image(url: str, i: int) -> str:
    head, _, data = url.partition(",")
    if not head.startswith("data:") or not head.endswith(";base64") or not data:
        raise InvalidRequestError(
            f"messages[{i}]: an image data URL must be base64 (data:...;base64,...)", param="messages"
        )
    return data


def _arguments(text: str, i: int) -> Any:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"messages[{i}]: tool call arguments must be a JSON object for Ollama", param="messages"
        )
    return value


class OllamaChat(ChatTranslator):
    path = "/api/chat"
    framing = "ndjson"
    table = OLLAMA_CHAT

    def check(self, request: ChatCompletionRequest) -> None:
        super().check(request)
        if request.reasoning_effort is not None and request.reasoning_effort not in _THINK:
            raise self.refuse("reasoning_effort", "Ollama's think takes none, low, medium or high")
        for i, message in enumerate(request.messages):
            if getattr(message, "name", None) is not None:
                raise self.refuse("messages", f"messages[{i}].name: Ollama has no participant names")

    def _messages(self, request: ChatCompletionRequest) -> list[dict[str, Any]]:
        names: dict[str, str] = {}  # tool call id -> the function it called
        out: list[dict[str, Any]] = []
        for i, message in enumerate(request.messages):
            data: dict[str, Any] = {
                "role": "system" if isinstance(message, DeveloperMessage) else message.role,
                "content": text_of(message.content),
            }
            content = message.content
            if isinstance(content, list):
                images = [_image(p.image_url.url, i) for p in content if isinstance(p, ImageURLPart)]
                if images:
                    data["images"] = images
            if isinstance(message, AssistantMessage) and message.tool_calls:
                calls = []
                for call in message.tool_calls:
                    if not isinstance(call, FunctionToolCall):
                        raise self.refuse("messages", f"messages[{i}]: custom tool calls")
                    names[call.id] = call.function.name
                    function = {"name": call.function.name, "arguments": _arguments(call.function.arguments, i)}
                    calls.append({"id": call.id, "function": function})
                data["tool_calls"] = calls
            if isinstance(message, ToolMessage):
                name = names.get(message.tool_call_id)
                if name is None:
                    raise InvalidRequestError(
                        f"messages[{i}]: tool_call_id {message.tool_call_id[:64]!r} matches no earlier assistant "
                        "tool call (Ollama needs the function's name)",
                        param="messages",
                    )
                data["tool_name"] = name
                data["tool_call_id"] = message.tool_call_id
            out.append(data)
        return out

    def payload(self, request: ChatCompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        limit = request.max_output_tokens
        options: dict[str, Any] = {"num_predict": -1 if limit is None else limit, **explicit_sampling(request)}
        if request.stop is not None:
            options["stop"] = stops_of(request)
        if request.seed is not None:
            options["seed"] = native_seed(request.seed)
        body: dict[str, Any] = {
            "model": model,
            "messages": self._messages(request),
            "stream": stream,
            "options": options,
        }
        if request.tools and request.tool_choice != "none":
            body["tools"] = [
                {"type": "function", "function": tool.function.model_dump(exclude_none=True, exclude={"strict"})}
                for tool in request.tools
                if tool.type == "function"
            ]
        if request.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs or 0
        response_format = request.response_format
        if isinstance(response_format, JSONSchemaResponseFormat):
            schema = response_format.json_schema.schema_
            body["format"] = schema if schema is not None else {"type": "object"}
        elif response_format is not None and response_format.type == "json_object":
            body["format"] = "json"
        if request.reasoning_effort is not None:
            body["think"] = _THINK[request.reasoning_effort]
        return body

    # --- answers --------------------------------------------------------------------------------

    @staticmethod
    def _usage(obj: dict[str, Any], request: ChatCompletionRequest) -> TokenUsage | None:
        """The counts; None (estimated from the text) when one is not a plausible count."""
        completion = count(obj.get("eval_count"))
        prompt = obj.get("prompt_eval_count")
        if prompt is None:  # a prompt-cache hit: Ollama leaves the count out
            prompt = estimate_prompt_tokens(request)
        prompt = count(prompt)
        return None if prompt is None or completion is None else TokenUsage(prompt, completion)

    def _arguments(self, value: Any) -> str:
        """Ollama sends arguments as a JSON object; JSON text of an object is taken as it is."""
        if isinstance(value, str):
            try:
                parsed = orjson.loads(value)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                return value
        elif value is None or isinstance(value, dict):
            return arguments_text(value or {}, self.backend)
        raise UpstreamProtocolError("Ollama sent tool call arguments that are not a JSON object", backend=self.backend)

    def _piece(self, obj: dict[str, Any], request: ChatCompletionRequest) -> ChatPiece:
        message = as_dict(obj.get("message"), "message", self.backend)
        content, thinking = message.get("content"), message.get("thinking")
        calls = []
        for position, call in enumerate(call_objects(message.get("tool_calls"), self.backend)):
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise UpstreamProtocolError("Ollama sent a tool call without a function name", backend=self.backend)
            call_id = call.get("id")
            calls.append(
                CallPiece(
                    position,
                    call_id if isinstance(call_id, str) and call_id else None,
                    function["name"],
                    self._arguments(function.get("arguments")),
                    whole=True,
                )
            )
        piece = ChatPiece(
            content=text_field(content, "message content", self.backend),
            reasoning=text_field(thinking, "message thinking", self.backend),
            calls=calls,
            logprobs=chat_logprobs(obj.get("logprobs")),
        )
        if obj.get("done"):
            piece.finish = ollama_finish(obj, self.backend)
            piece.usage = self._usage(obj, request)
            piece.done = True
        return piece

    def answer(self, obj: Any, request: ChatCompletionRequest) -> ChatPiece:
        if not isinstance(obj, dict) or not isinstance(obj.get("message"), dict) or not obj.get("done"):
            raise UpstreamProtocolError("Ollama sent a chat answer without message and done", backend=self.backend)
        return self._piece(obj, request)

    def event(self, obj: dict[str, Any], request: ChatCompletionRequest) -> ChatPiece | None:
        if "error" in obj:
            raise upstream_failed(self.backend, obj)
        return self._piece(obj, request)

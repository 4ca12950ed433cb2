"""A Responses request as the Chat Completions request that means the same: the bridge's request half.

Every family without a native ``/v1/responses`` (``mock``, ``tgi``, ``ollama``, ``llamacpp``,
``vllm-pool``, and ``vllm`` where its own endpoint is not faithful) serves Responses through its
chat translator, so tools, ``json_schema``, reasoning and logprobs mean what they mean on chat.
:func:`to_chat` builds that :class:`~schemas.chat.ChatCompletionRequest`:

- ``instructions`` -> a leading ``system`` message; a string ``input`` -> one ``user`` message;
  message items -> messages (``input_text``/``output_text`` -> text parts, ``input_image`` ->
  ``image_url``, ``input_file`` -> ``file``, ``refusal`` -> refusal parts);
- ``function_call`` items -> the ``tool_calls`` of one assistant message (with the assistant text
  before them), ``function_call_output`` -> ``tool`` messages; custom tool calls likewise;
- ``reasoning`` items are not sent: chat has no place for an earlier turn's reasoning, and chat
  templates drop it from earlier turns anyway (documented in docs/capabilities.md);
- function tools as they are; ``namespace`` tools flattened to ``<namespace>__<name>`` functions
  (as vLLM does), calls mapped back by :class:`ToolNames`; custom tools as chat custom tools;
  OpenAI's built-in tools are never translated: the capability check refused them, or the
  operator's ``builtin_tools: omit`` leaves them out here;
- ``tool_choice`` forms one to one (a named function resolved to its flattened name);
  ``max_output_tokens`` -> ``max_completion_tokens``; ``text.format`` -> ``response_format``;
  ``text.verbosity`` -> ``verbosity``; ``reasoning.effort`` -> ``reasoning_effort``;
  ``include: ["message.output_text.logprobs"]`` -> ``logprobs`` with ``top_logprobs``;
  a stream asks for its usage chunk (the final response carries usage);
- ``temperature``, ``top_p``, ``user``, ``safety_identifier``, ``service_tier``, ``parallel_tool_calls``
  and vLLM's shared extras keep their names: the family's chat table decides on them.

``store``, ``previous_response_id``, ``metadata``, ``truncation``, ``prompt_cache_key``,
``client_metadata`` and the other ``include`` values are the gateway's (never in the chat request).
Which Responses field a chat field came from (for a refusal's ``param``) is :data:`CHAT_TO_RESPONSES`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from backends.responses.plain_chat import plain_chat_request
from schemas.chat import ChatCompletionRequest
from schemas.responses import NAMESPACE_SEPARATOR, ResponsesRequest
from schemas.responses_items import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    InputText,
    MessageItem,
    OutputText,
    RefusalPart,
)
from schemas.responses_tools import (
    AllowedToolsChoice,
    CustomChoice,
    CustomTool,
    FunctionChoice,
    FunctionTool,
    JSONObjectFormat,
    JSONSchemaFormat,
    NamespaceTool,
)

__all__ = ["CHAT_TO_RESPONSES", "NO_TOOL_NAMES", "ToolNames", "Untranslatable", "chat_fields", "to_chat"]

# A chat field's Responses origin, for the param of a refusal the chat table makes.
CHAT_TO_RESPONSES: dict[str, str] = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "verbosity": "text.verbosity",
    "reasoning_effort": "reasoning.effort",
    "logprobs": "include",
    "stream_options": "stream",
}


class Untranslatable(ValueError):
    """A part of the request the chat translation cannot carry (an image in a system message, say)."""

    def __init__(self, param: str, why: str) -> None:
        super().__init__(why)
        self.param = param
        self.why = why


class ToolNames:
    """Flattened namespace function names and back: ``ns__name`` <-> (``name``, ``ns``)."""

    __slots__ = ("_back", "_local")

    def __init__(self, request: ResponsesRequest | None) -> None:
        """``request``'s tools' names (None: no tools)."""
        self._back: dict[str, tuple[str, str]] = {}
        self._local: dict[str, list[str]] = {}
        for tool in (request.tools if request is not None else None) or ():
            if type(tool) is NamespaceTool:  # (no subclass: no isinstance call per tool)
                for inner in tool.tools:
                    flat = f"{tool.name}{NAMESPACE_SEPARATOR}{inner.name}"
                    self._back[flat] = (inner.name, tool.name)
                    self._local.setdefault(inner.name, []).append(flat)

    def flat(self, name: str, namespace: str | None) -> str:
        return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name

    def resolve(self, name: str) -> str:
        """A tool_choice's name: exact, or a namespace function's own name when only one namespace has it."""
        candidates = self._local.get(name)
        return candidates[0] if candidates and len(candidates) == 1 and name not in self._back else name

    def split(self, name: str) -> tuple[str, str | None]:
        """A called name as the client knows it: ``(name, namespace)``."""
        back = self._back.get(name)
        return back if back is not None else (name, None)

    def __bool__(self) -> bool:
        return bool(self._back)


NO_TOOL_NAMES = ToolNames(None)  # a request without tools has nothing to map: one read-only instance for all


def _text(output: list[Any], item: Any, request: ResponsesRequest) -> str | list[dict[str, Any]]:
    """A tool output's parts as chat's tool content: text only (an empty list is an empty output)."""
    for j, part in enumerate(output):
        if type(part) is not InputText:
            i = next(i for i, other in enumerate(request.input or ()) if other is item)
            param, whose = _client_path(request, i, f".output[{j}]")
            raise Untranslatable(param, f"{whose}tool output carries only text over chat ({part.type} given)")
    return [{"type": "text", "text": part.text} for part in output] or ""


def _part(part: Any) -> dict[str, Any]:
    if isinstance(part, InputText | OutputText):
        return {"type": "text", "text": part.text}
    if isinstance(part, RefusalPart):
        return {"type": "refusal", "refusal": part.refusal}
    if isinstance(part, InputImage):
        image: dict[str, Any] = {"url": part.image_url}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    assert isinstance(part, InputFile)
    file = {k: v for k, v in (("file_data", part.file_data), ("file_id", part.file_id), ("filename", part.filename))}
    return {"type": "file", "file": {k: v for k, v in file.items() if v is not None}}


def _messages(request: ResponsesRequest, names: ToolNames) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    items = request.input
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    assistant: dict[str, Any] | None = None  # the assistant turn being built (text, then its calls)
    for item in items or ():
        if isinstance(item, MessageItem):
            content = item.content
            # An empty list of parts is an empty message (OpenAI takes it; chat's is then a string).
            parts: str | list[dict[str, Any]] = (
                content if isinstance(content, str) else [_part(p) for p in content] or ""
            )
            if item.role == "assistant":
                assistant = {"role": "assistant", "content": parts}  # its calls, if any, follow it
                messages.append(assistant)
                continue
            assistant = None
            messages.append({"role": item.role, "content": parts})
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)
            if isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": names.flat(item.name, item.namespace), "arguments": item.arguments},
                }
            else:
                call = {"id": item.call_id, "type": "custom", "custom": {"name": item.name, "input": item.input}}
            assistant.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            assistant = None
            output = item.output
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.call_id,
                    "content": output if isinstance(output, str) else _text(output, item, request),
                }
            )
        # reasoning items: not sent (module docstring); other types were refused before translation
    return messages


def _tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for tool in request.tools or ():
        if isinstance(tool, FunctionTool):
            tools.append({"type": "function", "function": _function(tool, tool.name)})
        elif isinstance(tool, NamespaceTool):
            for inner in tool.tools:
                flat = f"{tool.name}{NAMESPACE_SEPARATOR}{inner.name}"
                if isinstance(inner, FunctionTool):
                    tools.append({"type": "function", "function": _function(inner, flat)})
                else:
                    tools.append({"type": "custom", "custom": _custom(inner, flat)})
        elif isinstance(tool, CustomTool):
            tools.append({"type": "custom", "custom": _custom(tool, tool.name)})
        # built-in tools: never translated (refused before, or omitted by the operator's choice)
    return tools


def _function(tool: FunctionTool, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if tool.description is not None:
        out["description"] = tool.description
    if tool.parameters is not None:
        out["parameters"] = tool.parameters
    if tool.strict is not None:
        out["strict"] = tool.strict
    return out


def _custom(tool: CustomTool, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if tool.description is not None:
        out["description"] = tool.description
    if tool.format is not None:
        if tool.format.type == "text":
            out["format"] = {"type": "text"}
        else:
            out["format"] = {
                "type": "grammar",
                "grammar": {"syntax": tool.format.syntax, "definition": tool.format.definition},
            }
    return out


def _tool_choice(request: ResponsesRequest, names: ToolNames, has_tools: bool) -> Any:
    choice = request.tool_choice
    if choice is None or (isinstance(choice, str) and choice != "none" and not has_tools):
        return None  # auto without tools: chat's default, and chat refuses it without tools
    if isinstance(choice, str):
        return choice
    if isinstance(choice, FunctionChoice):
        return {"type": "function", "function": {"name": names.resolve(choice.name)}}
    if isinstance(choice, CustomChoice):
        return {"type": "custom", "custom": {"name": choice.name}}
    assert isinstance(choice, AllowedToolsChoice)  # other forms were refused before translation
    refs = []
    for ref in choice.tools:
        if ref.type == "function" and ref.name is not None:
            refs.append({"type": "function", "function": {"name": names.resolve(ref.name)}})
        elif ref.type == "custom" and ref.name is not None:
            refs.append({"type": "custom", "custom": {"name": ref.name}})
    if not refs:  # only built-in tools, which never reach chat (refused, or omitted by the operator)
        raise Untranslatable("tool_choice", "allowed_tools names no function or custom tool, and chat runs no other")
    return {"type": "allowed_tools", "allowed_tools": {"mode": choice.mode, "tools": refs}}


_SAME_NAME = (
    "temperature", "top_p", "user", "safety_identifier", "service_tier", "frequency_penalty", "presence_penalty",
    "logit_bias", "seed", "stop", "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output", "chat_template_kwargs", "priority", "request_id",
)  # fmt: skip


_SAME_NAME_SET = frozenset(_SAME_NAME)


def to_chat(request: ResponsesRequest, names: ToolNames, *, stream: bool) -> ChatCompletionRequest:
    """The chat request that means what ``request`` means (module docstring); raises
    :class:`Untranslatable` for a part chat cannot carry (an image in a system message, say).

    A plain request's (:mod:`backends.responses.plain_chat`) is built as validation would build it,
    without the validation, which could refuse nothing of it; any other is validated."""
    plain = plain_chat_request(request, stream=stream)
    if plain is not None:
        return plain
    try:
        return ChatCompletionRequest.model_validate(chat_fields(request, names, stream=stream))
    except ValidationError as exc:
        raise _untranslatable(request, exc) from None


def _untranslatable(request: ResponsesRequest, exc: ValidationError) -> Untranslatable:
    """What chat refused of the translation, named by the client's own path (``input[2].content[0]``),
    never by the chat request's (the error path only: the translation itself keeps no such map)."""
    error = exc.errors(include_url=False)[0]
    loc = error["loc"]
    head = str(loc[0]) if loc else "messages"
    if head == "tools":
        tool = _tool_of_chat_tool(request, loc[1]) if len(loc) > 1 and isinstance(loc[1], int) else None
        if tool is not None:
            return Untranslatable(tool[0], f"chat cannot carry it as the tool {tool[1]!r} ({error['msg']})")
        return Untranslatable("tools", f"chat cannot carry it ({error['msg']}; each namespace function is a tool)")
    if head != "messages":
        return Untranslatable(CHAT_TO_RESPONSES.get(head, head), f"chat cannot carry it ({error['msg']})")
    if len(loc) < 2 or not isinstance(loc[1], int):
        return Untranslatable("input", "nothing in it is sent over chat (reasoning items are not)")
    i = _item_of_message(request, loc[1])
    if i is None:
        return Untranslatable("input" if request.instructions is None else "instructions", "chat cannot carry it")
    item = request.input[i]  # type: ignore[index]  # _item_of_message found it in a list
    if isinstance(item, MessageItem) and not isinstance(item.content, str):
        for j, part in enumerate(item.content):
            if not isinstance(part, InputText | OutputText | RefusalPart):
                param, whose = _client_path(request, i, f".content[{j}]")
                return Untranslatable(
                    param, f"{whose}{item.role} message carries only text over chat ({part.type} given)"
                )
    param, whose = _client_path(request, i, "")
    return Untranslatable(param, f"chat cannot carry {whose}item ({error['msg']})")


def _client_path(request: ResponsesRequest, i: int, rest: str) -> tuple[str, str]:
    """``input[i]<rest>`` as the client wrote it, and whose item it is ("a "/"an earlier turn's "): an
    item of the history ``previous_response_id`` put ahead of the client's own is named by that field."""
    own = request.stored_input
    earlier = len(request.input or ()) - len(own) if own is not None else 0
    if i < earlier:
        return "previous_response_id", "an earlier turn's "
    return f"input[{i - earlier}]{rest}", "a "


def _tool_of_chat_tool(request: ResponsesRequest, index: int) -> tuple[str, str] | None:
    """The path of the tool that became chat's tool at ``index`` (as :func:`_tools` flattens
    namespaces), and its name there (``<namespace>__<name>``)."""
    k = 0
    for i, tool in enumerate(request.tools or ()):
        if isinstance(tool, NamespaceTool):
            if index < k + len(tool.tools):
                j = index - k
                return f"tools[{i}].tools[{j}].name", f"{tool.name}{NAMESPACE_SEPARATOR}{tool.tools[j].name}"
            k += len(tool.tools)
        elif isinstance(tool, FunctionTool | CustomTool):
            if k == index:
                return f"tools[{i}]", tool.name
            k += 1
    return None


def _item_of_message(request: ResponsesRequest, index: int) -> int | None:
    """The input item the chat message at ``index`` was made from, as :func:`_messages` groups them
    (a call joins the assistant message before it); None for ``instructions`` or a string input."""
    k = 0 if request.instructions is None else 1
    items = request.input
    if index < k or isinstance(items, str):
        return None
    open_assistant = False
    for i, item in enumerate(items or ()):
        if isinstance(item, MessageItem):
            open_assistant = item.role == "assistant"
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            if open_assistant:
                continue  # one of the open assistant message's calls
            open_assistant = True
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            open_assistant = False
        else:
            continue  # not sent
        if k == index:
            return i
        k += 1
    return None


def chat_fields(request: ResponsesRequest, names: ToolNames, *, stream: bool) -> dict[str, Any]:
    """The chat request's fields, before validation (:func:`to_chat`)."""
    fields: dict[str, Any] = {"model": request.model, "messages": _messages(request, names)}
    values = request.__dict__
    for name in _SAME_NAME_SET.intersection(request.__pydantic_fields_set__):  # usually one or two
        value = values[name]
        if value is not None:
            fields[name] = value
    if request.max_output_tokens is not None:
        fields["max_completion_tokens"] = request.max_output_tokens
    tools = _tools(request) if request.tools else []
    if tools:
        fields["tools"] = tools
        if request.parallel_tool_calls is not None:
            fields["parallel_tool_calls"] = request.parallel_tool_calls
    choice = _tool_choice(request, names, bool(tools))
    if choice is not None:
        fields["tool_choice"] = choice
    text = request.text
    if text is not None:
        if isinstance(text.format, JSONSchemaFormat):
            spec: dict[str, Any] = {"name": text.format.name, "schema": text.format.schema_}
            if text.format.description is not None:
                spec["description"] = text.format.description
            if text.format.strict is not None:
                spec["strict"] = text.format.strict
            fields["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif isinstance(text.format, JSONObjectFormat):
            fields["response_format"] = {"type": "json_object"}
        if text.verbosity is not None:
            fields["verbosity"] = text.verbosity
    if request.reasoning is not None and request.reasoning.effort is not None:
        fields["reasoning_effort"] = request.reasoning.effort
    if request.wants_logprobs:
        fields["logprobs"] = True
        fields["top_logprobs"] = request.top_logprobs or 0
    if stream:
        fields["stream"] = True
        fields["stream_options"] = {"include_usage": True}
    return fields

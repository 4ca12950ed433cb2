"""A Responses request's function, namespace and custom tools as chat's, built without validating them again.

The chat bridge's tools (:mod:`backends.responses.plain_chat`, a plain request's translation): function
tools as they are, a namespace's members flattened to ``<namespace>__<name>`` (as vLLM does), custom
tools as chat's custom tools; built-in tools are never sent. Their declarations are chat's (``Name``,
``JsonObject``, ``StrictBool``: the Responses check was chat's own), so the chat models are made as
validation makes them (the same classes, values and fields set; a JSON Schema's dict copied at the
top, as validation copies it) through pydantic's own slots, inline: a Codex turn has a dozen tools,
two models each, and a call per model was a third of their making (issue 21).

Each tool's upstream form is recorded as it is made (:data:`schemas.chat.TOOLS_NOTE`): what the
chat request's serializer would make of it, so ``upstream_fields`` copies it rather than walking
every JSON Schema again (the serializer's copy of an agent's tools cost more than making them).
``tests/backends/responses/test_plain_chat.py`` holds the models to validation's and the upstream
bytes to the serializer's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from backends.responses.model_slots import new as _new
from backends.responses.model_slots import set_dict as _set_dict
from backends.responses.model_slots import set_extra as _set_extra
from backends.responses.model_slots import set_fields_set as _set_fields_set
from backends.responses.model_slots import set_private as _set_private
from schemas import chat_messages as chat
from schemas.chat import MAX_TOOLS
from schemas.responses import NAMESPACE_SEPARATOR
from schemas.responses_tools import CustomTool, FunctionTool, Grammar, NamespaceTool, PlainText

__all__ = ["CHAT_NAME_LENGTH", "ToolNote", "chat_tools"]

CHAT_NAME_LENGTH = 64  # chat's Name: ^[a-zA-Z0-9_-]{1,64}$ (a flattened namespace function's may be longer)
ToolNote = tuple[Any, str, dict[str, Any]]  # (the chat tool, its kind, its kind's upstream spec)

_FUNCTION_TOOL, _FUNCTION = chat.FunctionTool, chat.FunctionDefinition
_CUSTOM_TOOL, _CUSTOM = chat.CustomTool, chat.CustomDefinition
# The tools' forms (chat_capabilities.request_forms' names).
_FUNCTION_FORM, _CUSTOM_FORM = ("tools", "function"), ("tools", "custom")


def _model(cls: type[BaseModel], values: dict[str, Any], fields_set: set[str]) -> Any:
    obj = _new(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def _function(own: dict[str, Any], name: str, notes: list[ToolNote]) -> Any:
    """A function tool's values (``own``: the Responses tool's dict) as chat's tool, named ``name``."""
    # Inline, not through _model: two calls per tool fewer (the commonest tool).
    spec: dict[str, Any] = {"name": name}  # the set, non-null fields in declared order: the upstream spec
    if (description := own["description"]) is not None:
        spec["description"] = description
    if (parameters := own["parameters"]) is not None:
        spec["parameters"] = parameters = dict(parameters)  # validation's copy (the schema's inside is shared)
    if (strict := own["strict"]) is not None:
        spec["strict"] = strict
    function = _new(_FUNCTION)
    _set_dict(function, {"name": name, "description": description, "parameters": parameters, "strict": strict})
    _set_fields_set(function, set(spec))
    _set_extra(function, None)
    _set_private(function, None)
    tool = _new(_FUNCTION_TOOL)
    _set_dict(tool, {"type": "function", "function": function})
    _set_fields_set(tool, {"type", "function"})
    _set_extra(tool, None)
    _set_private(tool, None)
    notes.append((tool, "function", spec))
    return tool


def _custom(tool: CustomTool, name: str, notes: list[ToolNote]) -> Any:
    spec: dict[str, Any] = {"name": name}
    values: dict[str, Any] = {"name": name, "description": None, "format": None}
    if tool.description is not None:
        spec["description"] = values["description"] = tool.description
    form = tool.format
    if form is not None:
        if type(form) is PlainText:
            values["format"] = _model(chat.TextFormat, {"type": "text"}, {"type"})
            spec["format"] = {"type": "text"}
        else:
            assert type(form) is Grammar  # (the union's other member)
            grammar = {"syntax": form.syntax, "definition": form.definition}
            made = _model(chat.Grammar, dict(grammar), {"syntax", "definition"})
            values["format"] = _model(chat.GrammarFormat, {"type": "grammar", "grammar": made}, {"type", "grammar"})
            spec["format"] = {"type": "grammar", "grammar": grammar}
    custom = _model(_CUSTOM, values, set(spec))
    made_tool = _model(_CUSTOM_TOOL, {"type": "custom", "custom": custom}, {"type", "custom"})
    notes.append((made_tool, "custom", spec))
    return made_tool


def chat_tools(tools: list[Any], forms: list[tuple[str, str]]) -> tuple[list[Any], bool, tuple[ToolNote, ...]] | None:
    """The function, namespace and custom tools as chat's (built-in ones are never sent), whether one is
    strict, and their upstream record (:data:`schemas.chat.TOOLS_NOTE`); their types' forms are added to
    ``forms`` (each once, in order). None where chat's schema could refuse them: a flattened name over
    64 characters, a name twice, over 128 tools."""
    out: list[Any] = []
    notes: list[ToolNote] = []
    names: set[str] = set()
    strict = False
    for tool in tools:
        kind = type(tool)
        if kind is FunctionTool:
            own = tool.__dict__
            out.append(_function(own, own["name"], notes))
            names.add(own["name"])
            strict = strict or bool(own["strict"])
            if _FUNCTION_FORM not in forms:
                forms.append(_FUNCTION_FORM)
        elif kind is NamespaceTool:
            prefix = f"{tool.name}{NAMESPACE_SEPARATOR}"
            for inner in tool.tools:
                own = inner.__dict__
                flat = prefix + own["name"]
                if len(flat) > CHAT_NAME_LENGTH:
                    return None
                if type(inner) is FunctionTool:
                    out.append(_function(own, flat, notes))
                    strict = strict or bool(own["strict"])
                    form = _FUNCTION_FORM
                else:
                    out.append(_custom(inner, flat, notes))
                    form = _CUSTOM_FORM
                names.add(flat)
                if form not in forms:
                    forms.append(form)
        elif kind is CustomTool:
            out.append(_custom(tool, tool.name, notes))
            names.add(tool.name)
            if _CUSTOM_FORM not in forms:
                forms.append(_CUSTOM_FORM)
    return (out, strict, tuple(notes)) if len(names) == len(out) <= MAX_TOOLS else None

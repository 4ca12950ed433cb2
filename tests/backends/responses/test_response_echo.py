"""The Response's echo of the request's tools (backends/responses/answer.py ``_tool_echo``): the same
dicts, and bytes, as pydantic's ``model_dump(mode="json", by_alias=True, exclude_none=True)`` of each
tool, for Codex's recorded tools and every kind of tool and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest
from pydantic import BaseModel

from backends.responses.answer import _PLAIN_TOOLS, ResponseFrame
from backends.responses.capabilities import chat_request_of
from schemas.responses import ResponsesRequest

FIXTURES = Path(__file__).parents[2] / "fixtures" / "responses"

_FUNCTION = {
    "type": "function",
    "name": "f",
    "description": "d",
    "parameters": {"type": "object", "properties": {"x": {"type": ["string", "null"], "default": None}},
                   "n": [1, 2.5, -3, 2**63, True, None, {"deep": [[]]}]},
    "strict": False,
    "defer_loading": True,
    "allowed_callers": ["direct", "programmatic"],
    "output_schema": {"type": "string"},
}  # fmt: skip
_TOOLS: list[list[dict[str, Any]]] = [
    [_FUNCTION],
    [{"type": "function", "name": "bare"}, {"type": "function", "name": "p", "parameters": None, "strict": None}],
    [{"type": "custom", "name": "c"}, {"type": "custom", "name": "t", "description": "", "format": {"type": "text"}}],
    [{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}],
    [{"type": "namespace", "name": "ns", "description": "group",
      "tools": [{**_FUNCTION, "name": "a"}, {"type": "custom", "name": "b", "allowed_callers": ["direct"]}]}],
    [{"type": "web_search", "search_context_size": "low", "user_location": {"type": "approximate", "city": None}},
     {"type": "function", "name": "after_builtin"}],
]  # fmt: skip


def _recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())["body"]
    return body


def _bodies() -> list[dict[str, Any]]:
    bodies = [_recorded("codex-0.171-turn1.json"), _recorded("codex-0.171-tool-result.json")]
    return bodies + [{"model": "m", "input": "hi", "tools": tools} for tools in _TOOLS]


@pytest.mark.parametrize("body", _bodies())
def test_the_echoed_tools_are_pydantics_dump_of_each(body: dict[str, Any]) -> None:
    request = ResponsesRequest.model_validate_json(orjson.dumps(body))
    assert request.tools
    frame = ResponseFrame(request, "public", chat_request_of(request)[1])
    dumped = [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in request.tools]
    echoed = frame.envelope("completed", [])["tools"]
    assert echoed == dumped
    assert orjson.dumps(echoed) == orjson.dumps(dumped)  # and in the same order, key by key
    assert [list(tool) for tool in echoed] == [list(tool) for tool in dumped]


def test_the_plainly_echoed_models_have_nothing_pydantic_would_change() -> None:
    """What ``_tool_echo`` leaves out: an alias, an extra field, a serializer, a computed field."""
    for model in _PLAIN_TOOLS:
        assert all(f.alias is None and f.serialization_alias is None for f in model.model_fields.values())
        assert model.model_config.get("extra") == "forbid"
        decorators = model.__pydantic_decorators__
        assert not decorators.field_serializers and not decorators.model_serializers
        assert not model.model_computed_fields


def _models_in(annotation: Any) -> set[type]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    return {model for arg in get_args(annotation) for model in _models_in(arg)}


def test_a_plainly_echoed_tool_holds_no_model_but_plain_ones() -> None:
    """``_tool_echo`` takes a model inside a tool as itself only when it is one of these."""
    for model in _PLAIN_TOOLS:
        for field in model.model_fields.values():
            assert _models_in(field.annotation) <= _PLAIN_TOOLS, (model, field)

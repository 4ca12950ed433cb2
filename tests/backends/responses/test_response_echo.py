"""The Response's echo of the request (backends/responses/echo.py). Its tools (``_tool_echo``): the same
dicts, and bytes, as pydantic's ``model_dump(mode="json", by_alias=True, exclude_none=True)`` of each
tool, for Codex's recorded tools and every kind of tool and field. Every setting: the echo made from
a public model's cached default is the one read from each setting, request after request, in dicts
and in bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from backends.responses import echo
from backends.responses.answer import ResponseFrame, response_from_chat
from backends.responses.capabilities import chat_request_of
from backends.responses.echo import _PLAIN_TOOLS
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


# --- the echo of every setting: made from a cached default, never leaking between requests ---------------


def _reference_echo(request: ResponsesRequest, public_model: str) -> dict[str, Any]:
    """The echo read from every setting, as the frame made it before it kept a default (session 8)."""
    reasoning, text = request.reasoning, request.text
    summary = None if reasoning is None else reasoning.summary or reasoning.generate_summary
    return {
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "model": public_model,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {"effort": reasoning.effort if reasoning is not None else None, "summary": summary},
        "safety_identifier": request.safety_identifier,
        "service_tier": request.service_tier or "default",
        "store": request.store is not False,
        "temperature": request.temperature,
        "text": {
            "format": (
                text.format.model_dump(by_alias=True, exclude_none=True)
                if text is not None and text.format is not None
                else {"type": "text"}
            ),
            "verbosity": (text.verbosity if text is not None else None) or "medium",
        },
        "tool_choice": (
            request.tool_choice
            if isinstance(request.tool_choice, str)
            else request.tool_choice.model_dump(mode="json", by_alias=True, exclude_none=True)
            if request.tool_choice is not None
            else "auto"
        ),
        "tools": [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in request.tools or ()],
        "top_logprobs": request.top_logprobs,
        "top_p": request.top_p,
        "truncation": request.truncation or "disabled",
        "user": request.user,
        "metadata": request.metadata or {},
    }


_TEXTS = st.text(max_size=12) | st.sampled_from(['"', "\\", "\u2028", "é", "%b", "\x00", ""])
_COUNTS = st.integers(1, 2**63 - 1)
_SETTINGS: dict[str, Any] = {
    "instructions": _TEXTS,
    "max_output_tokens": _COUNTS,
    "max_tool_calls": _COUNTS,
    "parallel_tool_calls": st.booleans(),
    "previous_response_id": st.sampled_from(["resp_1", 'r"2']),
    "prompt_cache_key": _TEXTS,
    "reasoning": st.fixed_dictionaries(
        {},
        optional={
            k: st.sampled_from(["low", "high"] if k == "effort" else ["auto", "detailed"]) | st.none()
            for k in ("effort", "summary", "generate_summary")
        },
    ),
    "safety_identifier": _TEXTS,
    "service_tier": st.sampled_from(["auto", "default", "flex", "priority"]),
    "store": st.booleans(),
    "temperature": st.sampled_from([0, 1, 2, 0.0, 0.5, 1.25, 2.0]),
    "text": st.sampled_from(
        [
            {},
            {"verbosity": "low"},
            {"format": {"type": "json_object"}},
            {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}, "verbosity": "high"},
        ]
    ),
    "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "tools": st.sampled_from([[], [{"type": "function", "name": "f"}], _TOOLS[2]]),
    "top_logprobs": st.integers(0, 20),
    "top_p": st.sampled_from([0, 1, 0.0, 0.25, 1.0]),
    "truncation": st.sampled_from(["auto", "disabled"]),
    "user": _TEXTS,
    "metadata": st.sampled_from([{}, {"k": "v"}, {"a": '"', "b": ""}]),
    "include": st.sampled_from([[], ["message.output_text.logprobs"], ["reasoning.encrypted_content"]]),
    "stream": st.booleans(),  # not echoed
}
_MAYBE_NULL = {name: values | st.none() for name, values in _SETTINGS.items()}
_BODIES = st.fixed_dictionaries({}, optional=_MAYBE_NULL).map(lambda settings: {"model": "m", "input": "x", **settings})


def _frame(body: dict[str, Any], public_model: str) -> tuple[ResponsesRequest, ResponseFrame] | None:
    try:
        request = ResponsesRequest.model_validate_json(orjson.dumps(body))
    except ValueError:  # (a cross-field rule: not a request the frame sees)
        return None
    return request, ResponseFrame(request, public_model, chat_request_of(request)[1])


def _check(request: ResponsesRequest, frame: ResponseFrame, public_model: str) -> None:
    echo = _reference_echo(request, public_model)
    response = frame.envelope("in_progress", [])
    head = {"id": frame.id, "object": "response", "created_at": frame.created_at, "status": "in_progress"}
    expected = {**head, **echo, "output": [], "usage": None}
    assert response == expected and list(response) == list(expected)
    assert orjson.dumps(response) == orjson.dumps(expected)  # the same values, key by key
    around = frame.around_status()
    assert around is not None
    start, members = around
    assert start + b'in_progress",' + members + b',"output":[],"usage":null}' == orjson.dumps(expected)
    assert frame.logprobs == ("message.output_text.logprobs" in (request.include or ()))
    assert frame.summarises == (echo["reasoning"]["summary"] is not None)


@settings(max_examples=300, deadline=None)
@given(first=_BODIES, second=_BODIES, models=st.sampled_from([("p", "p"), ("p", "q")]))
def test_each_request_gets_its_own_echo_whatever_came_before(
    first: dict[str, Any], second: dict[str, Any], models: tuple[str, str]
) -> None:
    """Two requests' echoes, in either order, with a default one between and after, are each the one
    read from its own settings: no setting of one request shows in another's Response."""
    default = {"model": "m", "input": "x"}
    for body, model in ((first, models[0]), (default, models[0]), (second, models[1]), (first, models[0]),
                        (default, models[1])):  # fmt: skip
        made = _frame(body, model)
        if made is not None:
            _check(*made, model)


def test_a_settings_change_in_one_response_is_not_in_the_next() -> None:
    """Settings that differ from the default and from each other, both ways round."""
    one = {"model": "m", "input": "x", "temperature": 0.5, "max_output_tokens": 9, "instructions": "be brief",
           "store": False, "metadata": {"k": "v"}, "reasoning": {"summary": "auto"}}  # fmt: skip
    two = {"model": "m", "input": "x", "temperature": 1, "top_p": 0.5, "tools": _TOOLS[0], "service_tier": "flex"}
    for bodies in ((one, two), (two, one)):
        for body in (*bodies, {"model": "m", "input": "x"}):
            made = _frame(body, "public")
            assert made is not None
            _check(*made, "public")


@settings(max_examples=200, deadline=None)
@given(
    body=_BODIES,
    finish=st.sampled_from(["stop", "length", "content_filter", "tool_calls", None]),
    text=_TEXTS | st.none(),
    usage=st.booleans(),
)
def test_a_non_stream_answers_bytes_are_its_dicts(body: dict[str, Any], finish: Any, text: Any, usage: bool) -> None:
    """The body written around the echo's bytes is ``orjson.dumps`` of the Response (what the store cuts
    its record from: ``dumped``), completed or incomplete, with or without usage."""
    made = _frame(body, "public")
    if made is None:
        return
    message = {"role": "assistant", "content": text}
    chat: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]}
    if usage:
        chat["usage"] = {"prompt_tokens": 3, "completion_tokens": 2**40, "total_tokens": 2**40 + 3}
    result, response = response_from_chat(orjson.dumps(chat), made[1], "b")
    assert result.dumped and result.answer is response and result.body == orjson.dumps(response)
    reason = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish)
    assert response["incomplete_details"] == (None if reason is None else {"reason": reason})


# --- echoes kept by their settings (echo._SEEN): the same echo for the same scalar settings --------------


def test_the_same_scalar_settings_are_echoed_from_one_kept_echo() -> None:
    """A second request with the same scalar settings gets the echo the first made (the same objects),
    and a request that differs in one of them its own."""
    body = {"model": "m", "input": "x", "temperature": 0.25, "max_output_tokens": 7, "store": False, "user": "u1"}
    first, second = _frame(body, "kept"), _frame({**body, "input": "other words"}, "kept")
    assert first is not None and second is not None
    assert second[1]._template is first[1]._template and second[1]._data is first[1]._data
    other = _frame({**body, "max_output_tokens": 8}, "kept")
    assert other is not None and other[1]._template is not first[1]._template
    for made in (first, second, other):
        _check(*made, "kept")
    elsewhere = _frame(body, "another-model")  # keyed by the public model too
    assert elsewhere is not None and elsewhere[1]._template["model"] == "another-model"
    _check(*elsewhere, "another-model")


@pytest.mark.parametrize(
    ("one", "two"),
    [("-0.0", "0.0"), ("0.0", "-0.0"), ("0", "0.0"), ("1", "1.0")],
)
def test_settings_equal_in_python_but_written_apart_are_echoed_apart(one: str, two: str) -> None:
    """-0.0 == 0.0 (one hash) but orjson writes "-0.0": each request's echo writes its own value."""
    for raw in (one, two, one):
        request = ResponsesRequest.model_validate_json(f'{{"model":"m","input":"x","temperature":{raw}}}')
        frame = ResponseFrame(request, "signs", chat_request_of(request)[1])
        _check(request, frame, "signs")
        around = frame.around_status()
        assert around is not None and orjson.dumps(request.temperature) in around[1]


def test_long_or_per_turn_settings_are_not_kept() -> None:
    """instructions, previous_response_id and strings over _KEY_CHARS: echoed, never kept."""
    echo._SEEN.clear()
    bodies = [
        {"model": "m", "input": "x", "instructions": "short"},
        {"model": "m", "input": "x", "previous_response_id": "resp_1", "store": True},
        {"model": "m", "input": "x", "user": "u" * (echo._KEY_CHARS + 1)},
        {"model": "m", "input": "x", "metadata": {"k": "v"}},  # not a scalar
    ]
    for body in bodies:
        made = _frame(body, "unkept")
        assert made is not None
        _check(*made, "unkept")
    assert echo._SEEN == {}
    made = _frame({"model": "m", "input": "x", "user": "u" * echo._KEY_CHARS}, "unkept")
    assert made is not None and len(echo._SEEN) == 1


def test_the_kept_echoes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting that changes on every request never keeps more than _SEEN_MAX echoes."""
    monkeypatch.setattr(echo, "_SEEN_MAX", 8)
    echo._SEEN.clear()
    for tokens in range(1, 30):
        made = _frame({"model": "m", "input": "x", "max_output_tokens": tokens}, "bounded")
        assert made is not None
        assert len(echo._SEEN) <= 8
        _check(*made, "bounded")

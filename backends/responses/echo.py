"""The request's settings as a Response echoes them (``instructions``, ``temperature``, ``tools``, ...).

Most requests set few of them, so the echo is not rebuilt from every setting per request: a public
model's *default* echo (no setting set) is made once, as the Response's keys and as its members' bytes,
and a request's echo is that one with the settings it set (pydantic's ``__pydantic_fields_set__``: the
request is frozen, so what was not set holds its default) put in, their bytes each put in its place
where the echoed value is a JSON scalar. ``tests/backends/responses/test_response_echo.py`` holds every
echo to the one read setting by setting, across requests in either order.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

import orjson

from schemas.responses import ResponsesRequest
from schemas.responses_tools import CustomTool, FunctionTool, Grammar, NamespaceTool, PlainText

__all__ = ["Echo", "echo_of"]

# A request's echo: the Response's keys in order, the echo's values in place and ``id``,
# ``created_at``, ``status``, ``output``, ``usage`` null (shared between requests: copied, never
# changed); the bytes of its members after ``incomplete_details`` (``instructions`` to ``metadata``)
# as ``orjson.dumps`` writes them (None: to be serialised from the dict, for a member that is not a
# JSON scalar); whether the output_text parts carry logprobs, and whether the reasoning text is given
# as summary too.
Echo = tuple[dict[str, Any], bytes | None, bool, bool]
# The echo's first members, never the request's (``incomplete_details`` set where a Response is incomplete).
FIXED = b'"background":false,"error":null,"incomplete_details":'

_LOGPROBS = "message.output_text.logprobs"


def _dump(value: Any) -> Any:
    return value if isinstance(value, str) else value.model_dump(mode="json", by_alias=True, exclude_none=True)


# The tools' models that hold only plain fields (no alias, extra, serializer or computed field:
# tests/backends/responses/test_response_echo.py checks it): their echo is their fields but None.
_PLAIN_TOOLS = frozenset((FunctionTool, CustomTool, NamespaceTool, Grammar, PlainText))


def _tool_echo(tool: Any) -> Any:
    """``_dump(tool)`` without pydantic's serialiser for a function, custom or namespace tool (12 of
    them, as Codex sends, cost ~30 us a request so): its fields but None, in order, a model within
    (a namespace's tools, a custom tool's format: all plain ones) as itself. A JSON value (a
    function's ``parameters``) is the request's own object, not a copy: checked JSON-safe by the
    schema, and never changed. Built-in tools (OpenAI's options) keep the dump."""
    if type(tool) not in _PLAIN_TOOLS:
        return _dump(tool)
    out = {}
    for name, field in tool.__dict__.items():  # by type and ``in``, no call: once per field of each tool
        if field is None:
            continue
        kind = type(field)
        if kind is list:
            out[name] = [_tool_echo(item) if type(item) in _PLAIN_TOOLS else item for item in field]
        else:
            out[name] = _tool_echo(field) if kind in _PLAIN_TOOLS else field
    return out


def _reasoning(reasoning: Any) -> dict[str, Any]:
    if reasoning is None:
        return {"effort": None, "summary": None}
    return {"effort": reasoning.effort, "summary": reasoning.summary or reasoning.generate_summary}


def _text(text: Any) -> dict[str, Any]:
    return {
        "format": (
            text.format.model_dump(by_alias=True, exclude_none=True)
            if text is not None and text.format is not None
            else {"type": "text"}
        ),
        "verbosity": (text.verbosity if text is not None else None) or "medium",
    }


# The echoed settings whose echo is not the value itself: made from it (from None for the default).
# The others' is the value where it is set (not null): a bool (``store``, ``parallel_tool_calls``), a
# name (``service_tier``, ``truncation``) or ``metadata`` is echoed as sent, and only null has a default.
_MADE: dict[str, Callable[[Any], Any]] = {
    "reasoning": _reasoning,
    "text": _text,
    "tool_choice": lambda value: _dump(value) if value is not None else "auto",
    "tools": lambda value: [_tool_echo(tool) for tool in value] if value else [],
}
# The echo of each of those when unset (or null); any other setting's: null.
_UNSET = {
    "parallel_tool_calls": True,
    "service_tier": "default",
    "store": True,  # ResponsesRequest.stores: true by default
    "truncation": "disabled",
    "metadata": {},
}
# The Response's keys, in order: the echo's members between ``status`` and ``output``.
_MEMBERS = (
    "background", "error", "incomplete_details", "instructions", "max_output_tokens", "max_tool_calls", "model",
    "parallel_tool_calls", "previous_response_id", "prompt_cache_key", "reasoning", "safety_identifier",
    "service_tier", "store", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation",
    "user", "metadata",
)  # fmt: skip
_FIXED = {"background": False, "error": None, "incomplete_details": None}
# The request's fields the echo reads (``model`` is the public name): a request that set none of
# them (nor ``include``: logprobs) has the default echo.
_SETTINGS = frozenset(_MEMBERS) - frozenset(_FIXED) - {"model"}
_READ = _SETTINGS | {"include"}
_KEYS = {name: b'"%b":' % name.encode() for name in _MEMBERS}  # a member's bytes: its key's, its value's
_AT = {name: at - len(_FIXED) for at, name in enumerate(_MEMBERS)}  # its place in the bytes' parts
_SCALARS = frozenset((str, int, float, bool, type(None)))

# Per public model (configured names: a bound only, as for the bridged tables): its default echo,
# and its members' bytes one by one.
_DEFAULTS: dict[str, tuple[Echo, list[bytes]]] = {}


def _default(public_model: str) -> tuple[Echo, list[bytes]]:
    template: dict[str, Any] = {"id": None, "object": "response", "created_at": None, "status": None, **_FIXED}
    for name in _MEMBERS[len(_FIXED) :]:
        template[name] = _MADE[name](None) if name in _MADE else _UNSET.get(name)
    template["model"] = public_model
    template["output"] = template["usage"] = None
    parts = [_KEYS[name] + orjson.dumps(template[name]) for name in _MEMBERS[len(_FIXED) :]]
    if len(_DEFAULTS) > 256:
        _DEFAULTS.clear()
    default = _DEFAULTS[public_model] = ((template, b",".join(parts), False, False), parts)
    return default


# Echoes of requests whose echoed settings are all JSON scalars (a client's settings repeat request
# after request: an agent's temperature, its output limit), by the settings' key (echo_of's): made once,
# then shared as a default is. Bounded: at most _SEEN_MAX echoes (cleared when full: a setting that
# changes on every request makes an echo per request, as without them), none keyed by a string longer
# than _KEY_CHARS, and none by ``instructions`` (long) or ``previous_response_id`` (a new one each turn):
# a request that sets one of those has its echo made every time.
_SEEN: dict[tuple[Any, ...], Echo] = {}
_SEEN_MAX = 1024
_KEY_CHARS = 128
_UNKEYED = frozenset(("instructions", "previous_response_id"))
# The scalars a key holds as themselves, their type beside them: 1, 1.0 and True are equal (one
# hash) but three echoes. A float is keyed by its hex(): -0.0 equals 0.0 but is written "-0.0".
_KEYED = frozenset((int, bool, type(None)))


def echo_of(request: ResponsesRequest, public_model: str) -> Echo:
    """The request's echo (``Echo``), answered as ``public_model``."""
    # ``in`` and ``[]``, no call but the test of the set: on every bridged request
    default = _DEFAULTS[public_model] if public_model in _DEFAULTS else _default(public_model)
    fields = request.__pydantic_fields_set__
    if _READ.isdisjoint(fields):
        return default[0]
    values = request.__dict__  # (one attribute read: a pydantic model's each cost a __getattr__ hook's lookups)
    # The settings' key: each name, then its value's type and the value. No call but a string's len()
    # and a float's hex() (the fields set walked as they are, the few others skipped: no set made).
    key: list[Any] = [public_model]
    for name in fields:
        if name not in _READ:
            continue
        value = values[name]
        kind = type(value)
        if kind is str:
            if len(value) > _KEY_CHARS or name in _UNKEYED:
                return _made(default, values, _READ.intersection(fields))
        elif kind is float:
            value = value.hex()
        elif kind not in _KEYED:  # a list, a dict, a model: not keyed
            return _made(default, values, _READ.intersection(fields))
        key += (name, kind, value)
    seen = tuple(key)
    try:  # (one lookup of the key, hashed once: a kept echo is the usual case)
        return _SEEN[seen]
    except KeyError:
        pass
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    echo = _SEEN[seen] = _made(default, values, _READ.intersection(fields))
    return echo


def _made(default: tuple[Echo, list[bytes]], values: dict[str, Any], names: AbstractSet[str]) -> Echo:
    """The echo of a request whose ``values`` set ``names`` (those of ``_READ``), from its model's ``default``."""
    template = default[0][0].copy()
    parts: list[bytes] | None = default[1].copy()
    logprobs = summarises = False
    for name in names:
        value = values[name]
        if value is None:  # set to null: the default's (made of None)
            continue
        if name in _MADE:
            value = _MADE[name](value)
            if name == "reasoning":
                summarises = value["summary"] is not None  # the reasoning text is given as summary too
        elif name == "include":
            logprobs = _LOGPROBS in value
            continue
        template[name] = value
        if parts is not None:
            if type(value) in _SCALARS:
                try:
                    parts[_AT[name]] = _KEYS[name] + orjson.dumps(value)
                except orjson.JSONEncodeError:  # (an integer beyond 64 bits)
                    parts = None
            else:
                parts = None  # serialised with the Response (around_status: one level down in an event)
    return template, None if parts is None else b",".join(parts), logprobs, summarises

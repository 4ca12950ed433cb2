"""A plain Responses request's chat translation, built without validation (backends/responses/plain_chat.py),
is the one validation builds: the same model classes, values and fields set, all the way down; and it is
never built for a request validation would refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from backends.chat_capabilities import FORMS_NOTE, request_forms
from backends.mock.capabilities import MOCK_CHAT
from backends.native.llamacpp_capabilities import LLAMACPP_CHAT
from backends.native.ollama_capabilities import OLLAMA_CHAT
from backends.native.tgi_capabilities import TGI_CHAT
from backends.responses.capabilities import GATEWAY_FIELDS, RESPONSES_FIELDS, chat_request_of
from backends.responses.plain_chat import PLAIN_FIELDS, SAME_SCALARS, UNREAD_FIELDS, plain_chat_request
from backends.responses.to_chat import ToolNames, Untranslatable, chat_fields, to_chat
from backends.vllm.capabilities import vllm_chat_capabilities
from backends.vllm.versions import VLLMChatFeatures, parse_version
from schemas.chat import TOOLS_NOTE, ChatCompletionRequest
from schemas.chat_messages import FunctionTool as ChatFunctionTool
from schemas.responses import ResponsesRequest
from schemas.responses_items import MessageItem
from schemas.responses_tools import FunctionTool, NamespaceTool


def same(got: Any, want: Any, where: str = "request") -> None:
    """``got`` is ``want`` as pydantic built it: type, fields set, private and extra state, every value."""
    assert type(got) is type(want), where
    if isinstance(want, BaseModel):
        assert got.__pydantic_fields_set__ == want.__pydantic_fields_set__, where
        assert _unnoted(got.__pydantic_private__) == _unnoted(want.__pydantic_private__), where
        assert got.__pydantic_extra__ == want.__pydantic_extra__, where
        assert list(got.__dict__) == list(want.__dict__), where
        for name, value in want.__dict__.items():
            same(got.__dict__[name], value, f"{where}.{name}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


def _unnoted(private: dict[str, Any] | None) -> dict[str, Any] | None:
    """A private slot less what a plain translation records: its forms (checked apart: ``recorded_forms``)
    and its tools' upstream form (``same_upstream``)."""
    if private is None:
        return private
    return {key: value for key, value in private.items() if key not in (FORMS_NOTE, TOOLS_NOTE)} or None


def same_upstream(plain: ChatCompletionRequest, want: ChatCompletionRequest) -> None:
    """What goes upstream from the plain translation is what goes from validation's, byte for byte
    (the tools from their record, validation's through the serializer); each call a fresh copy of
    every tool and spec, so an edit to one body reaches neither the next nor the request."""
    state = plain.__pydantic_private__ or {}
    if plain.tools:
        assert [made for made, _, _ in state[TOOLS_NOTE]] == plain.tools  # the record is of these tools
        assert all(made is tool for (made, _, _), tool in zip(state[TOOLS_NOTE], plain.tools, strict=True))
    else:
        assert TOOLS_NOTE not in state
    body, serialized = plain.upstream_fields(), want.upstream_fields()
    assert orjson.dumps(body) == orjson.dumps(serialized)
    assert orjson.dumps(plain.upstream_fields()) == orjson.dumps(serialized)
    assert plain.model_dump(exclude_none=True, exclude_unset=True, by_alias=True) == serialized
    for tool in body.get("tools", ()):
        spec = tool[tool["type"]]
        spec["name"] = "edited"
        spec.pop("parameters", None)
        tool["type"] = "edited"
    assert orjson.dumps(plain.upstream_fields()) == orjson.dumps(serialized)


def recorded_forms(request: ResponsesRequest, stream: bool, plain: ChatCompletionRequest, want: Any) -> None:
    """The forms plain_chat_request recorded are the ones the chat check's walk reads from the request
    it built (and from validation's), in the walk's order, each once: a check that reads the record
    refuses the first refused form the walk would have."""
    state = plain.__pydantic_private__
    assert state is not None
    values, forms = state[FORMS_NOTE]
    assert values is plain.__dict__
    walked = list(dict.fromkeys(request_forms(want)))
    assert list(forms) == walked == list(dict.fromkeys(request_forms(plain)))
    for table in CHAT_TABLES:  # the check by the record refuses what the walk refuses (a copy is walked)
        fresh = plain_chat_request(request, stream=stream)  # (a check notes a pass: each table its own)
        assert fresh is not None
        assert table.first_refusal(fresh) == table.first_refusal(fresh.model_copy()) == table.first_refusal(want)


CHAT_TABLES = (
    MOCK_CHAT, OLLAMA_CHAT, TGI_CHAT, LLAMACPP_CHAT,
    *(vllm_chat_capabilities(VLLMChatFeatures.of(parse_version(version), parser))
      for version in ("0.8.0", "0.11.0", "0.32.0") for parser in (None, "hermes")),
)  # fmt: skip


def validated(request: ResponsesRequest, stream: bool) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(chat_fields(request, ToolNames(request), stream=stream))


def test_the_plain_fields_are_responses_fields_and_the_unread_ones_gateway_fields() -> None:
    assert PLAIN_FIELDS <= set(RESPONSES_FIELDS)
    assert UNREAD_FIELDS <= set(GATEWAY_FIELDS) - {"include"}  # include is read: logprobs
    assert set(SAME_SCALARS) <= set(ChatCompletionRequest.model_fields)
    for name in SAME_SCALARS:  # the same declaration on both sides, so the Responses check is chat's
        chat, responses = ChatCompletionRequest.model_fields[name], ResponsesRequest.model_fields[name]
        assert (chat.annotation, chat.metadata) == (responses.annotation, responses.metadata), name


@pytest.mark.parametrize("stream", [False, True])
def test_a_sdk_call_is_plain_and_built_as_validation_builds_it(stream: bool) -> None:
    request = ResponsesRequest.model_validate(
        {"model": "m", "input": "Say something", "instructions": "Be brief", "max_output_tokens": 16,
         "temperature": 0, "store": False, "metadata": {"k": "v"}, "stream": stream}
    )  # fmt: skip
    plain = plain_chat_request(request, stream=stream)
    assert plain is not None
    same(plain, validated(request, stream))
    recorded_forms(request, stream, plain, validated(request, stream))
    chat, _ = chat_request_of(request)
    assert chat is plain or chat == plain  # the bridge uses it
    assert chat.upstream_fields()["messages"] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Say something"},
    ]


def test_others_are_validated_and_refused_by_name() -> None:
    # A list of parts that is empty: not built without validation; an empty message chat takes as "".
    request = ResponsesRequest.model_validate({"model": "m", "input": [{"role": "user", "content": []}]})
    assert plain_chat_request(request, stream=False) is None
    assert to_chat(request, ToolNames(request), stream=False).upstream_fields()["messages"][0]["content"] == ""
    # An image in a system message: chat's schema refuses it, named by the client's path.
    image = {"type": "input_image", "image_url": "https://x"}
    request = ResponsesRequest.model_validate({"model": "m", "input": [{"role": "system", "content": [image]}]})
    assert plain_chat_request(request, stream=False) is None
    with pytest.raises(Untranslatable) as caught:
        to_chat(request, ToolNames(request), stream=False)
    assert caught.value.param == "input[0].content[0]"
    # A field outside the plain set (a longer safety_identifier than chat takes): validated, refused by name.
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", "safety_identifier": "s" * 100})
    assert plain_chat_request(request, stream=False) is None
    with pytest.raises(Untranslatable) as caught:
        to_chat(request, ToolNames(request), stream=False)
    assert caught.value.param == "safety_identifier"


_TEXT = st.text(max_size=8)
_PART = st.sampled_from(["input_text", "output_text"]).flatmap(
    lambda kind: st.fixed_dictionaries({"type": st.just(kind), "text": _TEXT})
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "developer"]),
        "content": _TEXT | st.lists(_PART, max_size=3),
    },
    optional={"id": st.just("msg_1"), "type": st.just("message"), "status": st.just("completed")},
)
_OUTPUT = _TEXT | st.lists(
    st.just({"type": "input_text", "text": "ok"}) | st.just({"type": "input_image", "image_url": "https://x/y.png"}),
    max_size=2,
)
_CALL = st.fixed_dictionaries(
    {"type": st.just("function_call"), "call_id": st.sampled_from(["c1", "c2"]),
     "name": st.sampled_from(["f", "spawn"]), "arguments": st.just("{}")},
    optional={"namespace": st.sampled_from(["agents", "n" * 62]), "id": st.just("fc_1")},
)  # fmt: skip
_CALL_OUTPUT = st.fixed_dictionaries(
    {"type": st.sampled_from(["function_call_output", "custom_tool_call_output"]), "call_id": st.just("c1"),
     "output": _OUTPUT},
)  # fmt: skip
_ITEM = st.one_of(
    _MESSAGE,
    st.just({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]}),
    _CALL,
    st.just({"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin"}),
    _CALL_OUTPUT,
    st.just({"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}),
    st.just({"type": "item_reference", "id": "msg_0"}),
)
_SCHEMA = st.just({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]})
_FUNCTION = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.sampled_from(["f", "exec_command", "agents__spawn", "g" * 64])},
    optional={"description": _TEXT, "parameters": _SCHEMA | st.none(), "strict": st.booleans() | st.none()},
)
_CUSTOM = st.fixed_dictionaries(
    {"type": st.just("custom"), "name": st.sampled_from(["apply_patch", "f"])},
    optional={
        "description": _TEXT,
        "format": st.just({"type": "text"}) | st.just({"type": "grammar", "syntax": "lark", "definition": "start: x"}),
    },
)
_NAMESPACE = st.fixed_dictionaries(
    {"type": st.just("namespace"), "name": st.sampled_from(["agents", "n" * 62]), "description": _TEXT,
     "tools": st.lists(_FUNCTION | _CUSTOM, min_size=1, max_size=3, unique_by=lambda tool: tool["name"])},
)  # fmt: skip
_TOOLS = st.lists(
    _FUNCTION | _CUSTOM | _NAMESPACE | st.just({"type": "web_search"}),
    max_size=4,
    unique_by=lambda tool: tool.get("name"),
)
_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "instructions": _TEXT,
    "max_output_tokens": st.integers(1, 2**63 - 1),
    "temperature": st.none() | st.integers(0, 2) | st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "top_k": st.integers(-1, 100),
    "user": _TEXT,
    "ignore_eos": st.booleans(),
    "request_id": st.text(min_size=1, max_size=4),
    "store": st.booleans(),
    "metadata": st.just({"k": "v"}),
    "truncation": st.sampled_from(["auto", "disabled"]),
    "stop": st.just(["\n"]),  # not plain: validated
    "service_tier": st.sampled_from(["auto", "fast"]),  # not plain ("fast": chat has no such tier)
    "include": st.sampled_from(
        [["message.output_text.logprobs"], ["reasoning.encrypted_content"], []]
    ),  # logprobs: not plain (read)
    "tools": _TOOLS,
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]),
    "parallel_tool_calls": st.booleans(),
    "reasoning": st.fixed_dictionaries(
        {}, optional={"summary": st.just("auto"), "effort": st.sampled_from(["low", "high", "none"])}
    ),
    "prompt_cache_key": _TEXT,
}


def _built_as_validation_builds(body: dict[str, Any], stream: bool, omit: bool) -> str:
    """Asserts that what plain_chat_request builds for ``body`` is what validation builds; says which path."""
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError:
        return "refused"  # the Responses schema refuses it: never translated
    if omit:
        request.omit_builtin_tools()  # web_search is left out, as the operator's omit does
    plain = plain_chat_request(request, stream=stream)
    try:
        want = validated(request, stream)
    except (ValidationError, Untranslatable):
        assert plain is None  # what validation or the translation refuses (by name) is never built without it
        return "chat refuses"
    if plain is None:
        return "validated"
    same(plain, want)
    recorded_forms(request, stream, plain, want)
    same_upstream(plain, want)
    # A tool's JSON Schema is copied at the top, as validation copies it (the Responses tool's own is never shared).
    given = [tool.parameters for tool in _function_tools(request.tools or ())]
    for got, made in zip(plain.tools or (), want.tools or (), strict=True):
        if isinstance(made, ChatFunctionTool) and made.function.parameters is not None:
            assert all(got.function.parameters is not schema for schema in given)
            assert [id(v) for v in got.function.parameters.values()] == [
                id(v) for v in made.function.parameters.values()
            ]
    return "plain"


def _function_tools(tools: Any) -> list[Any]:
    every = [inner for tool in tools for inner in (tool.tools if isinstance(tool, NamespaceTool) else [tool])]
    return [tool for tool in every if isinstance(tool, FunctionTool)]


_WEB = {"type": "web_search"}
_SPAWN = {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}
_PATCH = {"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "lark", "definition": "s: x"}}


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [], "tool_choice": "auto"},  # no tools: auto is chat's default, left out
        {"tools": [_WEB], "tool_choice": "auto", "parallel_tool_calls": True},  # only a built-in (omitted)
        {"tools": [_WEB], "tool_choice": "none"},  # none is sent without tools
        {"tools": [_SPAWN], "tool_choice": "required", "parallel_tool_calls": False, "reasoning": {"effort": "low"}},
        {"tools": [{"type": "namespace", "name": "n" * 30, "description": "d", "tools": [{**_SPAWN, "name": "s" * 32},
                                                                                        _PATCH]}]},  # 64: chat's most
        {"tools": [_SPAWN, _PATCH], "input": [
            {"role": "assistant", "content": [{"type": "output_text", "text": "on it"}]},
            {"type": "function_call", "call_id": "c1", "name": "spawn", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "x"},
            {"type": "function_call_output", "call_id": "c1", "output": []},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c3", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        ]},
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
def test_an_edge_of_the_plain_set_is_built_as_validation_builds_it(fields: dict[str, Any], stream: bool) -> None:
    body = {"model": "m", "input": "x", **fields}
    assert _built_as_validation_builds(body, stream, omit=True) == "plain"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"model": st.text(min_size=1, max_size=3), "input": _TEXT | st.lists(_ITEM, max_size=4)}, optional=_OPTIONAL
    ),
    st.booleans(),
)
def test_any_plain_request_is_built_as_validation_builds_it(body: dict[str, Any], stream: bool) -> None:
    _built_as_validation_builds(body, stream, omit=False)


_AGENT: dict[str, st.SearchStrategy[Any]] = {
    key: _OPTIONAL[key]
    for key in ("instructions", "max_output_tokens", "temperature", "store", "include", "tool_choice", "reasoning")
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"model": st.just("m"), "input": st.lists(_ITEM, min_size=1, max_size=6), "tools": _TOOLS},
        optional={**_AGENT, "parallel_tool_calls": st.booleans(), "prompt_cache_key": _TEXT},
    ),
    st.booleans(),
    st.booleans(),
)
def test_any_agent_request_is_built_as_validation_builds_it(body: dict[str, Any], stream: bool, omit: bool) -> None:
    """An agent's turn (tools of every kind, calls and their outputs): most take the path without
    validation (tests/backends/responses: hypothesis's own coverage of it is checked below)."""
    _built_as_validation_builds(body, stream, omit)


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "responses"


@pytest.mark.parametrize("name", ["codex-0.171-turn1.json", "codex-0.171-tool-result.json"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_agents_turn_is_plain_and_built_as_validation_builds_it(name: str, stream: bool) -> None:
    """A recorded Codex turn (its tools, a namespace among them, and, later, its calls and their
    outputs) takes the path without validation, and gets what validation builds."""
    body = {**json.loads((FIXTURES / name).read_text())["body"], "stream": stream}
    request = ResponsesRequest.model_validate(body)
    request.omit_builtin_tools()  # Codex's web_search: what the operator's builtin_tools: omit does
    plain = plain_chat_request(request, stream=stream)
    assert plain is not None
    want = validated(request, stream)
    same(plain, want)
    recorded_forms(request, stream, plain, want)
    same_upstream(plain, want)
    assert chat_request_of(request)[0] is plain or chat_request_of(request)[0] == plain
    assert {"tools", "parallel_tool_calls", "tool_choice"} <= plain.__pydantic_fields_set__


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "namespace", "name": "n" * 40, "description": "d",
                     "tools": [{"type": "function", "name": "f" * 40}]}]},
         "tools[0].tools[0].name"),  # a flattened name of 82
        ({"tools": [{"type": "function", "name": "a__b"},
                    {"type": "namespace", "name": "a", "description": "d",
                     "tools": [{"type": "function", "name": "c"}]}], "tool_choice": {"type": "function", "name": "c"}},
         None),  # resolved
        ({"input": [{"type": "function_call_output", "call_id": "c1",
                     "output": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
         "input[0].output[0]"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 2}, None),
        ({"tools": [{"type": "namespace", "name": f"n{k}", "description": "d",
                     "tools": [{"type": "function", "name": f"f{i}"} for i in range(size)]}
                    for k, size in enumerate((100, 29))]},
         "tools"),  # 129 chat tools: one over chat's most
    ],
)  # fmt: skip
def test_what_validation_refuses_or_resolves_is_not_built_without_it(fields: dict[str, Any], param: str | None) -> None:
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", **fields})
    assert plain_chat_request(request, stream=False) is None
    try:
        want = to_chat(request, ToolNames(request), stream=False)
    except Untranslatable as exc:
        assert exc.param == param  # refused by name, as before
    else:
        assert param is None
        assert want.tool_choice is not None or want.logprobs


_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"model": st.text(min_size=1, max_size=3), "input": _TEXT | st.lists(_ITEM, max_size=3)},
        optional={**_OPTIONAL, "stream": st.booleans(), "tools": st.just([_TOOL])},
    ),
    st.booleans(),
)
def test_chat_request_of_is_to_chat_made_once(body: dict[str, Any], omit: bool) -> None:
    """The translation the check and the call share (plain or validated, with or without the request's
    private state already set) is to_chat's, made on the first call and kept."""
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError:
        return
    if omit:
        request.omit_builtin_tools()  # private state before the translation
    try:
        want = to_chat(request, ToolNames(request), stream=bool(request.stream))
    except Untranslatable as exc:
        with pytest.raises(Untranslatable) as caught:
            chat_request_of(request)
        assert caught.value.param == exc.param
        return
    got, names = chat_request_of(request)
    same(got, want)
    assert bool(names) is False  # no namespace tools here
    assert chat_request_of(request)[0] is got
    assert request.bridged == (got, names)
    assert request.omits_builtin_tools is omit


def test_a_request_given_its_history_is_translated_again() -> None:
    """previous_response_id's expansion (ResponsesRequest.with_input) never reuses a translation
    made from the request's own input: the copy's chat request carries the earlier turns, the
    original keeps its own, and the operator's choice carries over."""
    request = ResponsesRequest.model_validate({"model": "m", "input": "and now?"})
    request.omit_builtin_tools()
    first, _ = chat_request_of(request)  # made before the expansion
    earlier = [
        MessageItem(role="user", content="the first question"),
        MessageItem(role="assistant", content=[{"type": "output_text", "text": "the first answer"}]),
    ]
    expanded = request.with_input([*earlier, MessageItem(role="user", content="and now?")])
    again, _ = chat_request_of(expanded)
    assert [m.role for m in again.messages] == ["user", "assistant", "user"]
    assert "the first question" in str(again.messages[0].content)
    assert [m.role for m in first.messages] == ["user"] and chat_request_of(request)[0] is first
    assert expanded.omits_builtin_tools


def test_the_tools_record_is_read_only_for_the_tools_it_was_made_for() -> None:
    """A copy of the translation with other tools (or the same tools in another list that changed)
    sends those tools, through the serializer: the record of the first ones is never sent for them."""
    body = {"model": "m", "input": "x", "tools": [_TOOL, {**_TOOL, "name": "g", "strict": True}]}
    plain = plain_chat_request(ResponsesRequest.model_validate(body), stream=False)
    assert plain is not None and plain.tools is not None
    other = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"name": "h", "description": "d"}}]}
    ).tools  # fmt: skip
    assert other is not None
    for tools in (other, [plain.tools[1], plain.tools[0]], plain.tools[:1], [*plain.tools, *other]):
        copy = plain.model_copy(update={"tools": tools})
        assert (copy.__pydantic_private__ or {}).get(TOOLS_NOTE) is not None  # the record came along
        assert copy.upstream_fields()["tools"] == [tool.model_dump(exclude_none=True) for tool in tools]
    assert plain.model_copy().upstream_fields() == plain.upstream_fields()  # the same tools: the record

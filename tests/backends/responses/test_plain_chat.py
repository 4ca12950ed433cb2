"""A plain Responses request's chat translation, built without validation (backends/responses/plain_chat.py),
is the one validation builds: the same model classes, values and fields set, all the way down; and it is
never built for a request validation would refuse."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from backends.responses.capabilities import GATEWAY_FIELDS, RESPONSES_FIELDS, chat_request_of
from backends.responses.plain_chat import PLAIN_FIELDS, SAME_SCALARS, UNREAD_FIELDS, plain_chat_request
from backends.responses.to_chat import ToolNames, Untranslatable, chat_fields, to_chat
from schemas.chat import ChatCompletionRequest
from schemas.responses import ResponsesRequest
from schemas.responses_items import MessageItem


def same(got: Any, want: Any, where: str = "request") -> None:
    """``got`` is ``want`` as pydantic built it: type, fields set, private and extra state, every value."""
    assert type(got) is type(want), where
    if isinstance(want, BaseModel):
        assert got.__pydantic_fields_set__ == want.__pydantic_fields_set__, where
        assert got.__pydantic_private__ == want.__pydantic_private__, where
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
_ITEM = st.one_of(
    _MESSAGE,
    st.just({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]}),
    st.just({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
    st.just({"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}),
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
    "include": st.just(["message.output_text.logprobs"]),  # not plain: read
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"model": st.text(min_size=1, max_size=3), "input": _TEXT | st.lists(_ITEM, max_size=4)}, optional=_OPTIONAL
    ),
    st.booleans(),
)
def test_any_plain_request_is_built_as_validation_builds_it(body: dict[str, Any], stream: bool) -> None:
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError:
        return  # the Responses schema refuses it: never translated
    plain = plain_chat_request(request, stream=stream)
    try:
        want = validated(request, stream)
    except ValidationError:
        assert plain is None  # what validation refuses (by name) is never built without it
        return
    if plain is not None:
        same(plain, want)
        assert plain.upstream_fields() == want.upstream_fields()


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

"""The Responses request schema: the current API accepted as real clients send it, anything else refused
by name with the full path (gateway.http.validation.parse_responses_request)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.http.validation import parse_responses_request
from schemas.errors import InvalidRequestError
from schemas.responses import ResponsesRequest
from schemas.responses_items import (
    HOSTED_ITEM_TYPES,
    ITEM_TAGS,
    FunctionCallItem,
    HostedItem,
    ItemReference,
    MessageItem,
)
from schemas.responses_tools import TOOL_TAGS, BuiltinTool, NamespaceTool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "responses"


def parse(body: dict[str, Any]) -> ResponsesRequest:
    return parse_responses_request(orjson.dumps(body))


def refused(body: dict[str, Any]) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as err:
        parse(body)
    return err.value


@pytest.mark.parametrize("name", ["codex-0.171-turn1.json", "codex-0.171-tool-result.json"])
def test_what_codex_sends_is_accepted(name: str) -> None:
    body = json.loads((FIXTURES / name).read_text())["body"]
    request = parse(body)
    assert request.stream and request.store is False and request.client_metadata
    assert request.builtin_tools == ["web_search"]
    assert any(isinstance(t, NamespaceTool) for t in request.tools or ())
    assert request.include == ["reasoning.encrypted_content"]


def test_a_reasoning_item_and_a_call_come_back_as_codex_sends_them() -> None:
    body = json.loads((FIXTURES / "codex-0.171-tool-result.json").read_text())["body"]
    request = parse(body)
    kinds = [item.type for item in request.input or ()]  # type: ignore[union-attr]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]


def test_untyped_items_are_messages_or_references() -> None:
    request = parse({"model": "m", "input": [{"role": "user", "content": "hi"}, {"id": "msg_1"}]})
    items = request.input
    assert isinstance(items, list) and items[0].type == "message" and isinstance(items[1], ItemReference)


def test_the_union_tags_cover_every_type() -> None:
    assert set(HOSTED_ITEM_TYPES) < ITEM_TAGS
    for kind in HOSTED_ITEM_TYPES:  # OpenAI's own items: type checked, body left to OpenAI
        item = parse({"model": "m", "input": [{"type": kind, "id": "x", "anything": [1, {"a": None}]}]}).input
        assert isinstance(item, list) and isinstance(item[0], HostedItem)
    for kind in TOOL_TAGS - {"function", "custom", "namespace"}:
        tools = parse({"model": "m", "input": "x", "tools": [{"type": kind, "option": 1}]}).tools
        assert tools is not None and isinstance(tools[0], BuiltinTool)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "x", "bogus": 1}, "bogus", "unknown_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "y": 1}]}]},
            "input[0].content[0].y",
            "unknown_parameter",
        ),
        (
            {"input": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_txt"}]}]},
            "input[1].content[0].type",
            None,
        ),
        ({"input": [{"type": "bogus"}]}, "input[0].type", None),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments", None),
        ({"input": "x", "tools": [{"type": "wat"}]}, "tools[0].type", None),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}, "x": 1}]},
            "tools[0].x",
            "unknown_parameter",
        ),
        ({"input": "x", "tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name", None),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema", None),
        ({"input": "x", "temperature": 2.5}, "temperature", None),
        ({"input": "x", "top_logprobs": 21}, "top_logprobs", None),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", None),
        ({"input": "x", "max_output_tokens": "5"}, "max_output_tokens", None),
        ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", None),
        ({"input": "x", "include": ["everything"]}, "include[0]", None),
        ({"input": 5}, "input", None),
        ({}, "input", None),
    ],
)
def test_bad_input_is_refused_by_its_full_path(body: dict[str, Any], param: str, code: str | None) -> None:
    error = refused({"model": "m", **body})
    assert error.param == param, error.message
    assert error.code == code


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input[0].content[0].type"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, "tools[1]"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        (
            {
                "input": "x",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
        ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"input": "x", "background": True, "store": False}, "background"),
        ({"input": "x", "conversation": "c", "previous_response_id": "r"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f", "file_url": "u"}]}]},
            "input[0].content[0]",
        ),
        ({"input": "x", "logit_bias": {"x": 1}}, "logit_bias"),
        ({"input": []}, "input"),
        # The input rule runs first on any input that is not a string (check_rules' shortcut): a missing
        # one, ahead of another rule broken; a null-typed message (a subclass) like any other.
        ({}, "input"),
        ({"tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}, "input"),
        ({"input": [{"type": None, "role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": "a"}], "tool_choice": "required"}, "tool_choice"),
    ],
)  # fmt: skip
def test_cross_field_rules_name_the_field(body: dict[str, Any], param: str) -> None:
    assert refused({"model": "m", **body}).param == param


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        # An assistant message takes output_text and refusal (OpenAI's rule, docs/api.md), as a
        # user message takes input parts: accepted, input_text was sent as text, an image refused
        # by a chat path.
        ({"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
            {"type": "output_text", "text": "x"}, {"type": "input_text", "text": "y"}]}]},
         "input[1].content[1].type", "input_text"),
        ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
         "input[0].content[0].type", "input_image"),
        # A model member of a plain union is no part of the path.
        ({"input": "x", "conversation": {"id": 5}}, "conversation.id", "string"),
        ({"input": "x", "conversation": {}}, "conversation.id", "Missing"),
        # Something that is not an object where an item or a tool goes: the item, not its type.
        ({"input": ["hi"]}, "input[0]", "an object"),
        ({"input": [{"role": "user", "content": "a"}, None]}, "input[1]", "an object"),
        ({"input": "x", "tools": [None]}, "tools[0]", "an object"),
        # A part without its type: the missing key, not pydantic's discriminator words.
        ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0].type", "Missing"),
        ({"input": "x", "text": {"format": {"name": "x"}}}, "text.format.type", "Missing"),
        # A function or custom tool named in allowed_tools is the gateway's to translate: checked.
        ({"input": "x", "tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function"}]}},
         "tool_choice.tools[0].name", "Missing"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}],
          "tool_choice": {"type": "allowed_tools", "mode": "auto",
                          "tools": [{"type": "function", "name": "f", "s": 1}]}},
         "tool_choice.tools[0].s", "Unrecognized"),
        # A namespace member given twice: by its own path and name, not the flattened ns__f.
        ({"input": "x", "tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [
            {"type": "function", "name": "f"}, {"type": "custom", "name": "g"}, {"type": "function", "name": "f"}]}]},
         "tools[0].tools[2].name", "'f' is given twice in 'ns'"),
        # A function or custom tool's name given twice, or a namespace member's flattened name taken: the later tool.
        ({"input": "x", "tools": [{"type": "function", "name": "f"}, {"type": "custom", "name": "f"}]},
         "tools[1]", "'f' is given twice"),
        ({"input": "x", "tools": [{"type": "custom", "name": "g"}, {"type": "web_search"},
                                  {"type": "custom", "name": "g"}]},
         "tools[2]", "'g' is given twice"),
        ({"input": "x", "tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [
            {"type": "function", "name": "f"}]}, {"type": "function", "name": "ns__f"}]},
         "tools[1]", "'ns__f' is given twice"),
        # Past its bound: the bound, not the shapes.
        ({"input": [{"role": "user", "content": "a"}] * 10_001}, "input", "at most 10000"),
    ],
)  # fmt: skip
def test_the_param_is_the_clients_path_and_the_message_says_what_is_wrong(
    body: dict[str, Any], param: str, says: str
) -> None:
    error = refused({"model": "m", **body})
    assert (error.param, error.status) == (param, 400), error.message
    assert says in error.message and "Ref" not in error.message and "discriminator" not in error.message


def test_a_null_type_is_the_default_as_for_every_optional_field() -> None:
    """An openai SDK model dumped whole (``EasyInputMessage(...).model_dump()``) sends ``"type": null``;
    the item is what it would be without the key, named by its path when wrong."""
    items = [{"type": None, "role": "user", "content": "hi", "id": None}, {"type": None, "id": "msg_1"}]
    request = parse({"model": "m", "input": items})
    first, second = request.input or ()  # type: ignore[misc]
    assert isinstance(first, MessageItem) and isinstance(second, ItemReference)
    assert (first.type, second.type) == ("message", "item_reference")
    assert first.model_dump(exclude_none=True) == {"type": "message", "role": "user", "content": "hi"}
    bad = refused({"model": "m", "input": [{"type": None, "role": "user", "content": "x", "y": 1}]})
    assert (bad.param, bad.code) == ("input[0].y", "unknown_parameter")


def test_an_empty_content_array_is_a_message() -> None:
    """OpenAI's schema sets no minimum on a message's parts: accepted (the bridge sends an empty message)."""
    items = [{"role": role, "content": []} for role in ("system", "developer", "user", "assistant")]
    assert len(parse({"model": "m", "input": items}).input or ()) == 4


def test_a_namespace_function_may_be_chosen_by_its_own_name() -> None:
    ns = {"type": "namespace", "name": "agents", "description": "d", "tools": [{"type": "function", "name": "spawn"}]}
    request = parse({"model": "m", "input": "x", "tools": [ns], "tool_choice": {"type": "function", "name": "spawn"}})
    assert request.tool_choice is not None
    parse({"model": "m", "input": "x", "tools": [ns], "tool_choice": {"type": "function", "name": "agents__spawn"}})


def test_a_call_keeps_its_namespace_and_async_flag() -> None:
    call = {
        "type": "function_call",
        "call_id": "c",
        "name": "spawn",
        "arguments": "{}",
        "namespace": "agents",
        "async": True,
    }
    item = parse({"model": "m", "input": [call]}).input[0]  # type: ignore[index]
    assert isinstance(item, FunctionCallItem) and item.namespace == "agents" and item.async_ is True


def test_the_served_request_interface() -> None:
    request = parse({"model": "m", "instructions": "be brief", "input": [{"role": "user", "content": "a" * 400}]})
    assert request.output_limit == 16 and not request.output_limit_set and not request.output_bounded
    assert request.output_limit_param == "max_output_tokens" and request.sequences == 1
    assert request.prompt_estimate() >= 100  # the items' text counts
    assert request.routing_text().startswith("<system>be brief<user>")
    assert request.stores  # OpenAI's default
    assert parse({"model": "m", "input": "x", "max_output_tokens": 7}).output_limit == 7


UNKNOWN_TYPE = "Invalid value for 'tools[0].type': unknown tool type; expected one of {}."


@pytest.mark.parametrize(
    ("tool", "param", "message"),
    [
        ("hi", "tools[0]", "Invalid value for 'tools[0]': expected an object."),
        (None, "tools[0]", "Invalid value for 'tools[0]': expected an object."),
        ([], "tools[0]", "Invalid value for 'tools[0]': expected an object."),
        ({}, "tools[0].type", "Invalid value for 'tools[0].type': unknown tool type; expected one of {}."),
        ({"name": "f"}, "tools[0].type", "Invalid value for 'tools[0].type': unknown tool type; expected one of {}."),
        ({"type": None}, "tools[0].type", "Invalid value for 'tools[0].type': unknown tool type; expected one of {}."),
        ({"type": 5}, "tools[0].type", "Invalid value for 'tools[0].type': unknown tool type; expected one of {}."),
        (
            {"type": "Function"},
            "tools[0].type",
            "Invalid value for 'tools[0].type': unknown tool type; expected one of {}.",
        ),
        ({"type": "function"}, "tools[0].name", "Missing required parameter: 'tools[0].name'."),
    ],
)
def test_a_tool_without_a_known_type_is_worded_as_ever(tool: Any, param: str, message: str) -> None:
    """The tools' union is told apart by pydantic (no Python discriminator); its union errors at a tool
    read as the gateway's own, word for word."""
    error = refused({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}, tool]})
    param = param.replace("[0]", "[1]", 1)
    assert (error.param, error.message) == (param, message.replace("[0]", "[1]").format(", ".join(sorted(TOOL_TAGS))))
    assert (error.status, error.code) == (400, None)

"""The Responses table's forms walk (backends/responses/capabilities.request_forms) checks items, parts
and tools by exact type and the refusal matches forms as (field, form) pairs: it yields what a walk by
isinstance yields, and every table refuses what it refused by its ``field=form`` keys, with the same
refusal (param, key, reason), for every form it can meet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.capabilities import Level
from backends.chat_capabilities import Refusal
from backends.mock.capabilities import MOCK_RESPONSES
from backends.native.llamacpp_capabilities import LLAMACPP_RESPONSES
from backends.native.ollama_capabilities import OLLAMA_RESPONSES
from backends.native.tgi_capabilities import TGI_RESPONSES
from backends.openai.capabilities import OPENAI_RESPONSES
from backends.responses.capabilities import RESPONSES_FIELDS, ResponsesCapabilities, request_forms
from backends.vllm.capabilities import vllm_responses_capabilities
from backends.vllm.versions import VLLMChatFeatures, parse_version
from schemas.responses import ResponsesRequest
from schemas.responses_items import FunctionCallItem, InputFile, InputImage, InputText, MessageItem
from schemas.responses_tools import BUILTIN_TOOL_TYPES, CustomTool, FunctionTool

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "responses"


def forms_by_isinstance(request: ResponsesRequest) -> Iterator[tuple[str, str]]:
    """The walk as it was written with isinstance (the reference)."""
    items = request.input
    if items is not None and not isinstance(items, str):
        for item in items:
            yield "input", item.type
            if isinstance(item, MessageItem):
                if item.phase is not None:
                    yield "input", "phase"
                if not isinstance(item.content, str):
                    for part in item.content:
                        if isinstance(part, InputImage):
                            if part.file_id is not None:
                                yield "input", "input_image.file_id"
                            if part.detail == "original":
                                yield "input", "input_image.detail=original"
                        elif isinstance(part, InputFile) and part.file_url is not None:
                            yield "input", "input_file.file_url"
                        if isinstance(part, InputText | InputImage | InputFile) and part.prompt_cache_breakpoint:
                            yield "input", "prompt_cache_breakpoint"
            elif isinstance(item, FunctionCallItem) and (item.caller is not None or item.async_ is not None):
                yield "input", "caller"
    for tool in request.tools or ():
        yield "tools", tool.type
        if isinstance(tool, FunctionTool | CustomTool):
            if tool.defer_loading is not None:
                yield "tools", "defer_loading"
            if tool.allowed_callers is not None:
                yield "tools", "allowed_callers"
            if isinstance(tool, FunctionTool) and tool.output_schema is not None:
                yield "tools", "output_schema"
    choice = request.tool_choice
    if isinstance(choice, str):
        yield "tool_choice", choice
    elif choice is not None:
        yield "tool_choice", choice.type
    # (the options unchanged, as one expression: the forms the walk ends with)
    options = request.reasoning.model_dump(exclude_none=True) if request.reasoning is not None else {}
    obfuscates = request.stream_options is not None and bool(request.stream_options.include_obfuscation)
    yield from [
        *(("include", value) for value in request.include or ()),
        *(("reasoning", name) for name in ("summary", "generate_summary", "context", "mode") if name in options),
        *([("stream_options", "include_obfuscation")] if obfuscates else []),
    ]


def refusal_by_keys(table: ResponsesCapabilities, request: ResponsesRequest) -> Refusal | None:
    """The fields and forms steps as they were written: each form's ``field=form`` key looked up in
    the table (None: both pass, and the chat step, unchanged, decides)."""
    touched = {name for name, level in table.fields.items() if level is Level.UNSUPPORTED}
    for name in RESPONSES_FIELDS:  # (these bodies set no field to its neutral value)
        if name in touched & request.__pydantic_fields_set__ and getattr(request, name) is not None:
            return Refusal(name, name, table.reasons.get(name))
    omit = request.omits_builtin_tools
    for name, form in forms_by_isinstance(request):
        key = f"{name}={form}"
        if table.forms.get(key) is Level.UNSUPPORTED and not (omit and name == "tools" and form in BUILTIN_TOOL_TYPES):
            return Refusal(name, key, table.reasons.get(key))
    return None


BREAKPOINT = {"mode": "explicit"}
IMAGE = {"type": "input_image", "image_url": "https://x/i.png"}
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {
        "type": None,
        "role": "user",
        "content": [{"type": "input_text", "text": "x", "prompt_cache_breakpoint": BREAKPOINT}],
    },
    {"role": "user", "content": [{"type": "input_text", "text": "a", "prompt_cache_breakpoint": BREAKPOINT}]},
    {"role": "user", "content": [{**IMAGE, "detail": "original", "prompt_cache_breakpoint": BREAKPOINT}]},
    {"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]},
    {"role": "user", "content": [{"type": "input_file", "file_url": "https://x/f.pdf"}]},
    {"role": "user", "content": [{"type": "input_file", "file_data": "data:application/pdf;base64,AA"}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "x"}, {"type": "refusal", "refusal": "no"}]},
    {"role": "assistant", "content": "said", "phase": "final_answer"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}", "caller": {"type": "direct"}},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "item_reference", "id": "msg_1"},
    {"type": "web_search_call", "id": "ws_1"},
]
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "f"},
    {"type": "function", "name": "g", "defer_loading": True, "output_schema": {"type": "object"}},
    {"type": "custom", "name": "c", "allowed_callers": ["direct"]},
    {"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function", "name": "h"}]},
    {"type": "web_search"},
]
BODIES: list[dict[str, Any]] = [
    {"input": "hi"},
    *({"input": [item]} for item in ITEMS),
    {"input": ITEMS},
    *({"input": "hi", "tools": [tool]} for tool in TOOLS),
    {"input": "hi", "tools": TOOLS, "tool_choice": "auto"},
    {"input": "hi", "tools": TOOLS[:1], "tool_choice": "required"},
    {"input": "hi", "tools": TOOLS[:1], "tool_choice": {"type": "function", "name": "f"}},
    {"input": "hi", "tool_choice": {"type": "web_search_preview"}, "tools": [{"type": "web_search_preview"}]},
    {"input": "hi", "tool_choice": "none"},
    {"input": "hi", "include": ["message.output_text.logprobs", "reasoning.encrypted_content"]},
    {"input": "hi", "reasoning": {"effort": "low", "summary": "auto"}},
    {"input": "hi", "reasoning": {"generate_summary": "auto"}},
    {"input": "hi", "stream": True, "stream_options": {"include_obfuscation": True}},
    {"input": "hi", "stream": True, "stream_options": {"include_obfuscation": False}},
    *(json.loads((FIXTURES / f"codex-0.171-{name}.json").read_text())["body"] for name in ("turn1", "tool-result")),
]  # fmt: skip
TABLES = {
    "mock": MOCK_RESPONSES,
    "ollama": OLLAMA_RESPONSES,
    "tgi": TGI_RESPONSES,
    "llamacpp": LLAMACPP_RESPONSES,
    "openai": OPENAI_RESPONSES,
    "vllm-0.11-no-parser": vllm_responses_capabilities(VLLMChatFeatures.of(parse_version("0.11.0"), None)),
    "vllm-0.32-hermes": vllm_responses_capabilities(VLLMChatFeatures.of(parse_version("0.32.0"), "hermes")),
}


def requests() -> Iterator[ResponsesRequest]:
    for body in BODIES:
        yield ResponsesRequest.model_validate({"model": "m", **body})


@pytest.mark.parametrize("i", range(len(BODIES)))
def test_the_walk_by_exact_type_yields_what_the_walk_by_isinstance_yields(i: int) -> None:
    request = ResponsesRequest.model_validate({"model": "m", **BODIES[i]})
    assert list(request_forms(request)) == list(forms_by_isinstance(request))


def test_every_form_the_bodies_use_is_met() -> None:
    """The bodies reach every branch of the walk (a branch none reaches would be untested)."""
    met = {pair for request in requests() for pair in request_forms(request)}
    for form in ("phase", "input_image.file_id", "input_image.detail=original", "input_file.file_url",
                 "prompt_cache_breakpoint", "caller", "message", "item_reference", "web_search_call"):  # fmt: skip
        assert ("input", form) in met, form
    for form in ("defer_loading", "allowed_callers", "output_schema", "namespace", "custom", "web_search"):
        assert ("tools", form) in met, form
    assert ("stream_options", "include_obfuscation") in met and ("reasoning", "generate_summary") in met


@pytest.mark.parametrize("omit", [False, True])
@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_table_refuses_a_form_as_its_keys_did(name: str, omit: bool) -> None:
    """The first refused field or form by pairs is the first by keys, with the same param, key and
    reason; where neither step refuses, the chat step (unchanged) decides."""
    table = TABLES[name]
    refused = 0
    for request in requests():
        if omit:
            request.omit_builtin_tools()
        want = refusal_by_keys(table, request)
        if want is not None:
            refused += 1
            assert table.first_refusal(request) == want, (name, request.model_dump(exclude_unset=True))
    assert refused > 3 or name == "openai"  # (a native table refuses no form)

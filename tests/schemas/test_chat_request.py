"""ChatCompletionRequest: every field's types and bounds, the message/tool forms, and the cross-field rules.

Each case runs twice: on a Python dict (``model_validate``) and on the JSON text a client
would send (``model_validate_json``), since strictness differs between the two modes in pydantic.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

import schemas.chat as chat_module
from schemas.chat import ChatCompletionRequest
from schemas.common import FieldRules
from schemas.completions import INT64_MAX
from schemas.errors import FieldRuleError

USER = {"role": "user", "content": "Say hi"}
BASE: dict[str, Any] = {"model": "m", "messages": [USER]}
MODES = ["python", "json"]

FN = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CUSTOM = {"type": "custom", "custom": {"name": "run_sql"}}
TOOLS = [FN, CUSTOM]
ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
}

# Fields whose valid values need another field set (the cross-field rules would refuse them alone).
CONTEXT: dict[str, dict[str, Any]] = {
    "stream_options": {"stream": True},
    "top_logprobs": {"logprobs": True},
    "tool_choice": {"tools": TOOLS},
    "parallel_tool_calls": {"tools": TOOLS},
    "function_call": {"functions": [{"name": "f"}]},
    "audio": {},
    "continue_final_message": {"messages": [USER, {"role": "assistant", "content": "Hel"}]},
    "guided_whitespace_pattern": {"guided_json": {"type": "object"}},
    "guided_decoding_backend": {"guided_regex": "[a-z]+"},
    "logprob_token_ids": {"logprobs": True},
}

BOOL_FIELDS = [
    "store", "stream", "logprobs", "echo", "add_generation_prompt", "add_special_tokens", "include_stop_str_in_output",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "use_beam_search",
    "return_tokens_as_token_ids", "return_token_ids", "include_reasoning", "watermarking",
]  # fmt: skip


LARK = {"type": "grammar", "grammar": {"syntax": "lark", "definition": "x"}}
EBNF = {"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "x"}}


def _penalty(field: str) -> list[tuple[str, Any, bool]]:
    return [
        (field, -2, True), (field, 0, True), (field, 2.0, True), (field, -2.01, False), (field, 2.01, False),
        (field, "0", False), (field, True, False), (field, math.nan, False), (field, math.inf, False),
    ]  # fmt: skip


def _unit_interval(field: str) -> list[tuple[str, Any, bool]]:
    return [
        (field, 0, True), (field, 0.5, True), (field, 1.0, True), (field, -0.01, False), (field, 1.01, False),
        (field, "0.5", False), (field, False, False), (field, math.nan, False),
    ]  # fmt: skip


def _int64(field: str, low: int) -> list[tuple[str, Any, bool]]:
    """Bounded ints: ``low`` and int64 max pass; below, above, strings, floats and bools fail."""
    return [
        (field, low, True), (field, INT64_MAX, True), (field, low - 1, False), (field, INT64_MAX + 1, False),
        (field, "1", False), (field, 1.0, False), (field, True, False),
    ]  # fmt: skip


def _enum(field: str, good: list[str], bad: list[Any]) -> list[tuple[str, Any, bool]]:
    return [(field, v, True) for v in good] + [(field, v, False) for v in bad]


# (field, value, valid). Invalid rows must be refused naming ``field`` (in the loc or as the rule's param).
CASES: list[tuple[str, Any, bool]] = [
    # --- OpenAI ---
    ("messages", [USER], True), ("messages", [], False), ("messages", "hi", False),
    ("messages", [{"content": "x"}], False),
    ("model", "gpt-4o", True), ("model", "", False), ("model", 1, False), ("model", None, False),
    ("modalities", ["text"], True), ("modalities", ["video"], False), ("modalities", [], False),
    ("modalities", "text", False),
    *_enum("verbosity", ["low", "medium", "high"], ["max", "", 1]),
    *_enum("reasoning_effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"], ["extreme", 1]),
    *_int64("max_completion_tokens", 0),
    *_penalty("frequency_penalty"), *_penalty("presence_penalty"),
    ("web_search_options", {}, True), ("web_search_options", {"search_context_size": "low"}, True),
    ("web_search_options", {"user_location": {"type": "approximate", "approximate": {"city": "Oslo"}}}, True),
    ("web_search_options", {"search_context_size": "huge"}, False), ("web_search_options", {"x": 1}, False),
    ("top_logprobs", 0, True), ("top_logprobs", 20, True), ("top_logprobs", 21, False), ("top_logprobs", -1, False),
    ("top_logprobs", "5", False), ("top_logprobs", 5.0, False), ("top_logprobs", True, False),
    ("response_format", {"type": "text"}, True), ("response_format", {"type": "json_object"}, True),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "a-b_1", "schema": {}, "strict": True}}, True),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "description": "d"}}, True),
    ("response_format", {"type": "json_schema"}, False), ("response_format", {"type": "json"}, False),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "bad name", "schema": {}}}, False),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "strict": 1}}, False),
    ("response_format", {"type": "json_object", "schema": {}}, False), ("response_format", "json_object", False),
    ("audio", {"voice": "alloy", "format": "wav"}, True), ("audio", {"voice": "alloy", "format": "ogg"}, False),
    ("audio", {"voice": "alloy"}, False), ("audio", {"voice": "", "format": "mp3"}, False),
    ("stop", "\n", True), ("stop", ["a", "b", "c", "d"], True), ("stop", "", False), ("stop", [], False),
    ("stop", ["a", "b", "c", "d", "e"], False), ("stop", [""], False), ("stop", [1], False), ("stop", 1, False),
    ("logit_bias", {}, True), ("logit_bias", {"0": -100, "50256": 100}, True), ("logit_bias", {"1": 100.5}, False),
    ("logit_bias", {"a": 1}, False), ("logit_bias", {"-1": 1}, False), ("logit_bias", {"²": 1}, False),
    ("logit_bias", {"1": "5"}, False), ("logit_bias", {"1": True}, False),
    *_int64("max_tokens", 0),
    ("n", 1, True), ("n", 128, True), ("n", 0, False), ("n", 129, False), ("n", "1", False), ("n", True, False),
    ("prediction", {"type": "content", "content": "draft"}, True),
    ("prediction", {"type": "content", "content": [{"type": "text", "text": "d"}]}, True),
    ("prediction", {"type": "content"}, False), ("prediction", {"type": "text", "content": "x"}, False),
    *_int64("seed", -(2**63)),
    *_enum("service_tier", ["auto", "default", "flex", "scale", "priority"], ["fast", 1]),
    ("stream_options", {}, True), ("stream_options", {"include_usage": True, "include_obfuscation": False}, True),
    ("stream_options", {"continuous_usage_stats": True}, True), ("stream_options", {"include_usage": 1}, False),
    ("stream_options", {"include_usage": "true"}, False), ("stream_options", {"foo": True}, False),
    ("stream_options", True, False),
    ("temperature", 0, True), ("temperature", 2, True), ("temperature", -0.01, False), ("temperature", 2.01, False),
    ("temperature", "1", False), ("temperature", True, False), ("temperature", math.inf, False),
    *_unit_interval("top_p"),
    ("tools", TOOLS, True), ("tools", [FN], True),
    ("tools", [{"type": "function", "function": {"name": "f", "description": "d", "strict": True}}], True),
    ("tools", [{"type": "custom", "custom": {"name": "g", "format": {"type": "text"}}}], True),
    ("tools", [{"type": "custom", "custom": {"name": "g", "format": LARK}}], True),
    ("tools", [], False), ("tools", [FN, FN], False), ("tools", [{"type": "function"}], False),
    ("tools", [{"type": "function", "function": {"name": "has space"}}], False),
    ("tools", [{"type": "function", "function": {"name": "x" * 65}}], False),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": "{}"}}], False),
    ("tools", [{"type": "retrieval"}], False), ("tools", [FN] * 0 + [dict(FN, extra=1)], False),
    ("tools", [{"type": "custom", "custom": {"name": "g", "format": EBNF}}], False),
    ("tool_choice", "none", True), ("tool_choice", "auto", True), ("tool_choice", "required", True),
    ("tool_choice", {"type": "function", "function": {"name": "get_weather"}}, True),
    ("tool_choice", {"type": "custom", "custom": {"name": "run_sql"}}, True),
    ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}, True),
    ("tool_choice", "any", False), ("tool_choice", {"type": "function", "function": {"name": "nope"}}, False),
    ("tool_choice", {"type": "custom", "custom": {"name": "get_weather"}}, False),
    ("tool_choice", {"type": "function"}, False),
    ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "any", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}, False),
    ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, False),
    ("parallel_tool_calls", True, True), ("parallel_tool_calls", False, True), ("parallel_tool_calls", 0, False),
    ("user", "u-1", True), ("user", 1, False),
    ("safety_identifier", "x" * 64, True), ("safety_identifier", "x" * 65, False), ("safety_identifier", 1, False),
    ("prompt_cache_key", "k", True), ("prompt_cache_key", 1, False),
    ("metadata", {}, True), ("metadata", {"k" * 64: "v" * 512}, True),
    ("metadata", {str(i): "v" for i in range(16)}, True), ("metadata", {str(i): "v" for i in range(17)}, False),
    ("metadata", {"k" * 65: "v"}, False), ("metadata", {"k": "v" * 513}, False), ("metadata", {"k": 1}, False),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}], True), ("functions", [], False),
    ("functions", [{"name": "bad name"}], False),
    ("function_call", "auto", True), ("function_call", "none", True), ("function_call", {"name": "f"}, True),
    ("function_call", {"name": "g"}, False), ("function_call", "required", False),
    # --- vLLM extras ---
    ("add_generation_prompt", True, True), ("continue_final_message", True, True),
    ("continue_final_message", False, True), ("continue_final_message", 1, False),
    ("documents", [{"title": "t", "text": "x"}], True), ("documents", [{"n": 1}], False), ("documents", "x", False),
    ("chat_template", "{{ messages }}", True), ("chat_template", "", False), ("chat_template", 1, False),
    ("chat_template_kwargs", {"enable_thinking": False}, True), ("chat_template_kwargs", [1], False),
    *_int64("top_k", -1),
    *_unit_interval("min_p"),
    ("repetition_penalty", 1.1, True), ("repetition_penalty", 0, False), ("repetition_penalty", math.inf, False),
    ("repetition_penalty", "1.1", False),
    ("length_penalty", -1.5, True), ("length_penalty", math.nan, False), ("length_penalty", "1", False),
    ("stop_token_ids", [], True), ("stop_token_ids", [0, 2], True), ("stop_token_ids", [-1], False),
    ("stop_token_ids", [True], False), ("stop_token_ids", [2**63], False),
    *_int64("min_tokens", 0),
    *_int64("truncate_prompt_tokens", -1),
    *_enum("truncation_side", ["left", "right"], ["both", "", 1]),
    *_int64("prompt_logprobs", -1),
    ("allowed_token_ids", [0, 5], True), ("allowed_token_ids", [], False), ("allowed_token_ids", [-1], False),
    ("allowed_token_ids", [True], False), ("allowed_token_ids", 5, False),
    ("bad_words", [], True), ("bad_words", ["x", "y z"], True), ("bad_words", [""], False), ("bad_words", "x", False),
    ("logprob_token_ids", [3, 7], True), ("logprob_token_ids", [], False), ("logprob_token_ids", [-1], False),
    *_int64("thinking_token_budget", -1),
    ("session_id", "s-1", True), ("session_id", "", False), ("session_id", 1, False),
    ("cache_salt", "salt", True), ("cache_salt", "s" * 1024, True), ("cache_salt", "", False),
    ("cache_salt", "s" * 1025, False),
    ("kv_transfer_params", {"do_remote_decode": True}, True), ("kv_transfer_params", [1], False),
    ("vllm_xargs", {"a": "x", "b": 2, "c": 0.5, "d": ["x", 1, 2.5]}, True), ("vllm_xargs", {"a": {"b": 1}}, False),
    ("vllm_xargs", {"a": True}, False), ("vllm_xargs", {"a": math.inf}, False), ("vllm_xargs", {"a": 2**63}, False),
    ("repetition_detection", {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 3}, True),
    ("repetition_detection", {}, True), ("repetition_detection", {"max_pattern_size": 4, "min_count": 1}, False),
    ("repetition_detection", {"max_pattern_size": 1, "min_pattern_size": 2, "min_count": 2}, False),
    ("repetition_detection", {"max_pattern_size": -1}, False), ("repetition_detection", {"window": 3}, False),
    ("stream_interval", 1, True), ("stream_interval", 0, False), ("stream_interval", 2**63, False),
    ("stream_interval", 1.0, False),
    ("media_io_kwargs", {"video": {"num_frames": 4}}, True), ("media_io_kwargs", {"video": 4}, False),
    ("media_io_kwargs", [1], False), ("mm_processor_kwargs", {"fps": 2}, True), ("mm_processor_kwargs", "x", False),
    ("ec_transfer_params", {"mm_hash": {"peer_port": 1}}, True), ("ec_transfer_params", [1], False),
    *_int64("routed_experts_prompt_start", 0),
    ("guided_json", '{"type": "object"}', True), ("guided_json", {"type": "object"}, True), ("guided_json", 1, False),
    ("guided_regex", "[a-z]+", True), ("guided_regex", "", False),
    ("guided_choice", ["yes", "no"], True), ("guided_choice", [], False), ("guided_choice", [""], False),
    ("guided_grammar", 'root ::= "a"', True), ("guided_grammar", "", False),
    ("guided_decoding_backend", "xgrammar", True), ("guided_decoding_backend", "", False),
    ("guided_whitespace_pattern", r"\s*", True), ("guided_whitespace_pattern", 1, False),
    ("structured_outputs", {"json": {"type": "object"}}, True), ("structured_outputs", {"choice": ["a", "b"]}, True),
    ("structured_outputs", {"regex": "a+", "disable_any_whitespace": True}, True),
    ("structured_outputs", {"json_object": True}, True),
    ("structured_outputs", {}, False), ("structured_outputs", {"json": {}, "regex": "a"}, False),
    ("structured_outputs", {"json_object": False}, False), ("structured_outputs", {"foo": 1}, False),
    *_int64("priority", -(2**63)),
    ("request_id", "r-1", True), ("request_id", "", False), ("request_id", 1, False),
    # --- every boolean: strict, so no 0/1 and no "true" ---
    *[(f, v, True) for f in BOOL_FIELDS for v in (True, False)],
    *[(f, v, False) for f in BOOL_FIELDS for v in (0, 1, "true")],
]  # fmt: skip


def _validate(data: dict[str, Any], mode: str) -> ChatCompletionRequest:
    if mode == "json":
        return ChatCompletionRequest.model_validate_json(json.dumps(data))
    return ChatCompletionRequest.model_validate(data)


def make(mode: str = "python", **fields: Any) -> ChatCompletionRequest:
    return _validate({**BASE, **fields}, mode)


def refusals(exc: ValidationError) -> list[tuple[tuple[int | str, ...], str]]:
    """(loc, param) per error: param is the rule's ``FieldRuleError.param``, else the top of the loc."""
    out = []
    for err in exc.errors():
        rule = err.get("ctx", {}).get("error")
        param = rule.param if isinstance(rule, FieldRuleError) else str(err["loc"][0])
        out.append((tuple(err["loc"]), param))
    return out


def refuse(mode: str = "python", **fields: Any) -> list[tuple[tuple[int | str, ...], str]]:
    with pytest.raises(ValidationError) as info:
        make(mode, **fields)
    return refusals(info.value)


# --- per-field table ------------------------------------------------------------------


def test_table_covers_every_field() -> None:
    fields = set(ChatCompletionRequest.model_fields)
    valid = {f for f, _, ok in CASES if ok}
    invalid = {f for f, _, ok in CASES if not ok}
    assert fields - valid == set()
    assert fields - invalid == set()
    assert {f for f, _, _ in CASES} <= fields


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("field", "value", "ok"), CASES, ids=[f"{f}={v!r}"[:80] for f, v, _ in CASES])
def test_field(field: str, value: Any, ok: bool, mode: str) -> None:
    fields = {**CONTEXT.get(field, {}), field: value}
    if ok:
        request = make(mode, **fields)
        if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
            assert getattr(request, field) == value
        else:
            assert request.upstream_fields()[field] == value
    else:
        found = refuse(mode, **fields)
        assert found and all(param == field for _, param in found), found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field", sorted(set(ChatCompletionRequest.model_fields) - {"model", "messages"}))
def test_every_optional_field_accepts_null(field: str, mode: str) -> None:
    request = make(mode, **{field: None})
    assert getattr(request, field) is None
    assert field not in request.upstream_fields()


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_required_fields(missing: str) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({k: v for k, v in BASE.items() if k != missing})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [((missing,), "missing")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["foo", "Temperature", "prompt", "best_of", "suffix", "early_stopping"])
def test_unknown_field_refused_by_name(name: str, mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, **{name: 1})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [((name,), "extra_forbidden")]


# --- messages: every role, every content form ------------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
FILE = {"type": "file", "file": {"file_data": "data:application/pdf;base64,AA==", "filename": "a.pdf"}}
TEXT = {"type": "text", "text": "hi"}

VALID_MESSAGES: list[tuple[str, list[dict[str, Any]]]] = [
    ("system", [{"role": "system", "content": "be brief", "name": "ops"}, USER]),
    ("system-parts", [{"role": "system", "content": [TEXT]}, USER]),
    ("developer", [{"role": "developer", "content": "be brief"}, USER]),
    ("user-parts", [{"role": "user", "content": [TEXT, IMAGE, AUDIO, FILE], "name": "ann"}]),
    ("user-file-id", [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}]),
    ("user-data-image", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,x"}}]}]),
    ("assistant-text", [USER, {"role": "assistant", "content": "hello"}, USER]),
    ("assistant-parts", [USER, {"role": "assistant", "content": [TEXT, {"type": "refusal", "refusal": "no"}]}]),
    ("assistant-refusal", [USER, {"role": "assistant", "content": None, "refusal": "no", "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "g", "input": "x"}}]}]),
    ("assistant-tool-calls", [USER, ASSISTANT_CALL, {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]),
    ("assistant-no-content", [USER, {k: v for k, v in ASSISTANT_CALL.items() if k != "content"}]),
    ("assistant-audio", [USER, {"role": "assistant", "audio": {"id": "audio_1"}}]),
    ("assistant-function-call", [USER, {"role": "assistant", "content": None,
                                        "function_call": {"name": "f", "arguments": "{}"}}]),
    ("tool-parts", [USER, ASSISTANT_CALL, {"role": "tool", "content": [TEXT], "tool_call_id": "call_1"}]),
    ("function", [USER, {"role": "function", "name": "f", "content": "42"}]),
]  # fmt: skip

INVALID_MESSAGES: list[tuple[str, list[Any]]] = [
    ("unknown-role", [{"role": "bot", "content": "x"}]),
    ("no-role", [{"content": "x"}]),
    ("null-user-content", [{"role": "user", "content": None}]),
    ("empty-parts", [{"role": "user", "content": []}]),
    ("unknown-part", [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]),
    ("image-in-system", [{"role": "system", "content": [IMAGE]}]),
    ("image-in-tool", [{"role": "tool", "content": [IMAGE], "tool_call_id": "c"}]),
    ("image-in-assistant", [{"role": "assistant", "content": [IMAGE]}]),
    ("refusal-in-user", [{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]),
    ("empty-image-url", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]),
    ("bad-detail", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "x"}}]}]),
    ("bad-audio-format", [{"role": "user", "content": [{"type": "input_audio",
                                                         "input_audio": {"data": "x", "format": "ogg"}}]}]),
    ("tool-without-id", [{"role": "tool", "content": "x"}]),
    ("tool-empty-id", [{"role": "tool", "content": "x", "tool_call_id": ""}]),
    ("assistant-null-no-calls", [{"role": "assistant", "content": None}]),
    ("assistant-empty-calls", [{"role": "assistant", "content": None, "tool_calls": []}]),
    ("call-without-id", [{"role": "assistant", "tool_calls": [{"type": "function",
                                                                "function": {"name": "f", "arguments": "{}"}}]}]),
    ("call-object-args", [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                                 "function": {"name": "f", "arguments": {}}}]}]),
    ("extra-key", [{"role": "user", "content": "x", "foo": 1}]),
    ("int-content", [{"role": "user", "content": 5}]),
    ("string-message", ["hello"]),
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("messages", [m for _, m in VALID_MESSAGES], ids=[n for n, _ in VALID_MESSAGES])
def test_message_forms(messages: list[dict[str, Any]], mode: str) -> None:
    request = make(mode, messages=messages)
    assert request.upstream_fields()["messages"] == [{k: v for k, v in m.items() if v is not None} for m in messages]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("messages", [m for _, m in INVALID_MESSAGES], ids=[n for n, _ in INVALID_MESSAGES])
def test_invalid_messages(messages: list[Any], mode: str) -> None:
    found = refuse(mode, messages=messages)
    assert found and all(param == "messages" for _, param in found), found


# --- cross-field rules ---------------------------------------------------------------------

# (fields, the param the rule must name)
RULE_BREAKS: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens"),
    ({"max_tokens": 0, "max_completion_tokens": 10}, "max_tokens"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"top_logprobs": 0, "logprobs": False}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream_options": {}, "stream": False}, "stream_options"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "run_sql"}}, "tools": TOOLS}, "tool_choice"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_weather"}},
        {"type": "function", "function": {"name": "missing"}}]}}, "tools": TOOLS}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": [FN, {"type": "custom", "custom": {"name": "get_weather"}}]}, "tools"),
    ({"function_call": "auto"}, "function_call"),
    ({"function_call": {"name": "g"}, "functions": [{"name": "f"}]}, "function_call"),
    ({"modalities": ["text", "audio"]}, "audio"),
    ({"continue_final_message": True, "add_generation_prompt": True,
      "messages": [USER, {"role": "assistant", "content": "Hel"}]}, "continue_final_message"),
    ({"continue_final_message": True}, "continue_final_message"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"min_tokens": 5, "max_completion_tokens": 4}, "min_tokens"),
    ({"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
    ({"prompt_logprobs": -1, "stream": True}, "prompt_logprobs"),
    ({"logprob_token_ids": [1]}, "logprob_token_ids"),
    ({"logprob_token_ids": [1], "logprobs": True, "use_beam_search": True}, "logprob_token_ids"),
    ({"routed_experts_prompt_start": 0, "stream": True}, "routed_experts_prompt_start"),
    ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json"),
    ({"guided_json": {}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_choice": ["a"], "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"guided_whitespace_pattern": r"\s*"}, "guided_whitespace_pattern"),
    ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ({"guided_decoding_backend": "xgrammar", "response_format": {"type": "json_object"}}, "guided_decoding_backend"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": [USER, {"role": "assistant", "content": None}]}, "messages"),
]  # fmt: skip

RULE_KEEPS: list[dict[str, Any]] = [
    {"max_tokens": 5, "max_completion_tokens": None},
    {"max_completion_tokens": 5},
    {"logprobs": True, "top_logprobs": 0},
    {"logprobs": True},
    {"tool_choice": "none"},
    {"tools": TOOLS},
    {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    {"function_call": "none"},
    {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"}},
    {"modalities": ["text"]},
    {"continue_final_message": True, "add_generation_prompt": False,
     "messages": [USER, {"role": "assistant", "content": "Hel"}]},
    {"continue_final_message": False, "add_generation_prompt": True},
    {"min_tokens": 4, "max_tokens": 4},
    {"min_tokens": 100},
    {"prompt_logprobs": 2, "stream": False},
    {"logprob_token_ids": [1, 2], "logprobs": True, "top_logprobs": 3},
    {"routed_experts_prompt_start": 3, "stream": False},
    {"use_beam_search": True, "n": 3, "stream": True},  # vLLM streams beams in chat (not in completions)
    {"response_format": {"type": "text"}, "guided_regex": "a+", "guided_decoding_backend": "outlines"},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "tools": TOOLS},
    {"guided_json": {"type": "object"}, "guided_whitespace_pattern": r"[ ]?"},
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fields", "param"), RULE_BREAKS, ids=[f"{p}:{sorted(f)}" for f, p in RULE_BREAKS])
def test_cross_field_rule_names_param(fields: dict[str, Any], param: str, mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, **fields)
    [err] = info.value.errors()
    assert err["loc"] == ()
    rule = err["ctx"]["error"]
    assert isinstance(rule, FieldRuleError)
    assert rule.param == param
    assert param in rule.message


@pytest.mark.parametrize("mode", MODES)
def test_both_max_token_fields_named(mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, max_tokens=1, max_completion_tokens=2)
    message = info.value.errors()[0]["ctx"]["error"].message
    assert "max_tokens" in message and "max_completion_tokens" in message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fields", RULE_KEEPS, ids=[str(sorted(f)) for f in RULE_KEEPS])
def test_cross_field_rule_allows(fields: dict[str, Any], mode: str) -> None:
    make(mode, **fields)


# Two rules broken at once: the earlier rule (in the validator's order) is the error, as when
# each rule was its own model_validator.
RULE_ORDER: list[tuple[dict[str, Any], str]] = [
    ({"messages": [USER, {"role": "assistant", "content": None}], "max_tokens": 1, "max_completion_tokens": 1},
     "messages"),
    ({"max_tokens": 1, "max_completion_tokens": 1, "top_logprobs": 2}, "max_tokens"),
    ({"top_logprobs": 2, "stream_options": {}}, "top_logprobs"),
    ({"stream_options": {}, "logit_bias": {"abc": 1}}, "stream_options"),
    ({"logit_bias": {"abc": 1}, "tool_choice": "auto"}, "logit_bias"),
    ({"parallel_tool_calls": True, "function_call": "auto"}, "parallel_tool_calls"),
    ({"function_call": "auto", "modalities": ["audio"]}, "function_call"),
    ({"modalities": ["audio"], "continue_final_message": True}, "audio"),
    ({"continue_final_message": True, "min_tokens": 5, "max_tokens": 4}, "continue_final_message"),
    ({"min_tokens": 5, "max_tokens": 4, "guided_decoding_backend": "xgrammar"}, "min_tokens"),
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fields", "param"), RULE_ORDER, ids=[p for _, p in RULE_ORDER])
def test_first_rule_broken_is_the_error(fields: dict[str, Any], param: str, mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, **fields)
    [err] = info.value.errors()
    assert err["ctx"]["error"].param == param


def test_plain_request_runs_only_the_message_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request with messages and sampling fields only pays for the message check (issue 14)."""
    ran: list[str] = []
    rules = tuple((fields, lambda _r, f=fields: ran.append(min(f))) for fields, _ in chat_module._RULES)
    monkeypatch.setattr(chat_module, "_RULES", FieldRules(*rules))
    make(max_tokens=16, temperature=0.5, top_p=1.0, n=1, stream=True, seed=1, stop="x", user="u")
    assert ran == []
    make(tools=TOOLS, min_tokens=1)
    assert ran == ["parallel_tool_calls", "min_tokens"]


@pytest.mark.parametrize(
    "fields",
    [
        *RULE_KEEPS,
        {"messages": [{"role": "user", "content": "x", "name": None},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                       "refusal": None},
                      {"role": "tool", "content": [{"type": "text", "text": "r"}], "tool_call_id": "c"}]},
        {"structured_outputs": {"json": {"a": None}, "disable_fallback": None}, "stream_options": None},
        {"temperature": 0, "top_p": 0.5, "stop": ["a", "b"], "logit_bias": {"1": 2}, "metadata": {"k": "v"},
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"a": None}}},
         "guided_json": None, "chat_template_kwargs": {"x": None, "y": [1, None]}, "stop_token_ids": [1, 2],
         "documents": [{"a": "b"}], "seed": 3, "user": "u", "stream": False},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": "bob"},
                      {"role": "assistant", "content": "a"},
                      {"role": "user", "content": [{"type": "text", "text": "t"}]},
                      {"role": "function", "content": None, "name": "f"}, {"role": "developer", "content": "d"}]},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "parallel_tool_calls": True},
    ],
    ids=str,
)  # fmt: skip
def test_upstream_fields_is_model_dump(fields: dict[str, Any]) -> None:
    """``upstream_fields`` builds from the set fields alone; its output must stay exactly the dump's, key order
    included (and a copy: callers edit it)."""
    request = make("json", **fields)
    dump = request.model_dump(exclude_none=True, exclude_unset=True, by_alias=True)
    fields_out = request.upstream_fields()
    assert list(fields_out.items()) == list(dump.items())
    for name, value in fields_out.items():
        if isinstance(value, dict | list):
            assert value is not getattr(request, name)


_FLAG = [None, True, False, "unset"]


@pytest.mark.parametrize("flags", list(itertools.product(_FLAG, _FLAG, _FLAG)), ids=str)
def test_upstream_fields_dumps_stream_options_as_its_serializer(flags: tuple[Any, Any, Any]) -> None:
    """``stream_options`` (the Responses bridge sets it on every stream) takes a path of its own: its flags
    set to a value, in declared order, as the dump gives them (and a copy)."""
    names = ("include_usage", "include_obfuscation", "continuous_usage_stats")
    options = {name: flag for name, flag in zip(names, flags, strict=True) if flag != "unset"}
    request = make("json", stream=True, stream_options=options)
    dump = request.model_dump(exclude_none=True, exclude_unset=True, by_alias=True)
    got = request.upstream_fields()["stream_options"]
    assert list(got.items()) == list(dump["stream_options"].items())
    assert got is not request.stream_options.__dict__


# --- helpers --------------------------------------------------------------------------------


def test_upstream_fields_keeps_wire_names_and_round_trips() -> None:
    request = make(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        structured_outputs=None,
        seed=INT64_MAX,
        priority=-(2**63),
        temperature=None,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": None},
    )
    fields = request.upstream_fields()
    assert fields == {
        **BASE,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "seed": INT64_MAX,
        "priority": -(2**63),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert json.loads(json.dumps(fields)) == fields
    assert make(structured_outputs={"json": {"type": "object"}}).upstream_fields()["structured_outputs"] == {
        "json": {"type": "object"}
    }


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({}, None), ({"max_tokens": 7}, 7), ({"max_completion_tokens": 9}, 9), ({"max_completion_tokens": 0}, 0)],
)
def test_max_output_tokens(fields: dict[str, Any], expected: int | None) -> None:
    assert make(**fields).max_output_tokens == expected


@pytest.mark.parametrize(("n", "expected"), [(None, 1), (1, 1), (4, 4)])
def test_effective_n(n: int | None, expected: int) -> None:
    assert make(n=n).effective_n == expected


def test_request_is_frozen() -> None:
    request = make()
    with pytest.raises(ValidationError):
        request.temperature = 0.5  # type: ignore[misc]


def test_message_text_reads_every_kind() -> None:
    """The estimate and the routing text read string content, text and refusal parts, and the
    assistant's tool calls; image parts and null content count nothing."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    request = make(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "sys"}]},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "https://x/i.png"}}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "function", "content": None, "name": "f"},
        ]
    )  # fmt: skip
    tool_call = str(request.messages[3].tool_calls[0])  # type: ignore[union-attr,index]
    assert "f" in tool_call and '{"a": 1}' in tool_call
    assert request.routing_text() == (f"<system>sys<user>look<assistant>no<assistant>{tool_call}<tool>42<function>")
    chars = len("sys") + len("look") + len("no") + len(tool_call) + len("42")
    assert request.prompt_estimate() == chars // 4 + 3 * 6 + 3


def test_upstream_fields_assumes_no_top_level_alias() -> None:
    # upstream_fields writes each set field under its Python name; an alias here would need it to change.
    assert all(f.alias in (None, name) for name, f in ChatCompletionRequest.model_fields.items())

"""CompletionRequest: every field's types and bounds, the prompt forms, and the cross-field rules.

Each case runs twice: on a Python dict (``model_validate``) and on the JSON text a client
would send (``model_validate_json``), since strictness differs between the two modes in pydantic.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from schemas.common import FieldRules
from schemas.completions import DEFAULT_MAX_TOKENS, INT64_MAX, CompletionRequest
from schemas.errors import FieldRuleError

BASE: dict[str, Any] = {"model": "m", "prompt": "Say hi"}
MODES = ["python", "json"]

# Fields whose valid values need another field set (the cross-field rules would refuse them alone).
CONTEXT: dict[str, dict[str, Any]] = {
    "stream_options": {"stream": True},
    "guided_whitespace_pattern": {"guided_json": {"type": "object"}},
    "guided_decoding_backend": {"guided_regex": "[a-z]+"},
    "logprob_token_ids": {"logprobs": 0},
}

BOOL_FIELDS = [
    "echo",
    "stream",
    "use_beam_search",
    "early_stopping",
    "include_stop_str_in_output",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "add_special_tokens",
]


def _penalty(field: str) -> list[tuple[str, Any, bool]]:
    return [
        (field, -2, True), (field, -2.0, True), (field, 0, True), (field, 1.5, True), (field, 2.0, True),
        (field, -2.01, False), (field, 2.01, False), (field, "0", False), (field, True, False),
        (field, math.nan, False), (field, math.inf, False),
    ]  # fmt: skip


def _unit_interval(field: str) -> list[tuple[str, Any, bool]]:
    return [
        (field, 0, True), (field, 0.5, True), (field, 1, True), (field, 1.0, True),
        (field, -0.01, False), (field, 1.01, False), (field, "0.5", False), (field, False, False),
        (field, math.nan, False),
    ]  # fmt: skip


# (field, value, valid). Invalid rows must be refused naming ``field`` (in the loc or as the rule's param).
CASES: list[tuple[str, Any, bool]] = [
    # --- OpenAI ---
    ("model", "gpt-3.5-turbo-instruct", True), ("model", "", False), ("model", 1, False), ("model", None, False),
    ("best_of", 1, True), ("best_of", 20, True), ("best_of", 21, False), ("best_of", 0, False),
    ("best_of", -1, False), ("best_of", "2", False), ("best_of", 2.0, False), ("best_of", True, False),
    *_penalty("frequency_penalty"),
    ("logit_bias", {}, True), ("logit_bias", {"0": -100, "50256": 100}, True), ("logit_bias", {"7": 0.5}, True),
    ("logit_bias", {"1": 100.5}, False), ("logit_bias", {"1": -100.5}, False), ("logit_bias", {"-1": 1}, False),
    ("logit_bias", {"a": 1}, False), ("logit_bias", {"1.5": 1}, False), ("logit_bias", {"": 1}, False),
    ("logit_bias", {" 1": 1}, False), ("logit_bias", {"²": 1}, False), ("logit_bias", {"1": "5"}, False),
    ("logit_bias", {"1": True}, False), ("logit_bias", [[1, 5]], False),
    # Above 5 is the capability table's call (OpenAI: 5, vLLM: --max-logprobs), not the schema's.
    ("logprobs", 0, True), ("logprobs", 5, True), ("logprobs", 20, True), ("logprobs", -1, False),
    ("logprobs", 2**63, False),
    ("logprobs", "1", False), ("logprobs", 1.0, False), ("logprobs", True, False),
    ("max_tokens", 0, True), ("max_tokens", 1, True), ("max_tokens", 1_000_000, True), ("max_tokens", -1, False),
    ("max_tokens", 2**63, False), ("max_tokens", 2**64, False), ("max_tokens", 10**30, False),
    ("max_tokens", "16", False), ("max_tokens", 16.0, False), ("max_tokens", 1.5, False), ("max_tokens", True, False),
    ("n", 1, True), ("n", 128, True), ("n", 0, False), ("n", 129, False), ("n", "1", False), ("n", 1.5, False),
    ("n", True, False),
    *_penalty("presence_penalty"),
    ("seed", -(2**63), True), ("seed", 0, True), ("seed", INT64_MAX, True), ("seed", 2**63, False),
    ("seed", -(2**63) - 1, False), ("seed", "1", False), ("seed", 1.0, False), ("seed", False, False),
    ("stop", "\n", True), ("stop", ["a"], True), ("stop", ["a", "b", "c", "d"], True), ("stop", "", False),
    ("stop", [], False), ("stop", ["a", "b", "c", "d", "e"], False), ("stop", [""], False), ("stop", ["a", ""], False),
    ("stop", [1], False), ("stop", 1, False), ("stop", ["a", None], False),
    ("stream_options", {}, True), ("stream_options", {"include_usage": True}, True),
    ("stream_options", {"continuous_usage_stats": False}, True), ("stream_options", {"include_usage": 1}, False),
    ("stream_options", {"include_usage": "true"}, False), ("stream_options", "yes", False),
    ("stream_options", True, False),
    ("suffix", "!", True), ("suffix", "", True), ("suffix", 1, False), ("suffix", ["x"], False),
    ("temperature", 0, True), ("temperature", 0.7, True), ("temperature", 2, True), ("temperature", -0.01, False),
    ("temperature", 2.01, False), ("temperature", "1", False), ("temperature", True, False),
    ("temperature", math.nan, False), ("temperature", math.inf, False),
    *_unit_interval("top_p"),
    ("user", "user-1", True), ("user", "", True), ("user", 1, False),
    # --- vLLM extras ---
    ("top_k", -1, True), ("top_k", 0, True), ("top_k", 50, True), ("top_k", -2, False), ("top_k", 1.0, False),
    ("top_k", 2**64, False),
    ("top_k", "5", False), ("top_k", True, False),
    *_unit_interval("min_p"),
    ("length_penalty", -1.5, True), ("length_penalty", 0, True), ("length_penalty", 2.0, True),
    ("length_penalty", "1", False), ("length_penalty", math.nan, False), ("length_penalty", math.inf, False),
    ("length_penalty", -math.inf, False),
    ("repetition_penalty", 0.01, True), ("repetition_penalty", 1, True), ("repetition_penalty", 2.0, True),
    ("repetition_penalty", 0, False), ("repetition_penalty", 0.0, False), ("repetition_penalty", -1.0, False),
    ("repetition_penalty", math.inf, False), ("repetition_penalty", "1.1", False),
    ("stop_token_ids", [], True), ("stop_token_ids", [0, 2, 50256], True), ("stop_token_ids", [-1], False),
    ("stop_token_ids", [1.0], False), ("stop_token_ids", ["1"], False), ("stop_token_ids", [True], False),
    ("stop_token_ids", 1, False), ("stop_token_ids", [2**64], False),
    ("min_tokens", 0, True), ("min_tokens", DEFAULT_MAX_TOKENS, True), ("min_tokens", DEFAULT_MAX_TOKENS + 1, False),
    ("min_tokens", -1, False), ("min_tokens", 2**64, False), ("min_tokens", "1", False), ("min_tokens", 1.0, False),
    ("guided_json", '{"type": "object"}', True), ("guided_json", {"type": "object"}, True),
    ("guided_json", 1, False), ("guided_json", ["a"], False),
    ("guided_json", {"maximum": 2**64 - 1, "minimum": -(2**63)}, True),
    ("guided_json", {"maximum": 2**64}, False), ("guided_json", {"a": [{"b": -(2**63) - 1}]}, False),
    ("guided_json", {"maximum": math.inf}, False),
    ("logit_bias", {str(2**63 - 1): 1}, True), ("logit_bias", {str(2**64): 1}, False),
    ("logit_bias", {"1" * 5000: 1}, False),
    ("early_stopping", "never", True), ("early_stopping", "always", False),
    # --- current vLLM's fields ---
    ("truncate_prompt_tokens", -1, True), ("truncate_prompt_tokens", 128, True),
    ("truncate_prompt_tokens", -2, False), ("truncate_prompt_tokens", 2**64, False),
    ("truncate_prompt_tokens", "1", False),
    ("truncation_side", "left", True), ("truncation_side", "right", True), ("truncation_side", "middle", False),
    ("allowed_token_ids", [0, 5], True), ("allowed_token_ids", [], False), ("allowed_token_ids", [-1], False),
    ("allowed_token_ids", [2**64], False),
    ("prompt_logprobs", 0, True), ("prompt_logprobs", -1, True), ("prompt_logprobs", 20, True),
    ("prompt_logprobs", -2, False), ("prompt_logprobs", 2**64, False), ("prompt_logprobs", True, False),
    ("return_tokens_as_token_ids", True, True), ("return_tokens_as_token_ids", 1, False),
    ("return_token_ids", True, True), ("return_token_ids", "yes", False),
    ("structured_outputs", {"json": {"type": "object"}}, True), ("structured_outputs", {"regex": "[a-z]+"}, True),
    ("structured_outputs", {"choice": ["a", "b"]}, True), ("structured_outputs", {"grammar": 'root ::= "a"'}, True),
    ("structured_outputs", {"json_object": True, "disable_any_whitespace": True}, True),
    ("structured_outputs", {"json": {"a": 2**64}}, False),
    ("structured_outputs", {"regex": "a", "choice": ["a"]}, False),
    ("structured_outputs", {"jsn": {}}, False), ("structured_outputs", {"choice": []}, False),
    ("structured_outputs", "json", False),
    ("guided_regex", "[a-z]+", True), ("guided_regex", "", False), ("guided_regex", 1, False),
    ("guided_choice", ["yes", "no"], True), ("guided_choice", ["only"], True), ("guided_choice", [], False),
    ("guided_choice", [""], False), ("guided_choice", "yes", False), ("guided_choice", [1], False),
    ("guided_grammar", 'root ::= "a"', True), ("guided_grammar", "", False), ("guided_grammar", 1, False),
    ("guided_decoding_backend", "xgrammar", True), ("guided_decoding_backend", "", False),
    ("guided_decoding_backend", 1, False),
    ("guided_whitespace_pattern", r"\s*", True), ("guided_whitespace_pattern", "", True),
    ("guided_whitespace_pattern", 1, False),
    # --- vLLM's own fields chat takes too (schemas.vllm_extras): the same bounds as chat's ---
    ("bad_words", ["x", "y z"], True), ("bad_words", [""], False), ("bad_words", "x", False),
    ("logprob_token_ids", [1, 2], True), ("logprob_token_ids", [], False), ("logprob_token_ids", [-1], False),
    ("thinking_token_budget", -1, True), ("thinking_token_budget", 64, True), ("thinking_token_budget", -2, False),
    ("watermarking", True, True), ("watermarking", 1, False),
    ("priority", -5, True), ("priority", 2**63, False), ("priority", 1.5, False),
    ("request_id", "r-1", True), ("request_id", "", False),
    ("session_id", "s-1", True), ("session_id", "", False),
    ("routed_experts_prompt_start", 0, True), ("routed_experts_prompt_start", -1, False),
    ("cache_salt", "x" * 1024, True), ("cache_salt", "x" * 1025, False), ("cache_salt", "", False),
    ("kv_transfer_params", {"do_remote_decode": True}, True), ("kv_transfer_params", {"a": math.nan}, False),
    ("kv_transfer_params", [], False),
    ("ec_transfer_params", {"e": [1]}, True), ("ec_transfer_params", "x", False),
    ("vllm_xargs", {"a": "s", "b": 2**63 - 1, "c": 0.5, "d": [1, "x"]}, True),
    ("vllm_xargs", {"a": 2**63}, False), ("vllm_xargs", {"a": {"b": 1}}, False),
    ("repetition_detection", {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 3}, True),
    ("repetition_detection", {"max_pattern_size": 4, "min_count": 1}, False),
    ("repetition_detection", {"min_pattern_size": 3}, False), ("repetition_detection", {"size": 3}, False),
    ("stream_interval", 1, True), ("stream_interval", 0, False), ("stream_interval", 1.0, False),
    # --- vLLM's response_format (chat's forms plus structural_tag) and prompt_embeds ---
    ("response_format", {"type": "text"}, True), ("response_format", {"type": "json_object"}, True),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}, True),
    ("response_format", {"type": "structural_tag", "format": {"type": "triggered_tags"}}, True),
    ("response_format", {"type": "structural_tag", "structures": [{"begin": "<f>", "end": "</f>"}],
                         "triggers": ["<f"]}, True),
    ("response_format", {"type": "json_schema"}, False), ("response_format", {"type": "xml"}, False),
    ("response_format", {"type": "json_object", "schema": {}}, False), ("response_format", "json_object", False),
    ("response_format", {"type": "structural_tag"}, False),
    ("response_format", {"type": "structural_tag", "format": {}, "triggers": ["<f"]}, False),
    ("response_format", {"type": "structural_tag", "structures": [{"begin": "<f>", "end": "</f>"}]}, False),
    ("response_format", {"type": "structural_tag", "structures": [], "triggers": ["<f"]}, False),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "n", "schema": {"m": 2**64}}}, False),
    ("prompt_embeds", "UEsDBA==", True), ("prompt_embeds", ["UEsDBA==", "gAJ9cQAu"], True),
    ("prompt_embeds", "", False), ("prompt_embeds", [], False), ("prompt_embeds", "UEsDBA=", False),
    ("prompt_embeds", "UEsD BA==", False), ("prompt_embeds", "UEsD!A==", False),
    ("prompt_embeds", ["UEsDBA==", 1], False),
    # --- every boolean: strict, so no 0/1 and no "true" ---
    *[(f, v, True) for f in BOOL_FIELDS for v in (True, False)],
    *[(f, v, False) for f in BOOL_FIELDS for v in (0, 1, "true", "false")],
]  # fmt: skip


def _validate(data: dict[str, Any], mode: str) -> CompletionRequest:
    if mode == "json":
        return CompletionRequest.model_validate_json(json.dumps(data))
    return CompletionRequest.model_validate(data)


def make(mode: str = "python", **fields: Any) -> CompletionRequest:
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


def rule_error(mode: str = "python", **fields: Any) -> FieldRuleError:
    """The single cross-field rule a request breaks (model-level, so its loc is empty)."""
    with pytest.raises(ValidationError) as info:
        make(mode, **fields)
    [err] = info.value.errors()
    assert err["loc"] == ()
    rule = err["ctx"]["error"]
    assert isinstance(rule, FieldRuleError)
    return rule


# --- per-field table ------------------------------------------------------------------


def test_table_covers_every_field() -> None:
    fields = set(CompletionRequest.model_fields) - {"prompt"}  # prompt has its own tables below
    valid = {f for f, _, ok in CASES if ok}
    invalid = {f for f, _, ok in CASES if not ok}
    assert fields - valid == set()
    assert fields - invalid == set()
    assert {f for f, _, _ in CASES} <= fields


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("field", "value", "ok"), CASES, ids=[f"{f}={v!r}" for f, v, _ in CASES])
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
@pytest.mark.parametrize("field", sorted(set(CompletionRequest.model_fields) - {"model", "prompt"}))
def test_every_optional_field_accepts_null(field: str, mode: str) -> None:
    request = make(mode, **{field: None})
    assert getattr(request, field) is None
    assert field not in request.upstream_fields()


# --- prompt forms -----------------------------------------------------------------------

VALID_PROMPTS = [
    ("text", "Once upon a time", 1),
    ("text-batch", ["a", "b", "c"], 3),
    ("single-text-batch", ["a"], 1),
    ("tokens", [1, 2, 3], 1),
    ("token-zero", [0], 1),
    ("token-batch", [[1, 2], [3]], 2),
    ("single-token-batch", [[50256]], 1),
]

INVALID_PROMPTS = [
    ("empty-list", []),
    ("empty-token-list", [[]]),
    ("one-empty-token-list", [[1], []]),
    ("negative-token", [-1]),
    ("negative-token-in-batch", [[1, -2]]),
    ("mixed-str-int", ["a", 1]),
    ("mixed-int-str", [1, "a"]),
    ("mixed-list-int", [[1], 2]),
    ("float-token", [1.0]),
    ("bool-token", [True]),
    ("text-batch-nested", [["a"]]),
    ("int", 5),
    ("object", {"text": "a"}),
    ("null-item", ["a", None]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("prompt", "count"), [p[1:] for p in VALID_PROMPTS], ids=[p[0] for p in VALID_PROMPTS])
def test_prompt_forms(prompt: Any, count: int, mode: str) -> None:
    request = make(mode, prompt=prompt)
    assert request.prompt == prompt
    assert request.prompt_count == count
    assert request.upstream_fields()["prompt"] == prompt


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prompt", [p[1] for p in INVALID_PROMPTS], ids=[p[0] for p in INVALID_PROMPTS])
def test_invalid_prompts(prompt: Any, mode: str) -> None:
    found = refuse(mode, prompt=prompt)
    assert found and all(loc[0] == "prompt" and param == "prompt" for loc, param in found), found


def test_required_fields() -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x"})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [(("model",), "missing")]
    # prompt is required unless prompt_embeds stands in for it: a rule naming it, with OpenAI's message.
    with pytest.raises(ValidationError) as missing:
        CompletionRequest.model_validate({"model": "m"})
    [err] = missing.value.errors()
    assert err["ctx"]["error"].param == "prompt" and "Missing required parameter: 'prompt'" in err["msg"]


# --- unknown fields ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name", ["foo", "Temperature", "messages", "max_completion_tokens", "return_token_offsets", "mm_payload"]
)
def test_unknown_field_refused_by_name(name: str, mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, **{name: 1})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [((name,), "extra_forbidden")]


@pytest.mark.parametrize("mode", MODES)
def test_unknown_stream_options_key_refused(mode: str) -> None:
    with pytest.raises(ValidationError) as info:
        make(mode, stream=True, stream_options={"include_usage": True, "include_obfuscation": True})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [
        (("stream_options", "include_obfuscation"), "extra_forbidden")
    ]


# --- cross-field rules ---------------------------------------------------------------------

# (fields, the param the rule must name)
RULE_BREAKS: list[tuple[dict[str, Any], str]] = [
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"best_of": 3, "n": 4}, "best_of"),
    ({"best_of": 0}, "best_of"),
    ({"best_of": 2, "stream": True}, "best_of"),
    ({"best_of": 3, "n": 2, "stream": True}, "best_of"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream_options": {}, "stream": False}, "stream_options"),
    ({"stream_options": {"include_usage": True}, "stream": None}, "stream_options"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"min_tokens": 1, "max_tokens": 0}, "min_tokens"),
    ({"min_tokens": DEFAULT_MAX_TOKENS + 1}, "min_tokens"),
    ({"min_tokens": DEFAULT_MAX_TOKENS + 1, "max_tokens": None}, "min_tokens"),
    # More than one guided_* constraint: the rule names the second one (order json, regex, choice, grammar).
    ({"guided_json": {"type": "object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_json": "{}", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a+", "guided_grammar": "root ::= x"}, "guided_grammar"),
    ({"guided_choice": ["a"], "guided_grammar": "root ::= x"}, "guided_grammar"),
    (
        {"guided_json": {}, "guided_regex": "a", "guided_choice": ["a"], "guided_grammar": "root ::= x"},
        "guided_regex",
    ),
    ({"guided_whitespace_pattern": r"\s*"}, "guided_whitespace_pattern"),
    ({"guided_whitespace_pattern": r"\s*", "guided_regex": "a+"}, "guided_whitespace_pattern"),
    ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ({"use_beam_search": True, "stream": True}, "use_beam_search"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    # response_format is one more output constraint (a structured_outputs with options only is not one).
    ({"response_format": {"type": "json_object"}, "guided_json": {}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format"),
    # prompt_embeds: vLLM refuses echo, suffix and prompt_logprobs with them.
    ({"prompt_embeds": "UEsDBA==", "echo": True}, "echo"),
    ({"prompt_embeds": "UEsDBA==", "suffix": "x"}, "suffix"),
    ({"prompt_embeds": "UEsDBA==", "prompt_logprobs": 0}, "prompt_logprobs"),
]

RULE_KEEPS: list[dict[str, Any]] = [
    {"best_of": 1},
    {"best_of": 2, "n": 2},
    {"best_of": 5, "n": 2},
    {"best_of": 20, "n": 20},
    {"best_of": 1, "stream": True},
    {"best_of": 3, "n": 3, "stream": True},
    {"best_of": 3, "n": 2, "stream": False},
    {"stream_options": {"include_usage": True}, "stream": True},
    {"stream": False, "stream_options": None},
    {"min_tokens": 4, "max_tokens": 4},
    {"min_tokens": 0, "max_tokens": 0},
    {"min_tokens": 100, "max_tokens": 200},
    {"min_tokens": DEFAULT_MAX_TOKENS},
    {"guided_json": {"type": "object"}, "guided_whitespace_pattern": r"[ ]?", "guided_decoding_backend": "outlines"},
    {"guided_choice": ["a", "b"], "guided_decoding_backend": "xgrammar"},
    {"guided_grammar": "root ::= x", "guided_json": None},
    {"use_beam_search": True, "stream": False},
    {"use_beam_search": False, "stream": True},
    {"use_beam_search": True, "n": 4},
    {"response_format": {"type": "text"}, "guided_regex": "a"},
    {"response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": True}},
    {"prompt_embeds": "UEsDBA==", "echo": False, "suffix": None},
    {"prompt_embeds": ["UEsDBA=="], "prompt": ["a", "b"]},
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fields", "param"), RULE_BREAKS, ids=[f"{p}:{sorted(f)}" for f, p in RULE_BREAKS])
def test_cross_field_rule_names_param(fields: dict[str, Any], param: str, mode: str) -> None:
    rule = rule_error(mode, **fields)
    assert rule.param == param
    assert param in rule.message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fields", RULE_KEEPS, ids=[str(sorted(f)) for f in RULE_KEEPS])
def test_cross_field_rule_allows(fields: dict[str, Any], mode: str) -> None:
    make(mode, **fields)


# --- helpers --------------------------------------------------------------------------------


def test_upstream_fields_keeps_only_set_non_null_values() -> None:
    request = make(
        temperature=None,
        top_k=None,
        stop=None,
        n=1,
        echo=False,
        max_tokens=0,
        logprobs=0,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": None},
    )
    assert request.upstream_fields() == {
        **BASE,
        "n": 1,
        "echo": False,
        "max_tokens": 0,
        "logprobs": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_upstream_fields_minimal_request_and_json_round_trip() -> None:
    assert make().upstream_fields() == BASE
    request = make(prompt=[[1, 2], [3]], logit_bias={"50256": -100}, guided_json={"type": "object"}, seed=INT64_MAX)
    fields = request.upstream_fields()
    assert json.loads(json.dumps(fields)) == fields
    assert fields["prompt"] == [[1, 2], [3]]
    assert fields["seed"] == INT64_MAX


@pytest.mark.parametrize(("n", "expected"), [(None, 1), (1, 1), (4, 4), (128, 128)])
def test_effective_n(n: int | None, expected: int) -> None:
    assert make(n=n).effective_n == expected


def test_request_is_frozen() -> None:
    request = make()
    with pytest.raises(ValidationError):
        request.temperature = 0.5  # type: ignore[misc]


# --- issue 13: bounds, null prompt, early_stopping, current vLLM fields ---------------------


@pytest.mark.parametrize("mode", MODES)
def test_null_prompt_is_the_start_of_a_document(mode: str) -> None:
    # OpenAI: prompt is required and nullable; null means the default, not an invalid value.
    request = make(mode, prompt=None)
    assert request.prompt == ""
    assert request.upstream_fields()["prompt"] == ""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 2**64),
        ("prompt", [2**64]),
        ("prompt", [[1, 2**64]]),
        ("top_k", 2**70),
        ("min_tokens", 2**64),
        ("stop_token_ids", [2**64]),
        ("guided_json", {"properties": {"n": {"maximum": 2**64}}}),
        ("structured_outputs", {"json": {"maximum": 2**64}}),
        ("logit_bias", {str(2**64): 1}),
    ],
)
def test_huge_integers_are_refused_by_name(field: str, value: Any, mode: str) -> None:
    found = refuse(mode, **{field: value})
    assert found and all(param == field for _, param in found), found


def test_every_accepted_request_reserialises() -> None:
    # The class behind the 500s: whatever validates must also go out through orjson.
    for field, value, ok in CASES:
        if ok:
            request = make("json", **{**CONTEXT.get(field, {}), field: value})
            orjson.dumps(request.upstream_fields())


def test_structured_outputs_and_guided_are_one_constraint() -> None:
    rule = rule_error(structured_outputs={"regex": "a"}, guided_regex="b")
    assert rule.param == "structured_outputs"


def test_prompt_logprobs_not_with_stream() -> None:
    assert rule_error(prompt_logprobs=1, stream=True).param == "prompt_logprobs"


def test_structured_outputs_json_keeps_its_wire_name() -> None:
    request = make("json", structured_outputs={"json": {"type": "object"}, "disable_fallback": True})
    assert request.upstream_fields()["structured_outputs"] == {"json": {"type": "object"}, "disable_fallback": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "prompt": "x", "max_tokens": 18446744073709551616}', "max_tokens"),
        (b'{"model": "m", "prompt": [18446744073709551616]}', "prompt"),
        (b'{"model": "m", "prompt": "x", "guided_json": {"maximum": 18446744073709551616}}', "guided_json"),
    ],
)
def test_huge_integers_are_a_400_naming_the_field_at_the_door(body: bytes, param: str) -> None:
    from gateway.http.validation import parse_completion_request
    from schemas.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as caught:
        parse_completion_request(body)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize("mode", MODES)
def test_prompt_may_be_left_out_only_next_to_prompt_embeds(mode: str) -> None:
    """vLLM: prompt or prompt_embeds; an empty prompt next to embeddings is no prompt of its own."""
    alone = _validate({"model": "m", "prompt_embeds": ["UEsDBA==", "gAJ9cQAu"]}, mode)
    assert "prompt" not in alone.upstream_fields() and alone.prompt_count == 2
    null = _validate({"model": "m", "prompt": None, "prompt_embeds": "UEsDBA=="}, mode)
    assert "prompt" not in null.upstream_fields() and null.prompt_count == 1
    both = _validate({"model": "m", "prompt": ["a", "b"], "prompt_embeds": "UEsDBA=="}, mode)
    assert both.upstream_fields()["prompt"] == ["a", "b"] and both.prompt_count == 3
    with pytest.raises(ValidationError) as info:
        _validate({"model": "m"}, mode)
    assert refusals(info.value) == [((), "prompt")]


def test_prompt_embeds_estimate_grows_with_the_tensor() -> None:
    small, large = make(prompt_embeds="A" * 8), make(prompt_embeds=["A" * 8192, "A" * 8192])
    assert small.prompt_estimate() < large.prompt_estimate()
    assert large.prompt_estimate() >= 2 * 8192 // 4 * 3 // 4096


# Requests that break two rules: the earlier rule (in check_rules' order) is the error.
RULE_ORDER = [
    ({"logit_bias": {"x": 1}, "best_of": 1, "n": 2}, "logit_bias"),
    ({"best_of": 1, "n": 2, "stream_options": {"include_usage": True}}, "best_of"),
    ({"stream_options": {}, "min_tokens": 5, "max_tokens": 4}, "stream_options"),
    ({"min_tokens": 5, "max_tokens": 4, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "min_tokens"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "b", "prompt_logprobs": 1, "stream": True},
     "structured_outputs"),
    ({"prompt_logprobs": 1, "stream": True, "guided_regex": "a", "guided_grammar": "b"}, "prompt_logprobs"),
    ({"guided_regex": "a", "guided_grammar": "b", "use_beam_search": True, "stream": True}, "guided_grammar"),
]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fields", "param"), RULE_ORDER, ids=[p for _, p in RULE_ORDER])
def test_first_rule_broken_is_the_error(fields: dict[str, Any], param: str, mode: str) -> None:
    assert rule_error(mode, **fields).param == param


def test_plain_request_runs_no_cross_field_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that sets no field a rule reads past its default pays for no rule (issue 12)."""
    import schemas.completions as completions_module

    ran: list[str] = []
    rules = tuple((fields, lambda _r, f=fields: ran.append(min(f))) for fields, _ in completions_module._RULES)
    monkeypatch.setattr(completions_module, "_RULES", FieldRules(*rules))
    make(max_tokens=16, temperature=0.5, top_p=1.0, n=2, stream=True, seed=1, stop="x", user="u", echo=False)
    assert ran == []
    make(best_of=2, guided_decoding_backend="x")
    assert ran == ["best_of", "guided_choice"]

"""The rules both request schemas share (schemas.common) refuse the same input the same way.

Chat used to accept what completions refused: a JSON schema (guided_json, structured_outputs.json,
tools' parameters, response_format's schema, chat_template_kwargs) holding an integer orjson cannot
write failed later, on its way upstream; a logit_bias key past int64 broke llama.cpp's integer form.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest

COMPLETION: dict[str, Any] = {"model": "m", "prompt": "hi"}
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HUGE = {"type": "object", "properties": {"n": {"maximum": 2**64}}}


def _refusal(model: type[BaseModel], body: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    error = info.value.errors()[0]
    return ".".join(str(p) for p in error["loc"] if not isinstance(p, int)), error["msg"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {str(2**64): 1}}, "logit_bias"),
        ({"logit_bias": {"²": 1}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"guided_json": {"a": 1}, "guided_regex": "x"}, "guided_regex"),
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ],
)
def test_same_rule_same_refusal_on_both_endpoints(fields: dict[str, Any], param: str) -> None:
    completion = _refusal(CompletionRequest, {**COMPLETION, **fields})
    chat = _refusal(ChatCompletionRequest, {**CHAT, **fields})
    assert completion == chat
    assert param in completion[1] or completion[0] == param


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_json": HUGE},
        {"structured_outputs": {"json": HUGE}},
        {"chat_template_kwargs": {"seed": 10**30}},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": HUGE}}]},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": HUGE}}},
        {"guided_json": {"x": float("nan")}},
    ],
)
def test_chat_refuses_json_an_upstream_cannot_be_sent(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({**CHAT, **fields})
    assert next(iter(fields)) == info.value.errors()[0]["loc"][0]


def test_chat_accepts_json_at_the_serialisable_edge() -> None:
    edge = {"maximum": 2**64 - 1, "minimum": -(2**63)}
    request = ChatCompletionRequest.model_validate({**CHAT, "guided_json": edge, "logit_bias": {str(2**63 - 1): 1}})
    assert request.upstream_fields()["guided_json"] == edge

"""vLLM 0.32's completions ``response_format`` and ``prompt_embeds`` through the gateway, against the
real server: the format constrains the text, and ``prompt_embeds`` reaches vLLM (the shared server
runs without ``--enable-prompt-embeds``, so vLLM's own 400 names the field back to the client).
"""

from __future__ import annotations

import json

import pytest

from tests.backends.vllm.real.conftest import Gateway
from tests.backends.vllm.real.test_real_vllm import JSON_SCHEMA

pytestmark = pytest.mark.vllm


async def test_json_schema_response_format_constrains_the_completion(gw: Gateway) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": JSON_SCHEMA}}
    status, body = await gw.post({"prompt": "JSON:", "max_tokens": 60, "temperature": 0, "response_format": fmt})
    assert status == 200, body
    value = json.loads(body["choices"][0]["text"])
    assert value["answer"] in ("yes", "no") and isinstance(value["score"], int) and 0 <= value["score"] <= 9
    assert gw.recorder.last.request["response_format"] == fmt  # 0.32 applies it as sent


async def test_json_object_response_format_gives_an_object(gw: Gateway) -> None:
    fmt = {"type": "json_object"}
    status, body = await gw.post({"prompt": "{", "max_tokens": 40, "temperature": 0, "response_format": fmt})
    assert status == 200, body
    choice = body["choices"][0]
    if choice["finish_reason"] == "stop":  # a random model may run out of tokens inside the object
        assert isinstance(json.loads(choice["text"]), dict)
    else:
        assert choice["text"].lstrip().startswith("{")


async def test_prompt_embeds_reach_vllm_which_names_them_in_its_refusal(gw: Gateway) -> None:
    status, body = await gw.post({"prompt": None, "prompt_embeds": "UEsDBA==", "max_tokens": 4})
    assert status == 400, body
    assert body["error"]["param"] == "prompt_embeds" and "enable-prompt-embeds" in body["error"]["message"]
    sent = gw.recorder.last.request
    assert sent["prompt_embeds"] == "UEsDBA==" and "prompt" not in sent

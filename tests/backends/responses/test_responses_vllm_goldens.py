"""Responses goldens recorded against a real vLLM 0.32 (tests/backends/vllm/real/test_real_vllm_responses.py
with GATEWAY_RECORD_GOLDEN=1), replayed without a server: the client's request still becomes exactly the
chat request vLLM got, and the recorded answers keep the shapes the gateway promises (each golden also
holds vLLM's own /v1/responses answer to the same request, the record of why it is not used)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from backends.base import ResponsesCall
from backends.responses.bridge import chat_call_of
from backends.vllm.adapter import VLLMBackend
from schemas.config import VLLMBackendConfig
from schemas.responses import ResponsesRequest

GOLDENS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "responses").glob("vllm-*/*.json"))


def load(path: Path) -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(path.read_text())
    return golden


def backend(version: str) -> VLLMBackend:
    config = VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "v", "base_url": "http://127.0.0.1:9/v1", "version": version, "tool_parser": "hermes"}
    )
    return VLLMBackend(config)


def test_there_are_goldens() -> None:
    assert {p.stem for p in GOLDENS} >= {"plain", "streamed", "json-schema"}


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_request_becomes_the_chat_request_vllm_got(path: Path) -> None:
    golden = load(path)
    request = ResponsesRequest.model_validate(golden["client"])
    call = ResponsesCall(request, golden["upstream_chat_request"]["model"], request.model, "req-golden")
    chat_call, _ = chat_call_of(call)
    fields, _copies = backend(golden["version"])._chat_fields(chat_call)
    assert orjson.loads(orjson.dumps(fields)) == golden["upstream_chat_request"]


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_recorded_answer_has_openais_shape(path: Path) -> None:
    golden = load(path)
    answer = golden["gateway"]
    if golden["client"].get("stream"):
        assert [e["sequence_number"] for e in answer] == list(range(len(answer)))
        answer = answer[-1]["response"]
    assert answer["object"] == "response" and answer["model"] == golden["client"]["model"]
    assert answer["id"].startswith("resp_")
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    if answer["status"] == "incomplete":  # cut by max_output_tokens: the item says so too (vLLM's own says completed)
        assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
        assert all(item["status"] == "incomplete" for item in answer["output"] if item["type"] == "message")

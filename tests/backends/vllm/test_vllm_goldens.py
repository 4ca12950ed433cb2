"""Golden vLLM payloads replayed through ``VLLMBackend`` without a server (respx).

``tests/fixtures/vllm/<version>/<name>.json`` hold: the client's body, the body the
gateway must send to that version (``request``), and the version's answer
(``response`` or SSE ``events``). 0.32.0 was recorded from a real vLLM by
``tests/backends/vllm/real`` (``GATEWAY_RECORD_GOLDEN=1``); 0.6.3, 0.10.1, 0.11.0 and 0.33.0 are
written from the spec's documented shapes (see each file's ``note``).

Each file proves, for its version: the field goes upstream in that version's
form, and the answer reaches the client in OpenAI's shape (or as our error).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import UpstreamCall
from backends.errors import UpstreamError, UpstreamStatusError
from backends.vllm.adapter import VLLMBackend
from backends.vllm.dialect import UpstreamGenerationError, asked_choice_fields
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vllm"
GOLDENS = sorted(FIXTURES.glob("*/*.json"))
URL = "http://vllm.golden:8000/v1"
PUBLIC = "public-name"
OPENAI_CHOICE = {"text", "index", "logprobs", "finish_reason"}
OPENAI_TOP = {"id", "object", "created", "model", "choices", "system_fingerprint", "usage"}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def golden_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def backend_for(version: str) -> VLLMBackend:
    config = VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "golden", "base_url": URL, "transport": "httpx", "version": version}
    )
    return VLLMBackend(config)


def call_for(golden: dict[str, Any]) -> UpstreamCall:
    request = CompletionRequest.model_validate(golden["client"])
    return UpstreamCall(request, golden["request"]["model"], PUBLIC, "req-golden")


def upstream_answer(golden: dict[str, Any]) -> httpx.Response:
    if "events" in golden:
        body = "".join(event + "\n\n" for event in golden["events"]).encode()
        return httpx.Response(golden["status"], content=body, headers={"Content-Type": "text/event-stream"})
    return httpx.Response(golden["status"], content=orjson.dumps(golden["response"]))


def mean(values: list[Any]) -> float:
    nums = [v for v in values if v is not None]
    return sum(nums) / len(nums) if nums else -math.inf


def test_goldens_exist_for_old_and_new_versions() -> None:
    versions = {path.parent.name for path in GOLDENS}
    assert {"0.6.3", "0.10.1", "0.11.0", "0.32.0", "0.33.0"} <= versions


@pytest.mark.parametrize("path", GOLDENS, ids=golden_id)
async def test_golden(path: Path, mock: respx.MockRouter) -> None:
    golden = load(path)
    backend = backend_for(golden["version"])
    route = mock.post(URL + "/completions").mock(return_value=upstream_answer(golden))
    mock.get("http://vllm.golden:8000/version").mock(
        return_value=httpx.Response(200, json={"version": golden["version"]})
    )
    call = call_for(golden)
    try:
        if call.request.stream:
            await check_stream(backend, call, golden)
        else:
            await check_complete(backend, call, golden)
    finally:
        await backend.close()
    sent = [orjson.loads(c.request.content) for c in route.calls]
    assert sent, "nothing was sent upstream"
    assert sent[0] == golden["request"]  # the version's own form of every field


async def check_complete(backend: VLLMBackend, call: UpstreamCall, golden: dict[str, Any]) -> None:
    upstream = golden.get("response") or {}
    choices = upstream.get("choices") or []
    if golden["status"] != 200:
        with pytest.raises(UpstreamStatusError) as info:
            await backend.complete(call)
        check_error(info.value, golden)
        return
    if any(c.get("finish_reason") in ("abort", "error") for c in choices):
        with pytest.raises(UpstreamGenerationError) as gen:
            await backend.complete(call)
        assert gen.value.status == 502 and gen.value.retryable == (choices[0]["finish_reason"] == "abort")
        return
    result = await backend.complete(call)
    body = orjson.loads(result.body)
    assert set(body) <= OPENAI_TOP and body["model"] == PUBLIC and body["object"] == "text_completion"
    asked = set(asked_choice_fields(call.request)[1])  # vLLM's per-choice extras kept only when asked for
    for i, choice in enumerate(body["choices"]):
        assert set(choice) == OPENAI_CHOICE | asked
        for name in asked:
            assert choice[name] == choices[i][name]
        assert choice["finish_reason"] in ("stop", "length", "content_filter")
    request = call.request
    n = request.n or 1
    sent_n = golden["request"].get("n", 1)
    if request.best_of and request.best_of > n and sent_n == request.best_of:  # emulated best_of
        skip = upstream["usage"]["prompt_tokens"] if request.echo else 0
        ranked = sorted(choices, key=lambda c: mean(c["logprobs"]["token_logprobs"][skip:]), reverse=True)
        assert [c["text"] for c in body["choices"]] == [c["text"] for c in ranked[:n]]
        assert [c["index"] for c in body["choices"]] == list(range(n))
        if request.logprobs is None:
            assert all(c["logprobs"] is None for c in body["choices"])
        assert body["usage"]["completion_tokens"] == upstream["usage"]["completion_tokens"]
    elif n > 1 and sent_n == 1:  # emulated greedy n
        assert [c["text"] for c in body["choices"]] == [choices[0]["text"]] * n
        assert body["usage"]["completion_tokens"] == n * upstream["usage"]["completion_tokens"]
    else:
        assert [c["text"] for c in body["choices"]] == [c["text"] for c in choices]
        assert body["usage"] == upstream["usage"]
    if "repetition" in {c.get("finish_reason") for c in choices}:
        assert body["choices"][0]["finish_reason"] == "stop"
    assert result.usage is not None and result.usage.completion_tokens == body["usage"]["completion_tokens"]


def check_error(error: UpstreamStatusError, golden: dict[str, Any]) -> None:
    upstream = golden["response"]
    envelope = error.envelope()["error"]
    if golden["status"] in (400, 422):
        assert error.status == 400 and envelope["type"] == "invalid_request_error"
        assert envelope["code"] is None
        inner = upstream.get("error", upstream)
        assert envelope["message"] == inner["message"]  # passed on, whatever the shape
        expected_param = inner.get("param")
        if expected_param == "structured_outputs":  # named as the client wrote it
            expected_param = next((k for k in golden["client"] if k.startswith("guided_")), expected_param)
        assert envelope["param"] == expected_param
    elif golden["status"] == 401:
        assert error.status == 502 and envelope["code"] == "upstream_auth_failed"
    elif golden["status"] == 404:
        assert error.status == 502 and envelope["code"] == "upstream_model_not_found"


async def check_stream(backend: VLLMBackend, call: UpstreamCall, golden: dict[str, Any]) -> None:
    stream = await backend.stream(call)
    got: list[bytes] = []
    failed: UpstreamError | None = None
    try:
        async for block in stream:
            got.append(block)
    except UpstreamError as exc:
        failed = exc
    finally:
        await stream.aclose()
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in b"".join(got).split(b"\n\n") if e.strip()]
    upstream_events = [
        orjson.loads(e.removeprefix("data:").strip()) for e in golden["events"] if e.strip() != "data: [DONE]"
    ]
    finishes = {c.get("finish_reason") for e in upstream_events for c in e.get("choices", [])}
    assert all(e["model"] == PUBLIC for e in events)
    for event in events:
        for choice in event["choices"]:
            assert choice["finish_reason"] in (None, "stop", "length", "content_filter")
    if finishes & {"abort", "error"}:
        assert isinstance(failed, UpstreamGenerationError)  # an error event, never a clean end
        return
    assert failed is None
    n = call.request.n or 1
    texts = [""] * (n * call.request.prompt_count)
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    upstream_text = "".join(c["text"] for e in upstream_events for c in e.get("choices", []) if c["index"] == 0)
    assert texts[0] == upstream_text
    if golden["request"].get("n", 1) == 1 and n > 1:  # emulated greedy n
        assert texts == [upstream_text] * n

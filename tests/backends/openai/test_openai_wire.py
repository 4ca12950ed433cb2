"""``OpenAIWire``: the headers every OpenAI-speaking family sends, and a key that never shows."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import UpstreamCall
from backends.openai.wire import OpenAIWire
from backends.registry import build_backend
from backends.transport.base import UpstreamResponse
from schemas.completions import CompletionRequest
from schemas.config import OpenAIBackendConfig, VLLMBackendConfig

KEY = "sk-wire-secret-123"
BASE = "http://wire.test/v1"


def config(kind: str) -> OpenAIBackendConfig | VLLMBackendConfig:
    data: dict[str, Any] = {
        "type": kind, "name": "w", "base_url": BASE, "api_key": KEY, "transport": "httpx",
        "headers": {"X-Org": "acme"},
    }  # fmt: skip
    if kind == "vllm":
        data["version"] = "0.32.0"
        return VLLMBackendConfig.model_validate(data)
    return OpenAIBackendConfig.model_validate(data)


@pytest.mark.parametrize("kind", ["openai", "vllm"])
def test_the_key_never_shows_in_a_repr(kind: str) -> None:
    wire = OpenAIWire(config(kind), None)
    assert KEY not in repr(wire) and KEY not in repr(build_backend(config(kind)))


@pytest.mark.parametrize("kind", ["openai", "vllm"])
async def test_post_and_get_headers(kind: str) -> None:
    """A POST carries the entry's headers, the bearer key, JSON and the request id; a GET no content type."""
    wire = OpenAIWire(config(kind), None)
    call = UpstreamCall(CompletionRequest.model_validate({"model": "m", "prompt": "hi"}), "up", "m", "req-7")
    with respx.mock(assert_all_mocked=True) as router:
        post = router.post(BASE + "/completions").mock(return_value=httpx.Response(200, json={"ok": 1}))
        get = router.get("http://wire.test/health").mock(return_value=httpx.Response(200))
        body = await wire.post_read(wire.completions_url, wire.completion_fields(call, _table(kind)), call, _boom)
        assert orjson.loads(body) == {"ok": 1}
        assert await wire.healthy("http://wire.test/health")
    sent = post.calls.last.request
    assert sent.headers["authorization"] == f"Bearer {KEY}" and sent.headers["x-org"] == "acme"
    assert sent.headers["content-type"] == "application/json" and sent.headers["x-request-id"] == "req-7"
    assert orjson.loads(sent.content) == {"model": "up", "prompt": "hi"}
    probe = get.calls.last.request
    assert "content-type" not in probe.headers and probe.headers["authorization"] == f"Bearer {KEY}"
    await wire.close()


def _table(kind: str) -> Any:
    return build_backend(config(kind)).capabilities


def _boom(status: int, data: bytes, retry_after: str | None) -> Exception:
    raise AssertionError(f"unexpected status {status}")


async def test_a_non_200_goes_to_the_callers_status_error() -> None:
    wire = OpenAIWire(config("openai"), None)
    call = UpstreamCall(CompletionRequest.model_validate({"model": "m", "prompt": "hi"}), "up", "m", "r")
    seen: list[tuple[int, bytes]] = []

    class Refused(Exception):
        pass

    def status_error(status: int, data: bytes, retry_after: str | None) -> Exception:
        seen.append((status, data))
        return Refused()

    with respx.mock(assert_all_mocked=True) as router:
        router.post(BASE + "/chat/completions").mock(return_value=httpx.Response(429, content=b"slow down"))
        with pytest.raises(Refused):
            resp: UpstreamResponse = await wire.post(wire.chat_url, {"x": 1}, call, status_error, stream=True)
            resp.release()
    assert seen == [(429, b"slow down")]
    await wire.close()

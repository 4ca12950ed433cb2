"""vLLM 0.32's bound on ``cache_salt`` (at most 128 characters, none of '@', '/', '\\', NUL:
``validate_cache_salt`` in its request models) is the gateway's to refuse, naming the field,
on the versions that have it; older versions take what the schema takes (1..1024 characters)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from backends.vllm.capabilities import capabilities_for, vllm_chat_capabilities, vllm_pooling_tables
from backends.vllm.versions import VLLMChatFeatures, VLLMFeatures, VLLMVersion
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.embeddings import EmbeddingRequest
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

V32, V31 = VLLMVersion(0, 32, 0), VLLMVersion(0, 31, 0)

REFUSED_ON_032 = ["a" * 129, "tenant@acme", "a/b", "back\\slash", "nul\x00byte", "x" * 1024]
TAKEN_EVERYWHERE = [
    "a" * 128,
    "safe-cache_salt-123",
    "Z3V2bmV3aGxza3ZubGFoZ3Zud3V3ZWZ2bmd0b3V2bnZmc2xpZ3RoZ2x2aQ==",
    "é" * 128,
]


def _errors(version: VLLMVersion, salt: str) -> list[Any]:
    """The refusal of each endpoint's table of ``version`` for ``salt`` (None: forwarded)."""
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "cache_salt": salt})
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "cache_salt": salt}
    )
    embedding = EmbeddingRequest.model_validate({"model": "m", "input": "hi", "cache_salt": salt})
    return [
        capabilities_for(VLLMFeatures.of(version)).refusal(completion, "v", "vllm"),
        vllm_chat_capabilities(VLLMChatFeatures.of(version, "hermes")).refusal(chat, "v", "vllm"),
        vllm_pooling_tables(version)[0].refusal(embedding, "v", "vllm"),
    ]


@pytest.mark.parametrize("salt", REFUSED_ON_032)
def test_vllm_032_tables_refuse_what_vllm_032_refuses(salt: str) -> None:
    for error in _errors(V32, salt):
        assert error is not None
        assert error.param == "cache_salt"
        assert "at most 128 characters without '@', '/', '\\' or NUL" in error.message
        assert "vLLM 0.32.0" in error.message


@pytest.mark.parametrize("salt", TAKEN_EVERYWHERE)
def test_vllm_032_tables_take_a_salt_within_the_bound(salt: str) -> None:
    assert _errors(V32, salt) == [None, None, None]


@pytest.mark.parametrize("salt", REFUSED_ON_032)
def test_an_older_version_takes_what_the_schema_takes(salt: str) -> None:
    """0.31 has cache_salt in completions and chat without the bound (its pooling has none: refused
    as a field, not for the value)."""
    completion, chat, embedding = _errors(V31, salt)
    assert completion is None and chat is None
    assert embedding is not None and "first in 0.32.0" in embedding.message


BACKENDS = """  - name: vllm-032
    type: vllm
    base_url: {url}
    version: "0.32.0"
  - name: vllm-031
    type: vllm
    base_url: {url}
    version: "0.31.0"
"""
MODELS = """  - name: salted-032
    routes: [{backend: vllm-032, model: upstream-llama}]
  - name: salted-031
    routes: [{backend: vllm-031, model: upstream-llama}]
"""


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_the_gateway_answers_its_own_400_naming_cache_salt(
    make_gateway: MakeGateway, fake_upstream: FakeUpstream, path: str
) -> None:
    """Before, the salt reached vLLM 0.32, whose own 400 the client got; now the gateway's envelope
    names the field and nothing is sent. The same salt goes on to a 0.31 server."""
    gw = await make_gateway(extra_backends=BACKENDS.format(url=fake_upstream.url), extra_models=MODELS)
    prompt: dict[str, Any] = {"prompt": "hi"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "hi"}]
    }  # fmt: skip
    async with aiohttp.ClientSession() as session:
        body = {"model": "salted-032", "max_tokens": 2, "cache_salt": "tenant/7", **prompt}
        async with session.post(gw.url + path, json=body) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["param"] == "cache_salt" and error["type"] == "invalid_request_error"
        assert "128 characters" in error["message"]
        assert not gw.upstream.requests
        body["model"] = "salted-031"
        async with session.post(gw.url + path, json=body) as resp:
            assert resp.status == 200, await resp.text()
        assert [seen.body["cache_salt"] for seen in gw.upstream.requests] == ["tenant/7"]

"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` through the gateway.

On vLLM routes the request goes to the server's own endpoint with the route's model name, and its
answer comes back as written; both of vLLM's tokenize forms (a prompt, or chat messages with the
template's options). Every other backend type is refused by name (the 404 names the backend and its
type); keys, metrics (``endpoint``) and the audit line cover both endpoints, and nothing counts
against a key's tokens.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.pooling_gateway import EMBEDDERS, MakePooling, PoolingGateway
from tests.gateway.security.conftest import Lines, audit_lines
from tests.pooling_upstream import MAX_MODEL_LEN, word_id

__all__ = ["audit_lines"]  # the fixture

KEY = "sk-tokenize-test-key-0123456789abcdef"
AUTH = f"auth:\n  keys:\n    - {{name: team, key: {KEY}, tpm: 10, models: ['emb-vllm']}}\n"
HEADERS = {"Authorization": f"Bearer {KEY}"}


async def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession(headers=headers) as s, s.post(url + path, json=body) as r:
        return r.status, await r.json()


async def test_tokenize_a_prompt(pooling: PoolingGateway) -> None:
    body = {"model": "emb-vllm", "prompt": "hello big world", "add_special_tokens": False, "return_token_strs": True}
    status, answer = await post(pooling.url, "/tokenize", body)
    assert status == 200, answer
    words = ["hello", "big", "world"]
    expected = {"count": 3, "max_model_len": MAX_MODEL_LEN, "tokens": [word_id(w) for w in words], "token_strs": words}
    assert answer == expected
    sent = pooling.upstream.requests[-1]
    assert sent.path == "/tokenize"  # the server's root, not under /v1
    assert sent.body == {**body, "model": "up-vllm"}


async def test_tokenize_a_conversation(pooling: PoolingGateway) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": "emb-vllm", "messages": messages, "add_generation_prompt": True, "tools": tools,
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    status, answer = await post(pooling.url, "/tokenize", body)
    assert status == 200, answer
    assert answer["count"] == 4
    assert pooling.upstream.requests[-1].body == {**body, "model": "up-vllm"}


async def test_detokenize(pooling: PoolingGateway) -> None:
    status, answer = await post(pooling.url, "/detokenize", {"model": "emb-vllm", "tokens": [7, 8]})
    assert (status, answer) == (200, {"prompt": "t7 t8"})
    assert pooling.upstream.requests[-1].body == {"model": "up-vllm", "tokens": [7, 8]}


@pytest.mark.parametrize("kind", [k for k in EMBEDDERS if k != "vllm"])
@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_refused_by_name_elsewhere(pooling: PoolingGateway, kind: str, path: str) -> None:
    body = {"model": f"emb-{kind}", "prompt": "x"} if path == "/tokenize" else {"model": f"emb-{kind}", "tokens": [1]}
    status, answer = await post(pooling.url, path, body)
    assert status == 404, answer
    error = answer["error"]
    assert error["param"] == "model" and error["code"] == "model_not_supported_on_endpoint"
    assert f"'b-{kind}' (type {kind})" in error["message"] and path in error["message"]
    assert pooling.upstream.requests == []


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "messages"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "nonsense": 1}, "nonsense"),
        ("/tokenize", {"messages": [{"role": "user", "content": "b", "x": 1}]}, "messages[0].x"),
        ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "continue_final_message": True},
         "continue_final_message"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ],
)  # fmt: skip
async def test_bad_requests_named(pooling: PoolingGateway, path: str, body: dict[str, Any], param: str) -> None:
    status, answer = await post(pooling.url, path, {"model": "emb-vllm", **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert pooling.upstream.requests == []


async def test_keys_metrics_and_audit(make_pooling: MakePooling, audit_lines: Lines) -> None:
    gateway = await make_pooling(auth=AUTH, server="audit_log: true")
    for _ in range(3):  # a tpm of 10 is no limit here: tokenizing reserves no tokens
        status, _ = await post(gateway.url, "/tokenize", {"model": "emb-vllm", "prompt": "a " * 50}, HEADERS)
        assert status == 200
    assert (await post(gateway.url, "/detokenize", {"model": "emb-vllm", "tokens": [1]}, HEADERS))[0] == 200
    assert (await post(gateway.url, "/tokenize", {"model": "emb-tei", "prompt": "a"}, HEADERS))[0] == 403
    assert (await post(gateway.url, "/tokenize", {"model": "emb-vllm", "prompt": "a"}))[0] == 401
    async with aiohttp.ClientSession() as s, s.get(gateway.url + "/metrics") as r:
        text = await r.text()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())

    ok = {"model": "emb-vllm", "backend": "b-vllm", "status": "200"}
    assert value("gateway_requests_total", **ok, endpoint="tokenize") == 3
    assert value("gateway_requests_total", **ok, endpoint="detokenize") == 1
    assert value("gateway_key_tokens_total", key="team") == 0
    assert [a["endpoint"] for a in audit_lines.records if a["status"] == 200] == ["tokenize"] * 3 + ["detokenize"]

"""Spend per key in ``/metrics`` and in the audit lines is usage x price, exactly, over many requests.

Every endpoint (completions, chat, responses, embeddings, rerank), streams with and without the
client's ``include_usage``, cached prompt tokens at the cached rate (chat's ``prompt_tokens_details``
and a Response's ``input_tokens_details``), a route that overrides its model's price after a
failover, and the gateway's own estimate for a stream cut before its usage (``source="estimate"``).
The expected figures are computed here in ``Decimal`` from the usage the client was shown (or the
fake upstream's known usage where the client asked for none) and the YAML's prices.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.configfile import load_config
from gateway.reload import enable_reload
from schemas.completions import CompletionRequest
from tests.conftest import eventually, gateway_config_text, serve_app
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import AUTH_A, AUTH_B, KEY_A, KEY_B, Lines, MakeSecureGateway, auth_section

D = Decimal
# (input, output, cached input) per million tokens, as the YAML below says
PRICES = {
    ("priced", "up-openai"): (D("0.15"), D("0.6"), D("0.075")),
    ("priced-failover", "up-openai"): (D("2.5"), D("10"), D("1.25")),  # the route's own price
    ("mock-priced", "sim"): (D("0.000001"), D("0.000003"), D("0.000001")),
}
MODELS = """  - name: priced
    pricing: {input: 0.15, output: 0.6, cached_input: 0.075}
    routes: [{backend: up-openai, model: upstream-gpt}]
  - name: priced-failover
    pricing: {input: 1.25, output: 10}
    routes:
      - {backend: up-vllm, model: upstream-llama}
      - {backend: up-openai, model: upstream-gpt, pricing: {input: 2.5, output: 10, cached_input: "1.25"}}
  - name: mock-priced
    pricing: {input: "0.000001", output: "0.000003"}
    endpoints: [completions, chat, embeddings, rerank]
    routes: [{backend: sim, model: mock-model}]
"""
# team-b may use mock-* only; team-a everything
AUTH = auth_section(b="models: ['mock-*']")


def cost(model: str, backend: str, prompt: int, completion: int, cached: int = 0) -> Decimal:
    i, o, c = PRICES[(model, backend)]
    return ((prompt - cached) * i + cached * c + completion * o) / 10**6


def sse_usage(raw: bytes) -> dict[str, Any] | None:
    """The usage a stream showed the client (chat/completions' usage chunk, a Response's completed event)."""
    found = None
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        event = orjson.loads(line[6:])
        if event.get("usage"):
            found = event["usage"]
        if event.get("type") == "response.completed":
            found = event["response"]["usage"]
    return found


async def test_spend_is_usage_times_price_exactly(secure_gateway: MakeSecureGateway, audit_lines: Lines) -> None:
    gw = await secure_gateway(AUTH, extra_models=MODELS, server="audit_log: true")
    rng = random.Random(23)
    expected: dict[tuple[str, str, str, str], Decimal] = defaultdict(Decimal)  # (model, backend, key, source)

    async with aiohttp.ClientSession() as session:

        async def call(path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
            async with session.post(gw.url + path, json=body, headers=headers) as resp:
                return resp.status, await resp.read()

        def charge(model: str, backend: str, key: str, prompt: int, completion: int, cached: int = 0) -> None:
            expected[(model, backend, key, "upstream")] += cost(model, backend, prompt, completion, cached)

        # completions and chat, non-streamed: the usage in the answer
        for i in range(30):
            n = rng.randint(1, 3)
            if i % 2:
                body: dict[str, Any] = {"model": "priced", "prompt": "hello", "max_tokens": 4, "n": n}
                path = "/v1/completions"
            else:
                body = {"model": "priced", "messages": [{"role": "user", "content": "hi"}], "n": n}
                path = "/v1/chat/completions"
            status, raw = await call(path, body, AUTH_A)
            assert status == 200, raw
            usage = orjson.loads(raw)["usage"]
            charge("priced", "up-openai", "team-a", usage["prompt_tokens"], usage["completion_tokens"])

        # streams: with the client's include_usage (its usage chunk), and without (the gateway asks anyway)
        for i in range(12):
            tokens = rng.randint(1, 40)
            body = {"model": "priced", "prompt": "hello", "max_tokens": tokens, "stream": True}
            if i % 2:
                body["stream_options"] = {"include_usage": True}
            status, raw = await call("/v1/completions", body, AUTH_A)
            assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
            shown = sse_usage(raw)
            assert (shown is not None) == bool(i % 2)
            charge("priced", "up-openai", "team-a", 3, tokens)  # the fake's usage: 3 prompt tokens, one per event
            if shown is not None:
                assert (shown["prompt_tokens"], shown["completion_tokens"]) == (3, tokens)

        # cached prompt tokens, chat: 800 of 1000 at the cached rate
        answer = gw.upstream.completion({"messages": [], "model": "upstream-gpt"})
        answer["usage"] = {
            "prompt_tokens": 1000,
            "completion_tokens": 50,
            "total_tokens": 1050,
            "prompt_tokens_details": {"cached_tokens": 800},
        }
        gw.upstream.script.append(Behaviour(kind="status", status=200, body=answer))
        chat = {"model": "priced", "messages": [{"role": "user", "content": "hi"}]}
        assert (await call("/v1/chat/completions", chat, AUTH_A))[0] == 200
        charge("priced", "up-openai", "team-a", 1000, 50, cached=800)

        # cached input tokens, a Response (non-streamed): 30 of 100
        response = gw.upstream.response({"model": "upstream-gpt", "max_output_tokens": 5})
        response["usage"] = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 30},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 105,
        }
        gw.upstream.script.append(Behaviour(kind="status", status=200, body=response))
        status, raw = await call("/v1/responses", {"model": "priced", "input": "hi", "max_output_tokens": 5}, AUTH_A)
        assert status == 200, raw
        assert orjson.loads(raw)["usage"]["input_tokens_details"]["cached_tokens"] == 30
        charge("priced", "up-openai", "team-a", 100, 5, cached=30)

        # a streamed Response: the usage of its response.completed
        body = {"model": "priced", "input": "hi", "max_output_tokens": 7, "stream": True}
        status, raw = await call("/v1/responses", body, AUTH_A)
        assert status == 200
        shown = sse_usage(raw)
        assert shown is not None
        charge("priced", "up-openai", "team-a", shown["input_tokens"], shown["output_tokens"])

        # failover: the vLLM route fails, the OpenAI route answers at its own price
        gw.upstream.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "down"}}))
        status, raw = await call("/v1/completions", {"model": "priced-failover", "prompt": "x", "n": 2}, AUTH_A)
        assert status == 200, raw
        usage = orjson.loads(raw)["usage"]
        charge("priced-failover", "up-openai", "team-a", usage["prompt_tokens"], usage["completion_tokens"])

        # a stream cut before its usage: the gateway's estimate (prompt estimate + one token per relayed event)
        gw.upstream.script.append(Behaviour(kind="cut", events=3))
        cut = {"model": "priced", "prompt": "a prompt of some length", "max_tokens": 20, "stream": True}
        status, raw = await call("/v1/completions", cut, AUTH_A)
        assert status == 200 and b'"error"' in raw
        relayed = raw.count(b'"text_completion"')
        assert relayed == 3
        estimate = cost("priced", "up-openai", CompletionRequest.model_validate(cut).prompt_estimate(), relayed)
        expected[("priced", "up-openai", "team-a", "estimate")] += estimate

        # team-b on the mock: completions, chat, embeddings, rerank
        for i in range(10):
            body = {"model": "mock-priced", "prompt": "one two three " * (i + 1), "max_tokens": rng.randint(1, 9)}
            status, raw = await call("/v1/completions", body, AUTH_B)
            assert status == 200, raw
            usage = orjson.loads(raw)["usage"]
            charge("mock-priced", "sim", "team-b", usage["prompt_tokens"], usage["completion_tokens"])
        embed = {"model": "mock-priced", "input": ["alpha beta", "gamma delta epsilon"]}
        status, raw = await call("/v1/embeddings", embed, AUTH_B)
        assert status == 200, raw
        charge("mock-priced", "sim", "team-b", orjson.loads(raw)["usage"]["prompt_tokens"], 0)
        rerank = {"model": "mock-priced", "query": "which one", "documents": ["first doc", "the second doc"]}
        status, raw = await call("/v1/rerank", rerank, AUTH_B)
        assert status == 200, raw
        charge("mock-priced", "sim", "team-b", orjson.loads(raw)["usage"]["prompt_tokens"], 0)

        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()

    shown_cost = {
        (s.labels["model"], s.labels["backend"], s.labels["key"], s.labels["source"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gateway_cost_total"
    }
    assert set(shown_cost) == set(expected)
    for labels, exact in expected.items():
        assert shown_cost[labels] == float(exact), labels  # the float nearest the exact sum: no drift
    assert KEY_A not in text and KEY_B not in text

    # the audit lines: each request's cost, adding up exactly (as decimals) to the same totals
    by_key: dict[str, Decimal] = defaultdict(Decimal)
    for line in audit_lines.records:
        if line["cost"] is not None:
            by_key[line["key"]] += Decimal(repr(line["cost"]))
    for key in ("team-a", "team-b"):
        assert by_key[key] == sum((v for (_, _, k, _), v in expected.items() if k == key), Decimal())
    cached = [line for line in audit_lines.records if line["cached_tokens"]]
    assert [line["cached_tokens"] for line in cached] == [800, 30]


async def test_no_price_no_cost(secure_gateway: MakeSecureGateway, audit_lines: Lines) -> None:
    """A model without pricing costs nothing: no cost series, ``cost: null`` in the audit line."""
    gw = await secure_gateway(AUTH, server="audit_log: true")
    async with aiohttp.ClientSession() as session:
        body = {"model": "gpt-test", "prompt": "x", "max_tokens": 3}
        async with session.post(gw.url + "/v1/completions", json=body, headers=AUTH_A) as resp:
            assert resp.status == 200
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "gateway_cost_total"] == []
    assert [line["cost"] for line in audit_lines.records] == [None]


async def test_a_reload_with_new_prices_applies_to_new_requests(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    """A request routed before a reload is charged at the prices it was routed under; the next at the new."""
    path = tmp_path / "gateway.yaml"
    path.write_text(gateway_config_text(fake_upstream.url, extra_models=MODELS) + AUTH)
    app = create_app(load_config(path))
    reloader = enable_reload(app, path)
    runner, url = await serve_app(app)
    hold = Behaviour(kind="hold")
    fake_upstream.script.append(hold)
    body = {"model": "priced", "prompt": "x", "max_tokens": 2}
    try:
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(session.post(url + "/v1/completions", json=body, headers=AUTH_A))
            await eventually(lambda: len(fake_upstream.requests) == 1)  # routed, held by the upstream
            path.write_text(
                gateway_config_text(fake_upstream.url, extra_models=MODELS.replace("output: 0.6", "output: 6")) + AUTH
            )
            assert await reloader.reload()
            hold.release()
            resp = await pending
            assert resp.status == 200
            await resp.read()
            async with session.post(url + "/v1/completions", json=body, headers=AUTH_A) as resp:
                assert resp.status == 200
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
    finally:
        await runner.cleanup()
    value = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gateway_cost_total" and s.labels["key"] == "team-a"
    ]
    before = (3 * D("0.15") + 2 * D("0.6")) / 10**6  # the fake's usage: 3 prompt, 2 completion tokens
    after = (3 * D("0.15") + 2 * D("6")) / 10**6
    assert value == [float(before + after)]

"""``POST /v1/responses`` with the store: a streamed turn is stored before its last event reaches
the client, a conversation goes on after a failover to another backend type (the earlier turns
sent again, from the gateway's store), another key cannot continue a conversation, ``store:
false`` keeps nothing, and memory stores in several workers refuse by name what they would split.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.conversations import ConversationStore
from gateway.state import STATE
from gateway.store import MemoryStore
from tests.conftest import MOCK_MODEL, MakeGateway, RunningGateway, gateway_config_text, serve_app
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import KEY_A, KEY_B, MakeSecureGateway, auth_section


class SlowStore(MemoryStore):
    """A memory store whose writes take ``delay`` seconds, as a distant Redis might."""

    def __init__(self, delay: float) -> None:
        super().__init__("responses", ttl=60, max_items=100, max_bytes=1 << 20)
        self.delay = delay

    async def put(self, tenant: str, key: str, value: bytes) -> bool:
        await asyncio.sleep(self.delay)
        return await super().put(tenant, key, value)

    async def get(self, tenant: str, keys: Sequence[str], *, touch: bool = False) -> list[bytes | None]:
        return await super().get(tenant, keys, touch=touch)


async def test_a_streamed_turn_is_stored_before_its_last_event(gw_slow: RunningGateway) -> None:
    body = {"model": MOCK_MODEL, "input": "hi", "stream": True, "max_output_tokens": 8}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw_slow.url}/v1/responses", json=body) as resp:
            last = None
            async for line in resp.content:
                if line.startswith(b"data: ") and (b'"response.completed"' in line or b'"response.incomplete"' in line):
                    last = orjson.loads(line[6:])["response"]
                    break
            assert last is not None
            # The client acts the moment it has the event, on another connection (another worker, maybe).
            async with aiohttp.ClientSession() as other, other.get(f"{gw_slow.url}/v1/responses/{last['id']}") as got:
                assert got.status == 200, await got.text()
                assert (await got.json())["status"] == last["status"]


@pytest.fixture
async def gw_slow(fake_upstream: FakeUpstream) -> Any:
    app = create_app(parse_config(gateway_config_text(fake_upstream.url), "<test>", env={}))
    app[STATE].responses_state = ConversationStore(SlowStore(0.3))
    runner, url = await serve_app(app)
    try:
        yield RunningGateway(url, app, fake_upstream)
    finally:
        await runner.cleanup()


TWO_ROUTES = """  - name: two-types
    routes: [{backend: up-vllm, model: upstream-llama}, {backend: up-openai, model: upstream-gpt}]
"""


async def test_a_conversation_goes_on_after_a_failover_to_another_backend_type(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(extra_models=TWO_ROUTES)
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=20) as client:
        first = await client.responses.create(model="two-types", input="my name is Ada", max_output_tokens=8)
        assert gw.upstream.requests[-1].path.endswith("/chat/completions")  # vLLM served it
        gw.upstream.script.append(Behaviour(kind="status", status=503, body={"error": {"message": "down"}}))
        second = await client.responses.create(
            model="two-types", input="what is my name?", previous_response_id=first.id, max_output_tokens=8
        )
    sent = gw.upstream.requests[-1]
    assert sent.path.endswith("/responses")  # OpenAI's own endpoint took the second turn
    items = sent.body["input"]
    texts = [
        part["text"]
        for item in items
        for part in (item["content"] if isinstance(item["content"], list) else [{"text": item["content"]}])
    ]
    assert texts == ["my name is Ada", first.output_text, "what is my name?"]
    assert second.id != first.id


async def test_another_key_cannot_continue_a_conversation(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    async with (
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0) as a,
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_B, max_retries=0) as b,
    ):
        first = await a.responses.create(model=MOCK_MODEL, input="secret", max_output_tokens=4)
        errors = []
        for previous in (first.id, "resp_" + "0" * 48):
            with pytest.raises(openai.NotFoundError) as caught:
                await b.responses.create(model=MOCK_MODEL, input="go on", previous_response_id=previous)
            errors.append({**caught.value.body, "message": caught.value.body["message"].replace(previous, "ID")})  # type: ignore[dict-item, index]
        assert errors[0] == errors[1] and errors[0]["code"] == "previous_response_not_found"
        again = await a.responses.create(model=MOCK_MODEL, input="go on", previous_response_id=first.id)
        assert again.previous_response_id == first.id


async def test_store_false_keeps_nothing(gateway: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as client:
        kept = await client.responses.create(model=MOCK_MODEL, input="hi", max_output_tokens=4)
        dropped = await client.responses.create(model=MOCK_MODEL, input="hi", max_output_tokens=4, store=False)
        assert (await client.responses.retrieve(kept.id)).id == kept.id
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(dropped.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model=MOCK_MODEL, input="x", previous_response_id=dropped.id)


async def test_memory_store_in_several_workers_refuses_what_it_would_split(fake_upstream: FakeUpstream) -> None:
    app = create_app(parse_config(gateway_config_text(fake_upstream.url), "<test>", env={}), workers=3)
    runner, url = await serve_app(app)
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(model=MOCK_MODEL, input="hi", max_output_tokens=4)
            assert caught.value.body["param"] == "store" and caught.value.body["code"] == "store_not_shared"  # type: ignore[index]
            with pytest.raises(openai.BadRequestError) as continued:
                await client.responses.create(model=MOCK_MODEL, input="hi", store=False, previous_response_id="resp_x")
            assert continued.value.body["param"] == "previous_response_id"  # type: ignore[index]
            served = await client.responses.create(model=MOCK_MODEL, input="hi", max_output_tokens=4, store=False)
            assert served.output_text
        assert fake_upstream.requests == []  # refused before any upstream call (the mock is in-process anyway)
    finally:
        await runner.cleanup()

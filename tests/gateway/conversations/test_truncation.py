"""Responses' ``truncation`` against a route's context window: ``disabled`` (the default) refuses a
conversation that would overflow with a 400 naming ``input``; ``auto`` drops the oldest turns,
whole, so the upstream gets what fits. The window comes from the backend (the mock's 8,192
tokens, vLLM's ``max_model_len``) or from ``routes[].context_length``."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.conversations.window import estimate_tokens, fit
from schemas.errors import InvalidRequestError
from tests.conftest import MOCK_MODEL, MakeGateway, RunningGateway

WORDS = "lorem ipsum dolor sit amet " * 440  # ~12,000 characters: ~3,000 tokens a turn


async def _two_turns(client: openai.AsyncOpenAI, model: str) -> str:
    first = await client.responses.create(model=model, input="1 " + WORDS, max_output_tokens=8)
    second = await client.responses.create(
        model=model, input="2 " + WORDS, previous_response_id=first.id, max_output_tokens=8
    )
    return second.id


async def test_disabled_refuses_and_auto_drops_the_oldest_turn_on_the_mock(gateway: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as client:
        previous = await _two_turns(client, MOCK_MODEL)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(
                model=MOCK_MODEL, input="3 " + WORDS, previous_response_id=previous, max_output_tokens=8
            )
        assert refused.value.body["param"] == "input"  # type: ignore[index]
        assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        assert "8192" in refused.value.body["message"] and "truncation" in refused.value.body["message"]  # type: ignore[index]
        kept = await client.responses.create(
            model=MOCK_MODEL, input="3 " + WORDS, previous_response_id=previous, max_output_tokens=8,
            truncation="auto",
        )  # fmt: skip
    assert kept.usage is not None and kept.usage.input_tokens < 8192


FAKE_VLLM = """  - name: small-vllm
    routes: [{backend: up-vllm, model: upstream-llama, context_length: 7000}]
"""


async def test_auto_sends_the_newest_turns_that_fit_a_configured_window(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(extra_models=FAKE_VLLM)
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0) as client:
        previous = await _two_turns(client, "small-vllm")
        await client.responses.create(
            model="small-vllm", input="3 " + WORDS, previous_response_id=previous, max_output_tokens=8,
            truncation="auto",
        )  # fmt: skip
    messages: list[dict[str, Any]] = gw.upstream.requests[-1].body["messages"]
    users = [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in messages
        if m["role"] == "user"
    ]
    assert [u[:2] for u in users] == ["2 ", "3 "]  # turn 1 dropped whole; turn 2 and the new input kept


def test_fit_keeps_what_fits_and_names_input() -> None:
    turns = [[{"content": "x" * 400}] for _ in range(4)]
    size = estimate_tokens(turns[0])
    assert list(fit(turns, 50, context=None, output_tokens=10, truncation="disabled")) == turns
    assert list(fit(turns, 50, context=4 * size + 60, output_tokens=10, truncation="disabled")) == turns
    assert list(fit(turns, 50, context=2 * size + 60, output_tokens=10, truncation="auto")) == turns[2:]
    with pytest.raises(InvalidRequestError) as alone:
        fit(turns, 500, context=300, output_tokens=10, truncation="auto")
    assert alone.value.param == "input"

"""Per-key rate limits in memory: the token buckets, the reservation and its settlement, the
concurrency cap, and OpenAI's ``x-ratelimit-*`` headers on every answer to a key with limits."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from gateway.security.caps import reserve_tokens
from gateway.security.ratelimit import Limits, MemoryStore, format_reset
from schemas.completions import CompletionRequest
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, eventually
from tests.fakes import Behaviour
from tests.gateway.security.conftest import AUTH_A, AUTH_B, MakeSecureGateway, auth_section

RATE_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the buckets (unit) ------------------------------------------------------------------------
async def test_requests_bucket_refills_at_rpm_per_minute() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    limits = Limits(rpm=3)
    for left in (2, 1, 0):
        verdict, reservation = await store.acquire("k", limits, 0)
        assert verdict.allowed and reservation is not None
        assert int(verdict.requests_level) == left
    verdict, reservation = await store.acquire("k", limits, 0)
    assert not verdict.allowed and reservation is None
    assert verdict.reason == "requests"
    assert verdict.retry_after == pytest.approx(20.0)  # one request per 20 s at 3 rpm
    clock.now += 19.9
    assert not (await store.acquire("k", limits, 0))[0].allowed
    clock.now += 0.2
    assert (await store.acquire("k", limits, 0))[0].allowed


async def test_refusal_takes_nothing() -> None:
    """A request refused by one counter consumes no other (all checked before any is taken)."""
    store = MemoryStore(FakeClock())
    limits = Limits(rpm=10, tpm=100)
    verdict, _ = await store.acquire("k", limits, 90)
    assert verdict.allowed
    verdict, _ = await store.acquire("k", limits, 20)  # over the tokens left
    assert verdict.reason == "tokens"
    assert verdict.requests_level == pytest.approx(9.0)  # the refused request took no request slot
    assert verdict.retry_after == pytest.approx((20 - 10) * 60 / 100)


async def test_tokens_reserved_then_settled_from_real_usage() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    limits = Limits(tpm=1000)
    verdict, reservation = await store.acquire("k", limits, 600)
    assert verdict.tokens_level == pytest.approx(400)
    assert reservation is not None
    store.release(reservation, used=100)  # used far less than reserved: 500 given back
    assert (await store.peek("k", limits)).tokens_level == pytest.approx(900)
    _, reservation = await store.acquire("k", limits, 100)
    assert reservation is not None
    store.release(reservation, used=400)  # used more than reserved (prompt under-estimated): owed
    assert (await store.peek("k", limits)).tokens_level == pytest.approx(500)
    _, reservation = await store.acquire("k", limits, 100)
    assert reservation is not None
    store.release(reservation, used=None)  # no usage reported: the reservation stands
    assert (await store.peek("k", limits)).tokens_level == pytest.approx(400)


async def test_request_larger_than_tpm_is_refused_without_retry() -> None:
    store = MemoryStore(FakeClock())
    verdict, _ = await store.acquire("k", Limits(tpm=100), 101)
    assert verdict.reason == "too_large"
    assert verdict.retry_after is None


async def test_concurrency_cap_counts_until_release() -> None:
    store = MemoryStore(FakeClock())
    limits = Limits(max_concurrent=2)
    held = [(await store.acquire("k", limits, 0))[1] for _ in range(2)]
    verdict, _ = await store.acquire("k", limits, 0)
    assert verdict.reason == "concurrency"
    assert held[0] is not None
    store.release(held[0], used=0)
    assert (await store.acquire("k", limits, 0))[0].allowed


async def test_keys_have_separate_buckets() -> None:
    store = MemoryStore(FakeClock())
    assert (await store.acquire("a", Limits(rpm=1), 0))[0].allowed
    assert not (await store.acquire("a", Limits(rpm=1), 0))[0].allowed
    assert (await store.acquire("b", Limits(rpm=1), 0))[0].allowed


def test_reset_format_follows_openai() -> None:
    assert format_reset(0) == "0s"
    assert format_reset(0.0201) == "20ms"
    assert format_reset(1.5) == "1.5s"
    assert format_reset(20) == "20s"
    assert format_reset(360) == "6m0s"
    assert format_reset(90.25) == "1m30.25s"


def test_reservation_is_prompt_estimate_plus_max_tokens_times_sequences() -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": ["abcdefgh", "abcd"], "max_tokens": 10, "n": 2})
    assert req.prompt_estimate() == (8 // 4 + 1) + (4 // 4 + 1)
    assert reserve_tokens(req) == 5 + 10 * 2 * 2
    best = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3], "n": 2, "best_of": 5})
    assert reserve_tokens(best) == 3 + 16 * 5 * 1  # unset max_tokens counts as 16; best_of sequences


# --- over HTTP ---------------------------------------------------------------------------------
async def post(url: str, body: dict[str, object], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()


BODY = {"model": MOCK_MODEL, "prompt": "hello", "max_tokens": 4}


async def test_rpm_over_http_429_with_retry_after_and_headers(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="rpm: 2"))
    first = await post(gw.url, BODY, AUTH_A)
    assert first[0] == 200
    assert first[1]["x-ratelimit-limit-requests"] == "2"
    assert first[1]["x-ratelimit-remaining-requests"] == "1"
    assert first[1]["x-ratelimit-reset-requests"].endswith("s")
    assert (await post(gw.url, BODY, AUTH_A))[0] == 200
    status, headers, raw = await post(gw.url, BODY, AUTH_A)
    assert status == 429
    error = orjson.loads(raw)["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "rate_limit_exceeded"
    assert "requests per minute" in error["message"]
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 25 <= int(headers["Retry-After"]) <= 30  # 2 rpm: one request per 30 s
    assert 25_000 <= int(headers["retry-after-ms"]) <= 30_000
    # another key has its own bucket
    assert (await post(gw.url, BODY, AUTH_B))[0] == 200


async def test_tpm_reserves_before_and_settles_after(secure_gateway: MakeSecureGateway) -> None:
    """The fake upstream reports 3 prompt + 2 completion tokens whatever max_tokens says: the
    bucket first drops by the reservation, then gets back all but the 5 used."""
    gw = await secure_gateway(auth_section(a="tpm: 1000"))
    body = {"model": OPENAI_MODEL, "prompt": "abcdefgh", "max_tokens": 100}
    reserved = 8 // 4 + 1 + 100
    status, headers, _ = await post(gw.url, body, AUTH_A)
    assert status == 200
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert int(headers["x-ratelimit-remaining-tokens"]) == 1000 - reserved
    status, headers, _ = await post(gw.url, body, AUTH_A)
    # the first request was settled at 5 tokens: ~995 left (plus a hair of refill) before this one
    assert int(headers["x-ratelimit-remaining-tokens"]) in (1000 - 5 - reserved, 1000 - 5 - reserved + 1)
    too_big = {"model": OPENAI_MODEL, "prompt": "x", "max_tokens": 5000}
    status, headers, raw = await post(gw.url, too_big, AUTH_A)
    assert status == 429
    assert "Retry-After" not in headers  # waiting cannot help
    assert "Request too large" in orjson.loads(raw)["error"]["message"]


async def test_failed_upstream_call_gives_its_tokens_back(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="tpm: 1000"))
    gw.upstream.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "boom"}}))
    body = {"model": OPENAI_MODEL, "prompt": "abcd", "max_tokens": 100}
    status, _, _ = await post(gw.url, body, AUTH_A)
    assert status == 502
    _, headers, _ = await post(gw.url, body, AUTH_A)
    # nothing was kept for the failed call: only this request's own reservation is missing
    assert int(headers["x-ratelimit-remaining-tokens"]) >= 1000 - (4 // 4 + 1 + 100)


async def test_concurrency_limit_over_http(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="max_concurrent: 1"))
    held = Behaviour(kind="hold")
    gw.upstream.script.append(held)
    body = {"model": OPENAI_MODEL, "prompt": "x"}
    slow = asyncio.create_task(post(gw.url, body, AUTH_A))
    await eventually(lambda: gw.upstream.active == 1)  # the first request holds the key's slot
    status, headers, raw = await post(gw.url, body, AUTH_A)
    assert status == 429
    assert "in flight" in orjson.loads(raw)["error"]["message"]
    assert headers["Retry-After"] == "1"
    held.release()
    assert (await slow)[0] == 200
    assert (await post(gw.url, body, AUTH_A))[0] == 200  # the slot came back


async def test_stream_releases_its_slot_and_settles(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="max_concurrent: 1, tpm: 10000"))
    body = {
        "model": OPENAI_MODEL,
        "prompt": "x",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for _ in range(3):  # would be 429 from the second on if a stream kept its slot
        status, headers, raw = await post(gw.url, body, AUTH_A)
        assert status == 200
        assert raw.endswith(b"data: [DONE]\n\n")
        assert all(h in headers for h in RATE_HEADERS if "tokens" in h)
        assert "x-ratelimit-limit-requests" not in headers  # no rpm configured: no requests trio
    _, headers, _ = await post(gw.url, {**body, "stream": False, "stream_options": None}, AUTH_A)
    # each stream used 3 + 6 tokens (its usage chunk): settled, not left at the reservation
    assert int(headers["x-ratelimit-remaining-tokens"]) >= 10000 - 3 * 9 - (0 + 1 + 6)


async def test_headers_on_every_answer_to_a_limited_key(secure_gateway: MakeSecureGateway) -> None:
    """200, stream, 400 (bad body), 404 (unknown model), 403, cap 400, 429 and GET /v1/models."""
    gw = await secure_gateway(auth_section(a="rpm: 100, tpm: 100000", b="rpm: 1") + "caps: {n: 2}\n")
    cases = [
        (BODY, AUTH_A, 200),
        ({**BODY, "stream": True}, AUTH_A, 200),
        ({"model": MOCK_MODEL}, AUTH_A, 400),
        ({**BODY, "model": "nope"}, AUTH_A, 404),
        ({**BODY, "n": 3}, AUTH_A, 400),
        ({**BODY, "model": OPENAI_MODEL}, AUTH_B, 403),
        (BODY, AUTH_B, 200),
        (BODY, AUTH_B, 429),
    ]
    for body, headers, expected in cases:
        status, got, raw = await post(gw.url, body, headers)
        assert status == expected, (body, raw)
        assert "x-ratelimit-limit-requests" in got and "x-ratelimit-remaining-requests" in got, (body, got)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/models", headers=AUTH_A) as resp:
            assert resp.status == 200
            assert all(h in resp.headers for h in RATE_HEADERS)
        async with session.post(gw.url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 401  # no key: nothing to report
            assert "x-ratelimit-limit-requests" not in resp.headers


async def test_rate_limit_rejections_counted_per_key(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="rpm: 1"))
    await post(gw.url, BODY, AUTH_A)
    await post(gw.url, BODY, AUTH_A)
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert 'gateway_key_rejections_total{key="team-a",reason="requests"} 1.0' in text
    assert 'gateway_key_requests_total{key="team-a",status="429"} 1.0' in text

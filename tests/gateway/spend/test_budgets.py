"""Budgets in money per key, in one process (the in-memory store): a key that has spent its budget gets a
429 naming the budget and when it restarts, before any upstream is called; periods restart on the calendar."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.spend.budgets import Budget, SpendLedger, memory_spend_store, period_of
from gateway.spend.prices import units
from gateway.state import STATE
from schemas.config import BudgetConfig
from schemas.errors import BudgetExceededError
from tests.gateway.security.conftest import AUTH_A, AUTH_B, MakeSecureGateway, auth_section
from tests.gateway.spend.test_spend_exact import MODELS

# The fake upstream's usage for a completion of n=1: 3 prompt and 2 completion tokens, at 0.15/0.6 per
# million: 0.00000165 a request. A budget of 0.000004 allows three requests (the third goes over).
PER_REQUEST = (3 * Decimal("0.15") + 2 * Decimal("0.6")) / 10**6


async def post(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
    body = {"model": "priced", "prompt": "x", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
        return resp.status, orjson.loads(await resp.read()), resp.headers


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_a_key_that_spent_its_budget_is_refused_before_any_upstream(
    secure_gateway: MakeSecureGateway, store: str, request: pytest.FixtureRequest
) -> None:
    """In memory and in Redis (a real redis-server): the same refusal, before the upstream is called."""
    url = "memory" if store == "memory" else request.getfixturevalue("redis_server").url
    auth = auth_section(a='budget: {amount: "0.000004", period: day}', b="models: ['*']", extra=f"  store: {url}\n")
    gw = await secure_gateway(auth, extra_models=MODELS)
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            status, body, _ = await post(session, gw.url, AUTH_A)
            assert status == 200, body
        assert 3 * PER_REQUEST > Decimal("0.000004") > 2 * PER_REQUEST
        sent = len(gw.upstream.requests)
        status, body, headers = await post(session, gw.url, AUTH_A)
        assert status == 429
        assert len(gw.upstream.requests) == sent  # refused before any upstream was called
        error = body["error"]
        assert error["code"] == "budget_exceeded" and error["type"] == "insufficient_quota"
        assert "key 'team-a'" in error["message"] and "0.000004 per day (UTC)" in error["message"]
        assert f"spent {3 * PER_REQUEST}" in error["message"]
        assert "restarts at " in error["message"] and error["message"].endswith("T00:00:00Z.")
        assert 0 < int(headers["Retry-After"]) <= 86400
        # another key, no budget: unaffected
        assert (await post(session, gw.url, AUTH_B))[0] == 200
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert 'gateway_key_rejections_total{key="team-a",reason="budget"} 1.0' in text
    if store == "redis":  # the charges reached the shared store (the ledger sends them every FLUSH_EVERY s)
        ledger = gw.app[STATE].request_guard.ledger
        assert ledger is not None and await ledger.flush()
        (usage,) = await ledger.counters.get("team-a", ["total"])
        assert usage == str(units(3 * PER_REQUEST, 12)).encode()  # the three served
        replica = await secure_gateway(auth, extra_models=MODELS)  # another replica on the same Redis
        sent = len(gw.upstream.requests)
        async with aiohttp.ClientSession() as session:
            status, body, _ = await post(session, replica.url, AUTH_A)
        assert status == 429 and body["error"]["code"] == "budget_exceeded"
        assert len(gw.upstream.requests) == sent


async def test_a_total_budget_never_restarts(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a='budget: {amount: "0.000001", period: total}'), extra_models=MODELS)
    async with aiohttp.ClientSession() as session:
        assert (await post(session, gw.url, AUTH_A))[0] == 200
        status, body, headers = await post(session, gw.url, AUTH_A)
    assert status == 429 and "Retry-After" not in headers
    assert "does not restart (a total budget)" in body["error"]["message"]


def test_periods_are_utc_calendar_days_and_months() -> None:
    dec_31 = 1798761599.0  # 2026-12-31T23:59:59Z
    assert period_of("day", dec_31) == ("day:2026-12-31", 1798761600.0)
    assert period_of("month", dec_31) == ("month:2026-12", 1798761600.0)  # 2027-01-01T00:00:00Z
    assert period_of("day", dec_31 + 1) == ("day:2027-01-01", 1798761600.0 + 86400)
    assert period_of("total", dec_31) == ("total", None)


async def test_a_new_day_restarts_the_budget() -> None:
    now = [1798761000.0]  # 2026-12-31, 23:50 UTC
    ledger = SpendLedger(
        {"k": Budget.of(BudgetConfig(amount=Decimal("0.5"), period="day"))}, memory_spend_store(1), clock=lambda: now[0]
    )
    ledger.charge("k", 5 * 10**11)  # 0.5
    with pytest.raises(BudgetExceededError) as refused:
        await ledger.check("k")
    assert refused.value.retry_after == 600.0  # ten minutes to midnight
    now[0] += 601  # 2027-01-01: a new day, a new month
    await ledger.check("k")
    (usage,) = await ledger.usage(["k"])
    assert usage["spent"] == {"day": "0", "month": "0", "total": "0.5"}
    assert usage["budget"] == {
        "amount": "0.5",
        "period": "day",
        "remaining": "0.5",
        "exceeded": False,
        "resets_at": "2027-01-02T00:00:00Z",
    }


class FlakyStore:
    """A shared store (no ``add_now``: charges go in batches) that can be away."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], int] = {}
        self.down = True
        self.batches = 0

    async def get(self, tenant: str, keys: Any) -> list[bytes | None]:
        if self.down:
            raise ConnectionError("redis away")
        return [str(self.values[(tenant, k)]).encode() if (tenant, k) in self.values else None for k in keys]

    async def add_many(self, adds: Any) -> None:
        if self.down:
            raise ConnectionError("redis away")
        self.batches += 1
        for tenant, key, amount, _ in adds:
            self.values[(tenant, key)] = self.values.get((tenant, key), 0) + amount

    async def close(self) -> None:
        self.closed = True


async def test_a_store_outage_delays_spend_and_loses_none() -> None:
    errors: list[None] = []
    store = FlakyStore()
    ledger = SpendLedger(
        {"k": Budget.of(BudgetConfig(amount=Decimal("1"), period="total"))},
        store,  # type: ignore[arg-type]  # a TenantStore in what the ledger uses of one
        on_error=lambda: errors.append(None),
    )
    ledger.charge("k", 7 * 10**11)
    assert not await ledger.flush()  # away: kept
    await ledger.check("k")  # the store is away: let through, counted
    assert len(errors) == 2
    store.down = False
    ledger.charge("k", 4 * 10**11)
    with pytest.raises(BudgetExceededError, match=r"spent 1\.1 of its budget of 1 in total"):
        await ledger.check("k")  # what is not sent yet counts here already
    assert await ledger.flush()
    assert store.batches == 1  # everything owed, in one round trip
    assert store.values[("k", "total")] == 11 * 10**11
    await ledger.close()
    assert store.closed  # a shared store's connections are the ledger's to close

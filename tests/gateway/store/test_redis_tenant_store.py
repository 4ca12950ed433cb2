"""The Redis tenant store against a real ``redis-server``: shared by two stores (two processes'
worth), tenants and namespaces apart, TTLs on Redis's clock, atomic counters, and an outage
answered with a 503 (never a local fallback), logged once without the URL's password.

Skipped when ``redis-server`` is not installed; ``.ci/run`` installs it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import pytest

from gateway.store import RedisStore, StoreUnavailableError
from tests.gateway.security.conftest import RedisServer


def _prefix() -> str:
    return f"t{time.monotonic_ns()}"


async def test_two_stores_share_values_and_tenants_stay_apart(redis_server: RedisServer) -> None:
    prefix = _prefix()
    one = RedisStore(redis_server.url, "responses", ttl=60, prefix=prefix)
    two = RedisStore(redis_server.url, "responses", ttl=60, prefix=prefix)
    other = RedisStore(redis_server.url, "spend", ttl=60, prefix=prefix)
    try:
        assert await one.put("team-a", "resp_1", b"hello")
        assert await two.get("team-a", ["resp_1", "resp_2"]) == [b"hello", None]
        assert await two.get("team-b", ["resp_1"]) == [None]
        assert await other.get("team-a", ["resp_1"]) == [None]  # another namespace
        assert not await two.delete("team-b", "resp_1")
        assert await two.delete("team-a", "resp_1")
        assert await one.get("team-a", ["resp_1"]) == [None]
    finally:
        for store in (one, two, other):
            await store.close()


async def test_values_expire_and_a_touch_restarts_the_ttl(redis_server: RedisServer) -> None:
    """Read on Redis's clock (PTTL), not raced against sleeps: a touch sets the TTL anew, and a value
    left alone is gone once its TTL has passed."""
    import redis.asyncio as aioredis

    store = RedisStore(redis_server.url, "responses", ttl=60, prefix=_prefix())
    short = RedisStore(redis_server.url, "responses", ttl=0.2, prefix=_prefix())
    raw = aioredis.from_url(redis_server.url)
    try:
        await store.put("a", "touched", b"1")
        await store.put("a", "left", b"2")
        await asyncio.sleep(0.05)
        assert await store.get("a", ["touched"], touch=True) == [b"1"]
        touched, left = [await raw.pttl(store._key("a", key)) for key in ("touched", "left")]
        assert 60_000 >= touched > left > 0, (touched, left)  # the touch restarted the TTL; left's runs on
        assert await store.get("a", ["touched", "left"]) == [b"1", b"2"]  # a plain read touches nothing
        assert await raw.pttl(store._key("a", "left")) <= left
        await short.put("a", "soon", b"3")
        deadline = time.monotonic() + 10
        while await short.get("a", ["soon"]) != [None]:  # gone on Redis's clock, however slow this box
            assert time.monotonic() < deadline, "the value outlived its TTL"
            await asyncio.sleep(0.05)
        assert store.stats() is None  # Redis bounds itself (ttl, maxmemory): nothing counted here
    finally:
        await raw.aclose()
        for each in (store, short):
            await each.close()


async def test_counters_are_atomic_across_stores(redis_server: RedisServer) -> None:
    prefix = _prefix()
    # 40 calls at once open connections at once: a generous timeout, so a busy machine is no outage
    stores = [RedisStore(redis_server.url, "spend", ttl=60, prefix=prefix, timeout=2.0) for _ in range(2)]
    try:
        await asyncio.gather(*(stores[i % 2].add("team-a", "2026-12", 5 * 10**11) for i in range(40)))
        assert await stores[0].add("team-a", "2026-12", 0) == 20 * 10**12  # exact, as integers are
        assert await stores[1].add("team-b", "2026-12", 1) == 1
        await stores[0].add_many([("team-a", "2026-12", 1, None), ("team-b", "total", 7, math.inf)])
        assert await stores[1].get("team-a", ["2026-12"]) == [str(20 * 10**12 + 1).encode()]
        assert await stores[1].get("team-b", ["total"]) == [b"7"]
    finally:
        for store in stores:
            await store.close()


async def test_an_outage_is_a_503_logged_once_without_the_password(
    redis_server_with_password: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis = redis_server_with_password
    errors: list[int] = []
    store = RedisStore(redis.url, "responses", ttl=60, prefix=_prefix(), on_error=lambda: errors.append(1))
    try:
        await store.put("a", "k", b"v")
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="gateway.store"):
            for _ in range(3):
                with pytest.raises(StoreUnavailableError) as caught:
                    await store.get("a", ["k"])
                assert caught.value.status == 503 and caught.value.retry_after == 1.0
            with pytest.raises(StoreUnavailableError):
                await store.put("a", "k2", b"v")
        assert len(errors) == 4
        failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert len(failed) == 1 and "127.0.0.1" in failed[0]
        assert all(redis.password not in r.getMessage() for r in caplog.records)  # type: ignore[operator]
        redis.start()  # an empty Redis (no persistence): reachable again, the value gone
        with caplog.at_level(logging.WARNING, logger="gateway.store"):
            assert await store.get("a", ["k"]) == [None]
        assert not store.failing
        assert any("is back" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()

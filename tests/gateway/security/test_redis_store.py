"""The Redis rate-limit store against a real ``redis-server``: limits shared across stores and
across two ``gateway serve`` processes, and a Redis stopped mid-test degrading to per-replica
limits (a metric, one log line, never a failed request), then recovering.

Skipped when ``redis-server`` is not installed; ``.ci/run`` installs it, so CI runs them.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.security.ratelimit import Limits, RedisStore, Reservation
from tests.conftest import eventually, free_port
from tests.gateway.flow.conftest import FakeClock
from tests.gateway.security.conftest import KEY_A, RedisServer

ROOT = Path(__file__).resolve().parents[3]


def _store(redis: RedisServer, **options: float) -> RedisStore:
    return RedisStore(redis.url, prefix=f"t{time.monotonic_ns()}", **options)  # type: ignore[arg-type]


# --- the store itself ------------------------------------------------------------------------------
async def test_two_stores_share_one_bucket(redis_server: RedisServer) -> None:
    prefix = "shared"
    one = RedisStore(redis_server.url, prefix=prefix)
    two = RedisStore(redis_server.url, prefix=prefix)
    try:
        limits = Limits(rpm=3)
        allowed = [(await store.acquire("k", limits, 0))[0].allowed for store in (one, two, one, two, one)]
        assert allowed == [True, True, True, False, False]
        verdict, _ = await two.acquire("k", limits, 0)
        assert verdict.reason == "requests"
        assert verdict.retry_after is not None and 19 < verdict.retry_after <= 20
        assert not one.degraded and not two.degraded
    finally:
        await one.close()
        await two.close()


async def eventually_acquired(store: RedisStore, limits: Limits) -> Reservation | None:
    """Acquire ``k`` as soon as the store allows it (refused attempts hold nothing)."""
    got: list[Reservation] = []

    async def acquired() -> bool:
        _, reservation = await store.acquire("k", limits, 0)
        if reservation is not None:
            got.append(reservation)
        return reservation is not None

    await eventually(acquired)
    return got[0]


async def test_tokens_reserved_and_settled_in_redis(redis_server: RedisServer) -> None:
    store = _store(redis_server)
    try:
        limits = Limits(tpm=1000)
        verdict, reservation = await store.acquire("k", limits, 600)
        assert verdict.allowed and reservation is not None
        assert verdict.tokens_level == pytest.approx(400, abs=1)
        assert (await store.acquire("k", limits, 500))[0].reason == "tokens"
        store.release(reservation, used=100)

        async def settled() -> bool:  # the release runs in the background
            return (await store.peek("k", limits)).tokens_level >= 895

        await eventually(settled)
        assert (await store.peek("k", limits)).tokens_level == pytest.approx(900, abs=5)  # + refill
        assert (await store.acquire("k", limits, 1001))[0].reason == "too_large"
    finally:
        await store.close()


async def test_concurrency_shared_and_leases_expire(redis_server: RedisServer) -> None:
    prefix = "conc"
    one = RedisStore(redis_server.url, prefix=prefix, lease_seconds=0.5)
    two = RedisStore(redis_server.url, prefix=prefix, lease_seconds=0.5)
    try:
        limits = Limits(max_concurrent=1)
        _, held = await one.acquire("k", limits, 0)
        assert held is not None
        assert (await two.acquire("k", limits, 0))[0].reason == "concurrency"
        one.release(held, used=0)
        lost = await eventually_acquired(two, limits)  # the release runs in the background
        assert lost is not None  # and never released, as if its replica died
        assert (await one.acquire("k", limits, 0))[0].reason == "concurrency"
        await two.close()  # the replica dies: its renewals stop
        # The lease's expiry is Redis's own clock: wait for it, refused attempts hold nothing.
        assert await eventually_acquired(one, limits) is not None  # the dead replica's lease expired
    finally:
        await one.close()
        await two.close()


async def test_outage_degrades_then_recovers(redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    events: list[bool] = []
    errors: list[int] = []
    clock = FakeClock()  # the retry interval, and the fallback's buckets (no refill unless advanced)
    store = RedisStore(
        redis_server.url,
        prefix="outage",
        retry_interval=0.3,
        clock=clock.now,
        on_degraded=events.append,
        on_error=lambda: errors.append(1),
    )
    limits = Limits(rpm=2)
    try:
        assert (await store.acquire("k", limits, 0))[0].allowed
        assert (await store.acquire("k", limits, 0))[0].allowed
        assert not (await store.acquire("k", limits, 0))[0].allowed  # shared bucket empty
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="gateway.ratelimit"):
            started = time.monotonic()
            verdicts = [(await store.acquire("k", limits, 0))[0] for _ in range(3)]
            # Timing-only sanity (the Redis client's socket timeouts are real): no stall
            # beyond the store's 0.25 s timeout per call, with a generous margin.
            assert time.monotonic() - started < 5
        # per replica now: a fresh local bucket of 2
        assert [v.allowed for v in verdicts] == [True, True, False]
        assert store.degraded and events == [True]
        assert len(errors) == 1  # later calls go straight to the local store until the retry time
        failed = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failed) == 1
        assert f"redis at 127.0.0.1:{redis_server.port}" in failed[0].getMessage()
        assert "per replica" in failed[0].getMessage()

        redis_server.start()
        clock.advance(0.3)  # the retry interval is up
        with caplog.at_level(logging.WARNING, logger="gateway.ratelimit"):
            verdict, _ = await store.acquire("k", limits, 0)
        assert verdict.allowed  # a new redis-server: its bucket is full again
        assert not store.degraded and events == [True, False]
        assert any("is back" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()


async def test_password_protected_redis(redis_server_with_password: RedisServer) -> None:
    store = RedisStore(redis_server_with_password.url, prefix="pw")
    try:
        assert (await store.acquire("k", Limits(rpm=1), 0))[0].allowed
        assert not store.degraded
    finally:
        await store.close()


# --- two gateway processes -------------------------------------------------------------------------
def _gateway_config(redis_url: str) -> str:
    return f"""server: {{host: 127.0.0.1, drain_timeout: 1}}
backends: [{{name: sim, type: mock}}]
models: [{{name: demo, routes: [{{backend: sim, model: demo}}]}}]
auth:
  store: {redis_url}
  redis_retry_interval: 0.5
  keys:
    - {{name: team-a, key: {KEY_A}, rpm: 4}}
"""


class GatewayProcess:
    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(self.port)],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"gateway exited: {self.log_path.read_text()}")
                try:
                    async with session.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError("gateway did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def two_gateways(redis_server: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    config = tmp_path / "gateway.yaml"
    config.write_text(_gateway_config(redis_server.url))
    gateways = [GatewayProcess(config, tmp_path / f"gw{i}.log") for i in range(2)]
    try:
        yield gateways
    finally:
        for gw in gateways:
            gw.stop()


async def _statuses(gateways: list[GatewayProcess], count: int) -> list[int]:
    """``count`` requests, alternating between the gateways."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            gw = gateways[i % len(gateways)]
            body = {"model": "demo", "prompt": "hi", "max_tokens": 2}
            headers = {"Authorization": f"Bearer {KEY_A}"}
            async with session.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
                await resp.read()
                out.append(resp.status)
    return out


async def _metrics(gw: GatewayProcess) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as resp:
            return await resp.text()


@pytest.mark.slow
async def test_two_gateways_share_a_limit_and_survive_a_redis_outage(
    two_gateways: list[GatewayProcess], redis_server: RedisServer
) -> None:
    await asyncio.gather(*(gw.wait_ready() for gw in two_gateways))
    # One bucket of 4 for both replicas: with per-replica buckets, 8 of these 10 would pass.
    statuses = await _statuses(two_gateways, 10)
    assert statuses.count(200) == 4, statuses
    assert statuses.count(429) == 6, statuses

    redis_server.stop()
    # Each replica now limits on its own (a fresh bucket of 4 each), and nothing fails.
    statuses = await _statuses(two_gateways, 12)
    assert all(s in (200, 429) for s in statuses), statuses
    assert statuses.count(200) == 8, statuses
    for gw in two_gateways:
        text = await _metrics(gw)
        assert "gateway_ratelimit_store_degraded 1.0" in text
        assert "gateway_ratelimit_store_errors_total" in text
        lines = [line for line in gw.log.splitlines() if "rate-limit store" in line and "failed" in line]
        assert len(lines) == 1, gw.log  # one line per outage, not one per request
        assert f"redis at 127.0.0.1:{redis_server.port}" in lines[0]

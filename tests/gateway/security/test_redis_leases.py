"""Concurrency leases in Redis (issue 13 item 10): releases that fail during a Redis restart are
retried, leases are short and renewed while their requests run, and a concurrency refusal's
``retry_after`` says when a slot really frees. Against a real redis-server."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from gateway.security.ratelimit import Limits, RedisStore
from tests.conftest import eventually, free_port
from tests.gateway.security.conftest import REDIS_MISSING, RedisServer

# The store's Redis timeout (0.25 s by default, so a slow Redis degrades at once): these tests are
# about leases, and on a loaded machine a 0.25 s answer is ordinary (a timed-out acquire would be
# decided locally and hold no lease in Redis at all).
PATIENT = 5.0


class AofRedis(RedisServer):
    """redis-server with the append-only file on: a restart brings the leases back, as in production."""

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--loglevel", "warning"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Until it answers a command, not only accepts connections: Redis listens before it has
        # replayed the append-only file, and meanwhile refuses commands with LOADING (a loaded
        # machine's restart was asked for a lease while it still loaded: BusyLoadingError).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[AofRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip(REDIS_MISSING)
    server = AofRedis(free_port(), tmp_path, None)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class FakeClock:
    """The store's clock (its retry interval): never moves, so nothing waits for that interval."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def redis_ms(client: Any) -> float:
    """Redis's own clock in ms: the clock the lease scripts score leases with."""
    seconds, micros = await client.time()
    return float(seconds) * 1000 + float(micros) / 1000


async def test_releases_lost_in_a_restart_are_retried(aof_redis: AofRedis) -> None:
    """Three requests in flight, Redis restarted under them: their slots come back at the
    renewer's next tick once Redis is back, not after the lease (here 60 s) nor after the
    request path's retry interval (here 60 s on a clock that never moves)."""
    clock = FakeClock()
    errors: list[None] = []
    store = RedisStore(
        aof_redis.url, prefix="restart", timeout=PATIENT, lease_seconds=60, retry_interval=60, clock=clock,
        on_error=lambda: errors.append(None),
    )  # fmt: skip
    limits = Limits(max_concurrent=3)
    try:
        held = [(await store.acquire("k", limits, 0))[1] for _ in range(3)]
        assert all(r is not None for r in held)
        refused, _ = await store.acquire("k", limits, 0)
        assert refused.reason == "concurrency"
        aof_redis.stop()
        for reservation in held:
            assert reservation is not None
            store.release(reservation, used=0)  # fails: Redis is down
        await eventually(lambda: len(errors) == 3)  # the three releases failed and are kept
        aof_redis.start()  # the AOF brings the three leases back
        assert store.degraded

        async def renewer_tick() -> bool:
            await store.renew_now()  # the renewer's tick, without waiting 20 s for it
            return not store.degraded  # (a restarting Redis may answer LOADING at first)

        await eventually(renewer_tick)
        verdicts = [(await store.acquire("k", limits, 0))[0] for _ in range(3)]
        assert [v.allowed for v in verdicts] == [True, True, True]
        assert not store.degraded
    finally:
        await store.close()


async def test_a_lease_outlives_a_failed_renewal(aof_redis: AofRedis) -> None:
    """One renewal tick fails (Redis away, or one slow answer): the next tick renews anyway.
    Before, the renewer waited out the request path's retry interval (5 s by default), so a
    lease shorter than about three of them expired under a live request and its slot was given
    to another."""
    store = RedisStore(
        aof_redis.url, prefix="blip", timeout=PATIENT, lease_seconds=60, retry_interval=60, clock=FakeClock()
    )
    client = redis.asyncio.Redis.from_url(aof_redis.url)
    leases = "blip:rl:{k}:conc"
    try:
        _, held = await store.acquire("k", Limits(max_concurrent=1), 0)
        assert held is not None
        aof_redis.stop()
        await store.renew_now()  # fails
        assert store.degraded
        aof_redis.start()  # the AOF brings the lease back
        first_term = await client.zscore(leases, held.lease)
        assert first_term is not None

        async def renewed() -> bool:
            await store.renew_now()  # the next tick, well within the retry interval
            score = await client.zscore(leases, held.lease)
            return score is not None and score > first_term

        await eventually(renewed)
    finally:
        await client.aclose()
        await store.close()


async def test_leases_are_renewed_while_held(aof_redis: AofRedis) -> None:
    """A held lease outlives its first term because the holder renews it; a live lease's
    refusal says "about a second"; a release frees it at once. Waits on what Redis holds, not
    on a fixed sleep: on a starved event loop a late tick only makes the test wait longer."""
    live = RedisStore(aof_redis.url, prefix="renew", timeout=PATIENT, lease_seconds=1.5)  # renewed every 0.5 s
    other = RedisStore(aof_redis.url, prefix="renew", timeout=PATIENT, lease_seconds=1.5)
    client = redis.asyncio.Redis.from_url(aof_redis.url)
    leases = "renew:rl:{k}:conc"
    limits = Limits(max_concurrent=1)
    try:
        _, held = await live.acquire("k", limits, 0)
        assert held is not None
        first_term = await client.zscore(leases, held.lease)
        assert first_term is not None

        async def renewed() -> bool:
            score = await client.zscore(leases, held.lease)
            return score is not None and score > first_term

        await eventually(renewed)  # the renewer's first tick (about a third of the lease)
        verdict, _ = await other.acquire("k", limits, 0)
        assert verdict.reason == "concurrency"
        assert verdict.retry_after == pytest.approx(1.0)  # a live request: no better estimate

        async def first_term_over() -> bool:
            return await redis_ms(client) > first_term + 50

        await eventually(first_term_over)
        verdict, _ = await other.acquire("k", limits, 0)
        assert verdict.reason == "concurrency"  # held past the lease it was acquired with
        live.release(held, used=0)

        async def freed() -> bool:
            return int(await client.zcard(leases)) == 0

        await eventually(freed)  # the release reached Redis
        assert (await other.acquire("k", limits, 0))[0].allowed
    finally:
        await client.aclose()
        await live.close()
        await other.close()


async def test_retry_after_is_the_expiry_of_a_dead_holders_lease(aof_redis: AofRedis) -> None:
    dead = RedisStore(aof_redis.url, prefix="dead", timeout=PATIENT, lease_seconds=2.4)
    other = RedisStore(aof_redis.url, prefix="dead", timeout=PATIENT, lease_seconds=2.4)
    limits = Limits(max_concurrent=1)
    try:
        _, held = await dead.acquire("k", limits, 0)
        assert held is not None
        died = time.monotonic()  # after Redis scored the lease: it ends at most 2.4 s from here
        await dead.close()  # the replica dies holding it
        # Past the line (half the lease) below which a lease has surely missed a renewal: its
        # holder is gone. A slow machine only sleeps longer, which changes nothing asserted.
        await asyncio.sleep(1.22)
        asked = time.monotonic()  # Redis reads its clock after this
        verdict, _ = await other.acquire("k", limits, 0)
        assert verdict.reason == "concurrency"
        # Not the generic "about 1 s": the time until the abandoned lease expires, at most what
        # was left of it when asked (however slow this machine; 10 ms for Redis's ms rounding).
        assert verdict.retry_after is not None and 0 <= verdict.retry_after <= 2.4 - (asked - died) + 0.01
        await asyncio.sleep(verdict.retry_after + 0.05)
        assert (await other.acquire("k", limits, 0))[0].allowed  # Retry-After told the truth
    finally:
        await other.close()

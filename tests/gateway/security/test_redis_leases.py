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

import pytest

from gateway.security.ratelimit import Limits, RedisStore
from tests.conftest import free_port
from tests.gateway.security.conftest import REDIS_MISSING, RedisServer


class AofRedis(RedisServer):
    """redis-server with the append-only file on: a restart brings the leases back, as in production."""

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--loglevel", "warning"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
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


async def test_releases_lost_in_a_restart_are_retried(aof_redis: AofRedis) -> None:
    """Three requests in flight, Redis restarted under them: their slots come back as soon as
    Redis does, not after the lease (here 60 s)."""
    store = RedisStore(aof_redis.url, prefix="restart", lease_seconds=60, retry_interval=0.2)
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
        await asyncio.sleep(0.3)
        aof_redis.start()  # the AOF brings the three leases back
        await asyncio.sleep(0.25)  # past the retry interval
        await store.renew_now()  # the renewer's tick, without waiting 20 s for it
        verdicts = [(await store.acquire("k", limits, 0))[0] for _ in range(3)]
        assert [v.allowed for v in verdicts] == [True, True, True]
        assert not store.degraded
    finally:
        await store.close()


async def test_leases_are_renewed_while_held_and_expire_when_the_holder_dies(aof_redis: AofRedis) -> None:
    live = RedisStore(aof_redis.url, prefix="renew", lease_seconds=0.6)
    other = RedisStore(aof_redis.url, prefix="renew", lease_seconds=0.6)
    limits = Limits(max_concurrent=1)
    try:
        _, held = await live.acquire("k", limits, 0)
        assert held is not None
        await asyncio.sleep(1.5)  # over twice the lease: renewed meanwhile
        verdict, _ = await other.acquire("k", limits, 0)
        assert verdict.reason == "concurrency"
        assert verdict.retry_after == pytest.approx(1.0)  # a live request: no better estimate
        live.release(held, used=0)
        await asyncio.sleep(0.1)
        assert (await other.acquire("k", limits, 0))[0].allowed
    finally:
        await live.close()
        await other.close()


async def test_retry_after_is_the_expiry_of_a_dead_holders_lease(aof_redis: AofRedis) -> None:
    dead = RedisStore(aof_redis.url, prefix="dead", lease_seconds=3.0)
    other = RedisStore(aof_redis.url, prefix="dead", lease_seconds=3.0)
    limits = Limits(max_concurrent=1)
    try:
        _, held = await dead.acquire("k", limits, 0)
        assert held is not None
        died = time.monotonic()
        await dead.close()  # the replica dies holding it
        await asyncio.sleep(1.5)  # past its renewal time (a third of the lease): its holder is gone
        verdict, _ = await other.acquire("k", limits, 0)
        left = 3.0 - (time.monotonic() - died)  # at most this much of the lease is left
        assert verdict.reason == "concurrency"
        # Not the generic "about 1 s": the time until the abandoned lease expires (however slow this machine).
        assert verdict.retry_after is not None and 0 <= verdict.retry_after <= left + 0.05
        await asyncio.sleep(verdict.retry_after + 0.05)
        assert (await other.acquire("k", limits, 0))[0].allowed  # Retry-After told the truth
    finally:
        await other.close()

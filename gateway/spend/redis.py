"""Spend counters in Redis, shared by every worker and replica using the same ``auth.store`` and prefix.

Keys are ``{prefix}:spend:{<key name>}:<counter>`` (``day:2026-12-01``, ``month:2026-12``, ``total``),
the key name a hash tag so one key's counters share a Redis Cluster slot; values are integers
(``INCRBY``: exact, 64-bit, so a key's counter holds up to about 9.2 million of the currency).
A day's counter expires three days after it was last added to, a month's after 62 days; the total
never. A batch of adds is one pipelined round trip (``MULTI``: all of it or none, so a failed batch
is sent again whole without counting any of it twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gateway.spend.budgets import Add

__all__ = ["RedisCounters"]


class RedisCounters:
    """The :class:`~gateway.spend.budgets.Counters` of a Redis at ``url``; a call slower than twice
    ``timeout`` fails (the ledger then keeps what it owes and lets requests through)."""

    def __init__(self, url: str, *, prefix: str = "gateway", timeout: float = 0.25) -> None:
        import redis.asyncio as aioredis  # imported only when a Redis store is configured
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No client-side retries: a failed call reaches the ledger at once, which keeps the batch.
        self._redis: Any = aioredis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._prefix = f"{prefix}:spend:"
        self._timeout = timeout * 2

    def name(self, tenant: str, counter: str) -> str:
        return f"{self._prefix}{{{tenant}}}:{counter}"

    async def get(self, tenant: str, keys: Sequence[str]) -> list[bytes | None]:
        async with asyncio.timeout(self._timeout):
            values: list[bytes | None] = await self._redis.mget([self.name(tenant, k) for k in keys])
        return values

    async def add_many(self, adds: Sequence[Add]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        for tenant, counter, amount, keep in adds:
            name = self.name(tenant, counter)
            pipe.incrby(name, amount)
            if keep is not None:
                pipe.pexpire(name, int(keep * 1000))
        async with asyncio.timeout(self._timeout):
            await pipe.execute()

    async def close(self) -> None:
        await self._redis.aclose()

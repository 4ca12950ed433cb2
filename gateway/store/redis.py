"""Values in Redis, shared by every worker and replica using the same URL and prefix (see
:mod:`gateway.store`).

Keys are ``{prefix}:{namespace}:{tenant}:{key}`` with the tenant as a hash tag, so one tenant's
keys share a Redis Cluster slot (a multi-key read is one command there too). Every value is
written with its TTL (``SET .. PX``); a touching read is ``GETEX .. PX`` per key in one pipelined
round trip (Redis 6.2 or later). A failed or slow call (over twice ``timeout``) raises
:class:`~gateway.store.base.StoreUnavailableError`; the first failure of an outage and the
recovery are logged once each, without the URL (it may carry a password).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from gateway.store.base import Add, StoreUnavailableError, TenantStore
from gateway.store.redis_client import connect, where

__all__ = ["RedisStore"]

log = logging.getLogger("gateway.store")

T = TypeVar("T")


class RedisStore(TenantStore):
    """A namespace of tenant values in Redis. ``on_error()`` hears every failed call (a metric)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        ttl: float,
        prefix: str = "gateway",
        timeout: float = 0.25,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.ttl = ttl
        self._redis: Any = connect(url, timeout)
        self._prefix = f"{prefix}:{namespace}:"
        self._timeout = timeout
        self._where = where(url)
        self._on_error = on_error
        self.failing = False

    def _key(self, tenant: str, key: str) -> str:
        return f"{self._prefix}{{{tenant}}}:{key}"

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            # socket timeouts bound each I/O step; this bounds the whole call (pool waits included).
            async with asyncio.timeout(self._timeout * 2):
                result = await call()
        except Exception as exc:  # any Redis failure (connection, timeout, server error)
            if self._on_error is not None:
                self._on_error()
            if not self.failing:
                self.failing = True
                log.warning("%s store %s failed (%s)", self.namespace, self._where, type(exc).__name__)
            raise StoreUnavailableError(
                f"The gateway's {self.namespace} store did not answer; retry the request.", retry_after=1.0
            ) from None
        if self.failing:
            self.failing = False
            log.warning("%s store %s is back", self.namespace, self._where)
        return result

    async def put(self, tenant: str, key: str, value: bytes) -> bool:
        await self._call(lambda: self._redis.set(self._key(tenant, key), value, px=self._ttl_ms))
        return True

    async def get(self, tenant: str, keys: Sequence[str], *, touch: bool = False) -> list[bytes | None]:
        if not keys:
            return []
        names = [self._key(tenant, key) for key in keys]
        if not touch:
            values: list[bytes | None] = await self._call(lambda: self._redis.mget(names))
            return values

        async def touched() -> list[bytes | None]:
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.getex(name, px=self._ttl_ms)
            result: list[bytes | None] = await pipe.execute()
            return result

        return await self._call(touched)

    async def delete(self, tenant: str, key: str) -> bool:
        removed: int = await self._call(lambda: self._redis.delete(self._key(tenant, key)))
        return removed > 0

    async def add(self, tenant: str, key: str, amount: int) -> int:
        name = self._key(tenant, key)

        async def added() -> int:
            pipe = self._redis.pipeline(transaction=True)
            pipe.incrby(name, amount)
            pipe.pexpire(name, self._ttl_ms)
            total, _ = await pipe.execute()
            return int(total)

        return await self._call(added)

    async def add_many(self, adds: Sequence[Add]) -> None:
        """One ``MULTI``: ``INCRBY`` (64-bit, exact) and ``PEXPIRE`` (``PERSIST`` for ``inf``) per counter."""
        if not adds:
            return

        async def added() -> None:
            pipe = self._redis.pipeline(transaction=True)
            for tenant, key, amount, ttl in adds:
                name = self._key(tenant, key)
                pipe.incrby(name, amount)
                if ttl == math.inf:
                    pipe.persist(name)
                else:
                    pipe.pexpire(name, max(1, int(ttl * 1000)) if ttl is not None else self._ttl_ms)
            await pipe.execute()

        await self._call(added)

    async def close(self) -> None:
        await self._redis.aclose()

"""One way to open a Redis client for the gateway's shared stores (rate limits, tenant state)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

__all__ = ["connect", "where"]


def connect(url: str, timeout: float) -> Any:
    """An asyncio Redis client for ``url`` whose every I/O step is bounded by ``timeout`` seconds.

    No client-side retries: a failed call reaches the store at once, which decides what an outage
    means (the rate limits degrade to local counters; tenant state answers 503).
    """
    import redis.asyncio as aioredis  # imported only when a Redis store is configured
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def where(url: str) -> str:
    """The store's address for logs, without credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"redis at unix:{parts.path}"
    return f"redis at {parts.hostname or 'localhost'}:{parts.port or 6379}"

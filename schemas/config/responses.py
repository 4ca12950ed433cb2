"""Where the Responses API keeps what ``store: true`` asks to keep (``gateway.responses``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator

from schemas.config.auth import memory_or_redis
from schemas.config.common import _Strict

_MiB = 1024 * 1024
_DAY = 86_400


class ResponsesConfig(_Strict):
    """Stored responses (``store: true``) and the conversations ``previous_response_id`` continues.

    ``memory`` keeps them in the process, bounded by ``max_items``, ``max_bytes`` and ``ttl``
    (least recently used first out); with ``--workers`` N > 1 the processes would not share them,
    so requests that need state are refused by name there. A Redis URL shares them with every
    worker and replica (bounded by ``ttl`` and Redis's own ``maxmemory``).
    """

    # ``memory`` (this process) or a Redis URL (``redis://[:password@]host:port/db``, ``rediss://``,
    # ``unix://``) shared by workers and replicas. A secret: it may carry a password.
    store: SecretStr = SecretStr("memory")
    # Prefix of the Redis keys (deployments sharing one Redis keep their conversations apart).
    store_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = "gateway"
    # Seconds a stored response lives after it was written or last continued.
    ttl: Annotated[float, Field(gt=0, le=365 * _DAY)] = _DAY
    # The memory store's bounds: responses kept, and their bytes (JSON plus bookkeeping).
    max_items: Annotated[int, Field(ge=1, le=100_000_000)] = 10_000
    max_bytes: Annotated[int, Field(ge=64 * 1024, le=1024 * 1024 * _MiB)] = 256 * _MiB
    # Seconds a Redis call may take before the request gets a 503 (no local fallback: it would
    # split conversations between processes).
    redis_timeout: Annotated[float, Field(gt=0, le=60)] = 0.5

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: SecretStr) -> SecretStr:
        return memory_or_redis(value)

    @property
    def store_url(self) -> str | None:
        """The Redis URL, or None for the in-memory store."""
        text = self.store.get_secret_value()
        return None if text == "memory" else text

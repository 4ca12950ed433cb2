"""The :class:`TenantStore` interface (see :mod:`gateway.store`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.errors import ServiceUnavailableError

__all__ = ["ANONYMOUS", "Add", "StoreStats", "StoreUnavailableError", "TenantStore"]

# The one tenant when auth is off (key names start with a letter or digit: never this).
ANONYMOUS = "_"

Add = tuple[str, str, int, float | None]  # tenant, counter, amount, its time to live (None: the store's)


class StoreUnavailableError(ServiceUnavailableError):
    """The shared store did not answer (503, retry later); nothing was decided locally instead."""

    code = "state_store_unavailable"


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What a bounded store holds now, and its bounds (for ``/metrics``)."""

    items: int
    bytes: int
    max_items: int
    max_bytes: int


class TenantStore(ABC):
    """Values and counters under ``(tenant, key)`` in one ``namespace``, each living ``ttl`` seconds
    after its last write or touch. Called from one event loop; every method may raise
    :class:`StoreUnavailableError` (a shared store that failed)."""

    namespace: str
    ttl: float

    @abstractmethod
    async def put(self, tenant: str, key: str, value: bytes) -> bool:
        """Write ``value`` (replacing any), living ``ttl`` from now; False when it alone is over the
        store's byte bound and was not kept."""

    @abstractmethod
    async def get(self, tenant: str, keys: Sequence[str], *, touch: bool = False) -> list[bytes | None]:
        """The values of ``keys`` in order (None: absent, expired or evicted), in one round trip;
        ``touch`` restarts their ``ttl`` (and makes them the most recently used)."""

    @abstractmethod
    async def delete(self, tenant: str, key: str) -> bool:
        """Remove the value; False when there was none."""

    @abstractmethod
    async def add(self, tenant: str, key: str, amount: int) -> int:
        """Add ``amount`` to an integer counter (absent: 0) atomically, restart its ``ttl``; the new total.
        Integers, so sums are exact (spend counts in integer units: ``gateway.spend``)."""

    @abstractmethod
    async def add_many(self, adds: Sequence[Add]) -> None:
        """Several :meth:`add` in one round trip, all or none (a batch that failed can be sent again
        whole). Each names its counter's time to live: None is the store's ``ttl``, ``math.inf`` no
        expiry (a counter of all time)."""

    def stats(self) -> StoreStats | None:
        """Items and bytes held against the bounds; None when the store does not count them (Redis)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; called once at shutdown."""

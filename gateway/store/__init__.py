"""Tenant-scoped state that outlives a request: one small interface, in memory or in Redis.

A :class:`TenantStore` keeps values (bytes) and integer counters under ``(tenant, key)`` in one
namespace (``responses``: stored conversations; ``spend``: each key's spend, ``gateway.spend``).
The tenant is the API key's name (one tenant, ``_``, when auth is off) and is part of every key,
in memory and in Redis, so no call can reach another tenant's values: a value written by one
tenant is simply absent for another.

Each value lives ``ttl`` seconds after its last write or touch. :class:`MemoryStore` (one
process) is also bounded by count and bytes, evicting the least recently written or touched
values first; :class:`RedisStore` (shared by every worker and replica) is bounded by the TTL
and by Redis's own ``maxmemory``. A Redis failure raises :class:`StoreUnavailableError` (503):
there is no local fallback, which would split a tenant's state between processes.
"""

from gateway.store.base import ANONYMOUS, Add, StoreStats, StoreUnavailableError, TenantStore
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore

__all__ = ["ANONYMOUS", "Add", "MemoryStore", "RedisStore", "StoreStats", "StoreUnavailableError", "TenantStore"]

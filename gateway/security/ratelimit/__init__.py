"""Per-key rate limits: token buckets for requests and tokens, and a cap on requests in flight.

Each key with limits has up to three counters:

- a **requests** bucket holding ``rpm`` and refilled at ``rpm`` per minute; a request takes 1;
- a **tokens** bucket holding ``tpm`` and refilled at ``tpm`` per minute; a request reserves
  its worst case (:func:`gateway.security.caps.reserve_tokens`) before the upstream call, and the
  difference to its real usage is given back (or owed) when it ends (:meth:`LimitStore.release`);
- **concurrency**: requests admitted and not yet released, at most ``max_concurrent``.

A request is admitted only if every counter has room; otherwise nothing is taken and the
:class:`Verdict` says which limit refused it and when to retry. Levels may go below zero
when a request used more than it reserved (its prompt was under-estimated): the debt is
repaid by the refill.

Stores: :class:`MemoryStore` (one replica, O(1) per request, not thread-safe: one event
loop) and :class:`RedisStore` (shared by replicas: each decision is one atomic Lua script
on Redis's clock). When Redis fails or is slower than ``redis_timeout`` the Redis store
logs one line, sets ``gateway_ratelimit_store_degraded`` to 1 and decides in a
:class:`MemoryStore` of its own (limits then hold per replica) until a retry, every
``redis_retry_interval`` seconds, finds Redis again. Requests are never failed because
Redis is.
"""

from gateway.security.ratelimit.base import Limits, LimitStore, Reservation, Verdict, format_reset
from gateway.security.ratelimit.memory import MemoryStore
from gateway.security.ratelimit.redis import RedisStore

__all__ = ["LimitStore", "Limits", "MemoryStore", "RedisStore", "Reservation", "Verdict", "format_reset"]

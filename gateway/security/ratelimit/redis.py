"""Counters in Redis, shared by replicas (see :mod:`gateway.security.ratelimit`).

Concurrency slots are leases in a sorted set (lease id -> expiry on Redis's clock). A lease
lives ``lease_seconds`` (30 by default) and the replica holding it renews every lease it holds
every third of that, in one script call per key, while its requests run; so a replica that
dies frees its slots within ``lease_seconds``. A release that fails (Redis restarting, a
timeout) is kept and retried at every renewal tick until Redis takes it; a lease whose release
is still pending is no longer renewed, so it expires on its own if Redis never comes back.
(A retried release settles its tokens again if the first attempt reached Redis after all and
only its answer was lost: a refund given twice, at most one reservation's worth.)

A concurrency refusal's ``retry_after`` tells the truth: when the earliest lease has not been
renewed lately (its holder is gone, or its release is pending), the time until it expires;
otherwise about a second, since live requests end at unknown times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.security.ratelimit.base import Limits, LimitStore, Reservation, Verdict, new_lease
from gateway.security.ratelimit.memory import MemoryStore
from gateway.store.redis_client import connect, where

__all__ = ["RedisStore"]

log = logging.getLogger("gateway.ratelimit")

# --- Redis ----------------------------------------------------------------------------------
# Every script reads the time from Redis itself, so replicas whose clocks differ still share
# one bucket timeline. A bucket is a hash {l: level, t: ms}; a missing one is full. Keys expire
# once their bucket would be full again (or, for leases, after the longest lease).
_LUA_PRELUDE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local function level(key, cap)
  if cap <= 0 then return 0 end
  local v = redis.call('HMGET', key, 'l', 't')
  if not v[1] then return cap end
  local l = tonumber(v[1]) + math.max(0, now - tonumber(v[2])) * cap / 60000
  if l > cap then return cap end
  return l
end
local function save(key, cap, l)
  redis.call('HSET', key, 'l', tostring(l), 't', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((cap - l) * 60000 / cap) + 1000)
end
"""

# KEYS: requests bucket, tokens bucket, leases (sorted set: lease -> expiry ms)
# ARGV: rpm, tpm, max_concurrent (0 = unset), tokens to reserve, lease id, lease ttl ms,
#       stale ms (a lease with less time left than this has missed its renewals)
# -> {verdict (0 ok, 1 requests, 2 tokens, 3 concurrency, 4 too large), wait ms, requests level, tokens level}
_ACQUIRE = (
    _LUA_PRELUDE
    + """
local rpm, tpm, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want, lease, ttl = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local rl, tl = level(KEYS[1], rpm), level(KEYS[2], tpm)
local verdict, wait = 0, 0
if most > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= most then
    verdict, wait = 3, 1000
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    local left = tonumber(first[2]) - now
    if left < tonumber(ARGV[7]) then wait = math.max(left, 0) end
  end
end
if verdict == 0 and rpm > 0 and rl < 1 then verdict, wait = 1, (1 - rl) * 60000 / rpm end
if verdict == 0 and tpm > 0 then
  if want > tpm then verdict = 4
  elseif tl < want then verdict, wait = 2, (want - tl) * 60000 / tpm end
end
if verdict == 0 then
  if rpm > 0 then rl = rl - 1; save(KEYS[1], rpm, rl) end
  if tpm > 0 then tl = tl - want; save(KEYS[2], tpm, tl) end
  if most > 0 then
    redis.call('ZADD', KEYS[3], now + ttl, lease)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
end
return {verdict, tostring(wait), tostring(rl), tostring(tl)}
"""
)

# KEYS: tokens bucket, leases.  ARGV: tpm (0 = unset), tokens given back (negative: owed), lease id
_RELEASE = (
    _LUA_PRELUDE
    + """
local tpm, back = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and back ~= 0 then
  local l = level(KEYS[1], tpm) + back
  if l > tpm then l = tpm end
  save(KEYS[1], tpm, l)
end
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[2], ARGV[3]) end
return 1
"""
)

# KEYS: leases.  ARGV: lease ttl ms, then the lease ids this replica holds.  Extends only leases
# still present (ZADD XX): one released or expired meanwhile is not brought back.
_RENEW = (
    _LUA_PRELUDE
    + """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i]) end
if redis.call('ZCARD', KEYS[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""
)

# KEYS: requests bucket, tokens bucket.  ARGV: rpm, tpm.  Reads only.
_PEEK = (
    _LUA_PRELUDE
    + """
return {tostring(level(KEYS[1], tonumber(ARGV[1]))), tostring(level(KEYS[2], tonumber(ARGV[2])))}
"""
)

_REASONS = {1: "requests", 2: "tokens", 3: "concurrency", 4: "too_large"}
_MAX_UNRELEASED = 10_000  # pending releases kept through an outage (beyond: the oldest leases just expire)


class RedisStore(LimitStore):
    """Counters in Redis, shared by every replica using the same ``url`` and ``prefix``.

    ``on_degraded(bool)`` is told when the store starts and stops deciding locally;
    ``on_error()`` is told of every failed Redis call (both feed metrics).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gateway",
        timeout: float = 0.25,
        retry_interval: float = 5.0,
        lease_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_degraded: Callable[[bool], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        # No client-side retries: a failed call degrades at once instead of stalling requests.
        self._redis: Any = connect(url, timeout)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)
        self._peek = self._redis.register_script(_PEEK)
        self._renew = self._redis.register_script(_RENEW)
        self._prefix = prefix
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._lease_ms = max(1, int(lease_seconds * 1000))
        self._renew_every = lease_seconds / 3
        # A live lease has at least ttl - renew_every left (plus call latency); half the ttl is
        # the line below which it has surely missed a renewal.
        self._stale_ms = self._lease_ms // 2
        self._held: dict[str, set[str]] = {}  # leases key -> lease ids this replica holds
        self._unreleased: list[tuple[list[str], list[Any]]] = []  # releases Redis did not take yet
        self._renewer: asyncio.Task[None] | None = None
        self._clock = clock
        self._where = where(url)
        self._on_degraded = on_degraded
        self._on_error = on_error
        self.fallback = MemoryStore(clock)
        self.degraded = False
        self._retry_at = 0.0
        self._pending: set[asyncio.Task[None]] = set()

    def _keys(self, key: str) -> tuple[str, str, str]:
        # {key} is a hash tag: the three keys of one API key share a Redis Cluster slot.
        base = f"{self._prefix}:rl:{{{key}}}"
        return f"{base}:req", f"{base}:tok", f"{base}:conc"

    def _use_redis(self) -> bool:
        return not self.degraded or self._clock() >= self._retry_at

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        # socket timeouts bound each I/O step; this bounds the whole call (pool waits included).
        async with asyncio.timeout(self._timeout * 2):
            return await script(keys=keys, args=args)

    def _failed(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error()
        self._retry_at = self._clock() + self._retry_interval
        if not self.degraded:
            self.degraded = True
            # Type only: redis-py messages carry no secret, but the URL's password must never be
            # one step away from a log line.
            log.warning(
                "rate-limit store %s failed (%s); enforcing limits per replica until it is back",
                self._where,
                type(exc).__name__,
            )
            if self._on_degraded is not None:
                self._on_degraded(True)

    def _succeeded(self) -> None:
        if self.degraded:
            self.degraded = False
            log.warning("rate-limit store %s is back; limits are shared across replicas again", self._where)
            if self._on_degraded is not None:
                self._on_degraded(False)

    async def acquire(self, key: str, limits: Limits, tokens: int) -> tuple[Verdict, Reservation | None]:
        if not self._use_redis():
            return self.fallback.decide(key, limits, tokens)
        lease = new_lease()
        args = [
            limits.rpm or 0, limits.tpm or 0, limits.max_concurrent or 0, tokens, lease, self._lease_ms, self._stale_ms
        ]  # fmt: skip
        try:
            raw = await self._call(self._acquire, list(self._keys(key)), args)
        except Exception as exc:  # any Redis failure (connection, timeout, script) degrades
            self._failed(exc)
            return self.fallback.decide(key, limits, tokens)
        self._succeeded()
        code, wait_ms, requests, budget = int(raw[0]), float(raw[1]), float(raw[2]), float(raw[3])
        if code:
            wait = wait_ms / 1000 if code != 4 else None
            return Verdict(False, requests, budget, _REASONS[code], wait), None
        if limits.max_concurrent:
            self._held.setdefault(self._keys(key)[2], set()).add(lease)
            self._start_renewing()
        return Verdict(True, requests, budget), Reservation(self, key, limits, tokens, lease)

    def release(self, reservation: Reservation, used: int | None) -> None:
        back = 0 if used is None else reservation.tokens - used
        keys = self._keys(reservation.key)
        args = [reservation.limits.tpm or 0, back, reservation.lease if reservation.limits.max_concurrent else ""]
        if args[2]:
            held = self._held.get(keys[2])
            if held is not None:
                held.discard(reservation.lease)  # no longer renewed, whatever becomes of the release
                if not held:
                    del self._held[keys[2]]
        if not back and not args[2]:
            return
        task = asyncio.get_running_loop().create_task(self._release_later([keys[1], keys[2]], args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release_later(self, keys: list[str], args: list[Any]) -> None:
        try:
            await self._call(self._release, keys, args)
        except Exception as exc:  # kept for the renewer to retry; the lease expires on its own anyway
            self._failed(exc)
            if len(self._unreleased) >= _MAX_UNRELEASED:
                self._unreleased.pop(0)
            self._unreleased.append((keys, args))

    def _start_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Every third of the lease: retry pending releases, then extend every lease still held."""
        while self._held or self._unreleased:
            await asyncio.sleep(self._renew_every)
            await self.renew_now()

    async def renew_now(self) -> None:
        """One renewal tick (the renewer's; tests call it to skip the wait).

        Tried at every tick even while degraded: the retry interval paces the request path, and
        a tick skipped for it (one slow Redis answer, with leases shorter than three retry
        intervals) would let the leases of live requests expire and their slots be given away.
        """
        try:
            while self._unreleased:
                keys, args = self._unreleased[0]
                await self._call(self._release, keys, args)
                self._unreleased.pop(0)
            for key, leases in list(self._held.items()):
                if leases:
                    await self._call(self._renew, [key], [self._lease_ms, *leases])
        except Exception as exc:  # Redis still away: the next tick tries again
            self._failed(exc)
        else:
            self._succeeded()

    async def peek(self, key: str, limits: Limits) -> Verdict:
        if not self._use_redis():
            return self.fallback.levels(key, limits)
        keys = self._keys(key)
        try:
            raw = await self._call(self._peek, [keys[0], keys[1]], [limits.rpm or 0, limits.tpm or 0])
        except Exception as exc:
            self._failed(exc)
            return self.fallback.levels(key, limits)
        self._succeeded()
        return Verdict(True, float(raw[0]), float(raw[1]))

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=self._timeout * 4)
        await self._redis.aclose()

"""Values in this process, bounded by count, bytes and age (see :mod:`gateway.store`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from gateway.store.base import Add, StoreStats, TenantStore

__all__ = ["ENTRY_OVERHEAD", "MemoryStore"]

# Bytes an entry costs beyond its value and key strings (the dict slot, the key tuple, the entry
# tuple): counted against ``max_bytes`` so the bound is near what the process really holds.
ENTRY_OVERHEAD = 200

_Key = tuple[str, str]  # (tenant, key)
# (value, expires, size), replaced whole on a touch or an add, never changed in place. A plain
# tuple of a bytes, a float and an int, keyed by a tuple of two strings: CPython's collector stops
# tracking both at its first pass over them, so a full store (10,000 turns by default) adds nothing
# to what every later collection walks (an object with slots stays tracked for its whole life).
_Entry = tuple[bytes, float, int]


class MemoryStore(TenantStore):
    """One process's values, least recently written or touched first.

    Bounds: at most ``max_items`` values and ``max_bytes`` bytes (values, keys and
    :data:`ENTRY_OVERHEAD` each); beyond either, the oldest are evicted. A value lives ``ttl``
    seconds after its last write or touch; expired ones are dropped when met and from the front
    at each write and each :meth:`stats`. ``on_evict(reason, count)`` hears every eviction:
    ``expired``, ``items``, ``bytes``, or ``too_large`` (a value over ``max_bytes`` on its own,
    never kept). Not thread-safe: one event loop; ``clock`` returns seconds (monotonic).

    ``ahead``: a write that passes a bound evicts that many 64ths of it more (oldest first), so the
    next writes have room (a full store of conversations does not evict, and report, on each one):
    between ``max_items`` less ``max_items * ahead // 64`` and ``max_items`` values are kept, and the
    same for bytes. 0 (the default): exactly down to the bound (a store of counters, whose eviction
    forgets a count).
    """

    def __init__(
        self,
        namespace: str,
        *,
        ttl: float,
        max_items: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[str, int], None] | None = None,
        ahead: int = 0,
    ) -> None:
        self.namespace = namespace
        self.ahead = ahead
        self.ttl = ttl
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._clock = clock
        self._on_evict = on_evict
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        # The oldest value's expiry when last looked at; 0.0 once it may have changed (a value
        # dropped, touched or rewritten, new bounds): a write compares its clock with this float
        # rather than look at the oldest value (an iterator and a lookup on every stored turn).
        self._oldest_expires = 0.0

    def configure(self, *, ttl: float, max_items: int, max_bytes: int) -> None:
        """New bounds (a config reload); values over them are evicted now, oldest first."""
        self.ttl, self.max_items, self.max_bytes = ttl, max_items, max_bytes
        self._oldest_expires = 0.0
        self._sweep(self._clock())
        self._enforce()

    # --- the interface -----------------------------------------------------------------------
    async def put(self, tenant: str, key: str, value: bytes) -> bool:
        return self.put_now(tenant, key, value)

    def put_now(self, tenant: str, key: str, value: bytes) -> bool:
        """:meth:`put` without awaiting (callers already in the loop with nothing to wait for)."""
        now = self._clock()
        if now >= self._oldest_expires:
            self._sweep(now)
        entries = self._entries
        slot = (tenant, key)
        if slot in entries:  # a rewrite (rare: a stored turn's id is new), counted anew at the end
            self._bytes -= entries.pop(slot)[2]
            self._oldest_expires = 0.0
        size = len(value) + len(tenant) + len(key) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            self._evicted("too_large", 1)
            return False
        entries[slot] = (value, now + self.ttl, size)
        self._bytes += size
        if len(entries) > self.max_items or self._bytes > self.max_bytes:
            self._enforce()
        return True

    async def get(self, tenant: str, keys: Sequence[str], *, touch: bool = False) -> list[bytes | None]:
        return self.get_now(tenant, keys, touch=touch)

    def get_now(self, tenant: str, keys: Sequence[str], *, touch: bool = False) -> list[bytes | None]:
        """:meth:`get` without awaiting."""
        now = self._clock()
        entries = self._entries
        # No call per key (a continuation reads its whole conversation here, a key per turn): the
        # entry found by 'in' and subscript, a touched one moved to the end by deleting and adding
        # it again (what move_to_end does), the answer's slots filled in place (not appended).
        out: list[bytes | None] = [None] * len(keys)
        for at, key in enumerate(keys):
            slot = (tenant, key)
            if slot not in entries:
                continue
            entry = entries[slot]
            if entry[1] <= now:
                self._drop(slot, entry)
                self._evicted("expired", 1)
                continue
            if touch:
                del entries[slot]
                entries[slot] = (entry[0], now + self.ttl, entry[2])
                self._oldest_expires = 0.0
            out[at] = entry[0]
        return out

    async def delete(self, tenant: str, key: str) -> bool:
        slot = (tenant, key)
        entry = self._entries.get(slot)
        if entry is None:
            return False
        self._drop(slot, entry)
        return entry[1] > self._clock()  # an expired value was already gone

    async def add(self, tenant: str, key: str, amount: int) -> int:
        return self.add_now(tenant, key, amount)

    async def add_many(self, adds: Sequence[Add]) -> None:
        for tenant, key, amount, ttl in adds:
            self.add_now(tenant, key, amount, ttl)

    def add_now(self, tenant: str, key: str, amount: int, ttl: float | None = None) -> int:
        """:meth:`add` without awaiting; ``ttl`` as in :meth:`add_many`."""
        slot = (tenant, key)
        entry = self._entries.get(slot)
        now = self._clock()
        if entry is not None and entry[1] > now:
            # A live counter is rewritten where it is (what a write does: newest, its time to live
            # anew), without the sweep and the bounds of a put: the spend ledger adds to three
            # counters on every request.
            old = entry[0]
            total = int(old) + amount
            value = str(total).encode()
            grown = len(value) - len(old)
            self._entries[slot] = (value, now + (self.ttl if ttl is None else ttl), entry[2] + grown)
            self._entries.move_to_end(slot)
            self._oldest_expires = 0.0
            if grown:
                self._bytes += grown
                self._enforce()
            return total
        (current,) = self.get_now(tenant, [key])
        total = (int(current) if current is not None else 0) + amount
        if self.put_now(tenant, key, str(total).encode()) and ttl is not None:
            slot = (tenant, key)
            value, _, size = self._entries[slot]
            self._entries[slot] = (value, self._clock() + ttl, size)  # inf: never
        return total

    def stats(self) -> StoreStats:
        self._sweep(self._clock())
        return StoreStats(len(self._entries), self._bytes, self.max_items, self.max_bytes)

    # --- bounds ------------------------------------------------------------------------------
    def _drop(self, slot: _Key, entry: _Entry) -> None:
        del self._entries[slot]
        self._bytes -= entry[2]
        self._oldest_expires = 0.0

    def _sweep(self, now: float) -> None:
        """Drop the expired values at the front (values share one ttl, so the front expires first;
        a counter added with a ttl of its own stops the sweep while it lives, and what expired
        behind it is dropped when met or evicted as the oldest)."""
        entries = self._entries
        dropped = 0
        while entries:
            slot, entry = next(iter(entries.items()))
            if entry[1] > now:
                self._oldest_expires = entry[1]
                break
            self._drop(slot, entry)
            dropped += 1
        if dropped:
            self._evicted("expired", dropped)

    def _enforce(self) -> None:
        entries = self._entries
        dropped = 0
        if len(entries) > self.max_items:
            keep = self.max_items - self.max_items * self.ahead // 64  # (ahead: room for the next writes)
            while len(entries) > keep:
                self._bytes -= entries.popitem(last=False)[1][2]
                dropped += 1
        if dropped and self._on_evict is not None:  # (_evicted, inline: a full store evicts on every write)
            self._on_evict("items", dropped)
        evicted, dropped = dropped, 0
        if self._bytes > self.max_bytes:
            keep = self.max_bytes - self.max_bytes * self.ahead // 64
            while self._bytes > keep and entries:
                self._bytes -= entries.popitem(last=False)[1][2]
                dropped += 1
        if dropped:
            self._evicted("bytes", dropped)
        if evicted or dropped:  # a new oldest value: its expiry, read now (a full store evicts on every write)
            self._oldest_expires = 0.0
            for oldest in entries:
                self._oldest_expires = entries[oldest][1]
                break

    def _evicted(self, reason: str, count: int) -> None:
        if self._on_evict is not None:
            self._on_evict(reason, count)

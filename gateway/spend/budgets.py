"""Each key's spend per day, month and in total, and its budget (``auth.keys[].budget``).

The :class:`SpendLedger` keeps, per key (the tenant), an integer counter per period in the
``spend`` namespace of a :class:`~gateway.store.TenantStore`: ``day:2026-12-01``, ``month:2026-12``
and ``total``; days and months are UTC, and a new period is simply a new counter. Amounts are
integers in :data:`gateway.spend.prices.UNIT`.

- :meth:`SpendLedger.check` (one store read, only for a key with a budget) refuses a key whose
  counter for its budget's period has reached the budget: 429
  :class:`~schemas.errors.BudgetExceededError` naming the budget, what was spent and when the
  period restarts (``Retry-After``), before anything is reserved or any upstream called.
- :meth:`SpendLedger.charge` adds a closed request's cost (:class:`gateway.accounting.RequestRecord`)
  and never blocks the request. In memory it is three counter adds. A shared store (Redis) gets
  the charges of about :data:`FLUSH_EVERY` seconds in one round trip from a background task: the
  figures other workers and replicas read lag by that much, and this process counts what it has
  not sent yet. What the store did not take (Redis away) is kept and sent again, so an outage
  delays spend, never loses it; during it :meth:`check` lets requests through (counted in
  ``gateway_spend_store_errors_total``), as the rate limits do.

A budget bounds what a key starts, not what is in flight: requests admitted while the key was
under its budget finish and are charged, so the spend may end above the budget by what they cost.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.spend.prices import money_text, units
from gateway.store import MemoryStore, RedisStore, TenantStore
from schemas.config import BudgetConfig
from schemas.errors import BudgetExceededError

__all__ = [
    "FLUSH_EVERY",
    "NAMESPACE",
    "PERIODS",
    "Budget",
    "SpendLedger",
    "memory_spend_store",
    "period_of",
    "shared_spend_store",
]

log = logging.getLogger("gateway.spend")

NAMESPACE = "spend"
PERIODS = ("day", "month", "total")
FLUSH_EVERY = 0.5  # seconds between the batches a shared store gets
# How long a period's counter outlives its last charge: a day's three days, a month's 62, the total for ever.
_KEEP = {"day": 3 * 86400.0, "month": 62 * 86400.0, "total": math.inf}
_KEEP_DAY, _KEEP_MONTH = _KEEP["day"], _KEEP["month"]


def memory_spend_store(keys: int) -> MemoryStore:
    """The in-process spend store: room for every key's counters of many periods (the oldest periods
    are the least recently used, so they go first if it ever fills)."""
    items = 1024 + 128 * keys
    return MemoryStore(NAMESPACE, ttl=_KEEP["month"], max_items=items, max_bytes=items * 512)


def shared_spend_store(url: str, *, prefix: str, timeout: float) -> RedisStore:
    """The spend store in Redis: keys ``<prefix>:spend:{<key name>}:<counter>``, exact integers (INCRBY).
    Its failures are the ledger's to count (``on_error``), once."""
    return RedisStore(url, NAMESPACE, ttl=_KEEP["month"], prefix=prefix, timeout=timeout)


@dataclass(frozen=True, slots=True)
class Budget:
    """One key's budget: ``amount`` in :data:`~gateway.spend.prices.UNIT` per ``period``."""

    amount: int
    period: str  # day, month, total

    @classmethod
    def of(cls, config: BudgetConfig) -> Budget:
        return cls(units(config.amount, 12), config.period)

    def describe(self) -> str:
        per = {"day": " per day (UTC)", "month": " per month (UTC)"}.get(self.period, " in total")
        return f"{money_text(self.amount)}{per}"


def period_of(period: str, now: float) -> tuple[str, float | None]:
    """The counter of ``period`` at ``now`` (epoch seconds) and when the period ends (None: never)."""
    if period == "total":
        return "total", None
    day = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = calendar.timegm((day.year, day.month, day.day, 0, 0, 0))
        return f"day:{day:%Y-%m-%d}", float(start + 86400)
    year, month = (day.year + 1, 1) if day.month == 12 else (day.year, day.month + 1)
    return f"month:{day:%Y-%m}", float(calendar.timegm((year, month, 1, 0, 0, 0)))


def _at(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SpendLedger:
    """Every key's spend and the budgets of those that have one (module docstring: how).

    ``clock`` gives epoch seconds (periods are calendar days and months); ``on_error`` hears every
    failed store call (a metric). One event loop. A reload builds a new ledger over the same
    in-memory counters (``gateway.security.guard``); a shared store needs nothing carried over.
    """

    def __init__(
        self,
        budgets: dict[str, Budget],
        counters: TenantStore,
        *,
        clock: Callable[[], float] = time.time,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.budgets = budgets
        self.counters = counters
        self._clock = clock
        self._on_error = on_error
        # In memory a charge is added at once; a shared store gets batches (FLUSH_EVERY).
        self._add_now: Callable[[str, str, int, float | None], int] | None = (
            counters.add_now if isinstance(counters, MemoryStore) else None
        )
        self._owed: dict[tuple[str, str], int] = {}  # charged here, not yet in the shared store
        # The counters of "now" (day, month, total) and their ends, valid from _since until _until (the
        # next UTC midnight): computed once a day, not three calendar conversions per request.
        self._since = self._until = 0.0
        self._counters: tuple[str, str, str] = ("", "", "")
        self._ends: dict[str, float | None] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._failing = False

    # --- the request path --------------------------------------------------------------------
    async def check(self, key: str) -> None:
        """Raise :class:`BudgetExceededError` (429) when ``key`` has spent its budget; a store that is
        away lets the request through (the error is counted, and logged once per outage)."""
        budget = self.budgets.get(key)
        if budget is None:
            return
        now = self._clock()
        counters = self._counters if self._since <= now < self._until else self._periods(now)
        period = counters[0] if budget.period == "day" else counters[1] if budget.period == "month" else "total"
        ends = self._ends[budget.period]
        try:
            (spent,) = await self._spent(key, [period])
        except Exception as exc:  # the store is away: budgets hold again once it is back
            self._failed(exc)
            return
        self._back()
        if spent < budget.amount:
            return
        when = f"It restarts at {_at(ends)}." if ends is not None else "It does not restart (a total budget)."
        raise BudgetExceededError(
            f"Budget exceeded for key '{key}': spent {money_text(spent)} of its budget of {budget.describe()}. {when}",
            retry_after=max(1.0, ends - now) if ends is not None else None,
            type="insufficient_quota",
        )

    def charge(self, key: str, amount: int) -> None:
        """Add ``amount`` to ``key``'s day, month and total; never raises, never waits."""
        if amount <= 0:
            return
        now = self._clock()
        day, month, total = self._counters if self._since <= now < self._until else self._periods(now)
        add_now = self._add_now
        if add_now is not None:
            add_now(key, day, amount, _KEEP_DAY)
            add_now(key, month, amount, _KEEP_MONTH)
            add_now(key, total, amount, math.inf)  # the total never expires
            return
        owed = self._owed
        for counter in (day, month, total):
            owed[(key, counter)] = owed.get((key, counter), 0) + amount
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    def _periods(self, now: float) -> tuple[str, str, str]:
        """The counters of ``now`` (cached until the next UTC midnight, where a day, maybe a month, ends)."""
        (day, day_ends), (month, month_ends) = period_of("day", now), period_of("month", now)
        assert day_ends is not None
        self._counters = (day, month, "total")
        self._ends = {"day": day_ends, "month": month_ends, "total": None}
        self._since, self._until = day_ends - 86400.0, day_ends
        return self._counters

    # --- the shared store --------------------------------------------------------------------
    async def _spent(self, key: str, counters: Sequence[str]) -> list[int]:
        """``key``'s counters: the store's figure plus what this process has not sent yet."""
        values = await self.counters.get(key, counters)
        owed = self._owed
        return [(int(v) if v is not None else 0) + owed.get((key, c), 0) for c, v in zip(counters, values, strict=True)]

    async def _flush_soon(self) -> None:
        while self._owed:
            await asyncio.sleep(FLUSH_EVERY)
            await self.flush()

    async def flush(self) -> bool:
        """Send what was charged here to the store in one round trip; True when it took it."""
        if not self._owed:
            return True
        batch, self._owed = self._owed, {}
        adds = [(key, counter, amount, _KEEP[counter.partition(":")[0]]) for (key, counter), amount in batch.items()]
        try:
            await self.counters.add_many(adds)
        except Exception as exc:  # kept, and sent again with the next batch
            self._failed(exc)
            for slot, amount in batch.items():
                self._owed[slot] = self._owed.get(slot, 0) + amount
            return False
        self._back()
        return True

    def _failed(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error()
        if not self._failing:
            self._failing = True
            log.warning("spend store failed (%s): budgets are not enforced until it is back", type(exc).__name__)

    def _back(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("spend store is back: budgets are enforced again")

    # --- operators -----------------------------------------------------------------------------
    async def usage(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """Each key's spend today, this month and in total, and its budget (null when it has none)."""
        now = self._clock()
        counters = [period_of(p, now)[0] for p in PERIODS]
        out: list[dict[str, Any]] = []
        for key in keys:
            day, month, total = await self._spent(key, counters)
            entry: dict[str, Any] = {
                "key": key,
                "spent": {"day": money_text(day), "month": money_text(month), "total": money_text(total)},
                "budget": None,
            }
            budget = self.budgets.get(key)
            if budget is not None:
                spent = {"day": day, "month": month, "total": total}[budget.period]
                ends = period_of(budget.period, now)[1]
                entry["budget"] = {
                    "amount": money_text(budget.amount),
                    "period": budget.period,
                    "remaining": money_text(max(0, budget.amount - spent)),
                    "exceeded": spent >= budget.amount,
                    "resets_at": _at(ends) if ends is not None else None,
                }
            out.append(entry)
        return out

    async def close(self) -> None:
        """Send what is still owed (at most a second's wait); called once at shutdown."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        if self._owed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self.flush()
        if self._add_now is None:  # a shared store's connections (the in-memory one outlives a reload)
            await self.counters.close()

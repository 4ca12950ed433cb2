"""The in-memory tenant store: tenants apart, bounds by count, bytes and age (least recently used
out first), every eviction heard with its reason, counters."""

from __future__ import annotations

import gc
import math

import pytest

from gateway.store import MemoryStore, StoreStats
from gateway.store.memory import ENTRY_OVERHEAD


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(clock: Clock, evictions: list[tuple[str, int]], **bounds: int) -> MemoryStore:
    options = {"ttl": 60.0, "max_items": 1000, "max_bytes": 1 << 20, **bounds}
    return MemoryStore(
        "t",
        clock=clock,
        on_evict=lambda reason, n: evictions.append((reason, n)),
        **options,  # type: ignore[arg-type]
    )


async def test_a_tenant_never_reads_or_deletes_another_tenants_value() -> None:
    store = make(Clock(), [])
    await store.put("team-a", "resp_1", b"secret")
    assert await store.get("team-a", ["resp_1"]) == [b"secret"]
    assert await store.get("team-b", ["resp_1"]) == [None]
    assert not await store.delete("team-b", "resp_1")
    assert await store.get("team-a", ["resp_1"]) == [b"secret"]
    assert await store.delete("team-a", "resp_1")
    assert await store.get("team-a", ["resp_1"]) == [None]


async def test_count_bound_evicts_the_least_recently_used_first() -> None:
    evictions: list[tuple[str, int]] = []
    store = make(Clock(), evictions, max_items=3)
    for i in range(3):
        await store.put("a", f"k{i}", b"v")
    await store.get("a", ["k0"], touch=True)  # k0 is now the most recently used
    await store.put("a", "k3", b"v")
    assert await store.get("a", ["k0", "k1", "k2", "k3"]) == [b"v", None, b"v", b"v"]
    assert evictions == [("items", 1)]
    assert store.stats().items == 3


async def test_byte_bound_counts_values_keys_and_bookkeeping() -> None:
    evictions: list[tuple[str, int]] = []
    one = 100 + len("a") + len("k0") + ENTRY_OVERHEAD
    store = make(Clock(), evictions, max_bytes=3 * one + 60)
    for i in range(3):
        await store.put("a", f"k{i}", b"x" * 100)
    assert store.stats() == StoreStats(3, 3 * one, 1000, 3 * one + 60)
    await store.put("a", "k3", b"x" * 150)  # 50 more bytes: the oldest one must go
    assert await store.get("a", ["k0", "k1"]) == [None, b"x" * 100]
    assert evictions == [("bytes", 1)]
    assert store.stats().bytes == 3 * one + 50


async def test_a_value_over_the_byte_bound_is_never_kept_and_said_so() -> None:
    evictions: list[tuple[str, int]] = []
    store = make(Clock(), evictions, max_bytes=64 * 1024)
    await store.put("a", "small", b"v")
    assert not await store.put("a", "big", b"x" * (64 * 1024))
    assert await store.get("a", ["big", "small"]) == [None, b"v"]
    assert evictions == [("too_large", 1)]


async def test_a_value_lives_ttl_after_its_last_write_or_touch() -> None:
    clock, evictions = Clock(), []  # type: ignore[var-annotated]
    store = make(clock, evictions)
    await store.put("a", "old", b"1")
    await store.put("a", "kept", b"2")
    clock.t += 50
    assert await store.get("a", ["kept"], touch=True) == [b"2"]
    assert await store.get("a", ["old"]) == [b"1"]  # a plain read does not extend it
    clock.t += 11
    assert await store.get("a", ["old", "kept"]) == [None, b"2"]
    assert evictions == [("expired", 1)]
    clock.t += 50
    assert store.stats().items == 0  # swept at a scrape, not only when read
    assert evictions == [("expired", 1), ("expired", 1)]
    assert not await store.delete("a", "kept")


@pytest.mark.parametrize("change", ["touch", "rewrite", "delete", "evict", "add"])
async def test_a_write_sweeps_whatever_value_became_the_oldest(change: str) -> None:
    """A write drops the expired values at the front, however the front changed since the last
    write looked at it (a write keeps the oldest value's expiry rather than read it each time)."""
    clock, evictions = Clock(), []  # type: ignore[var-annotated]
    store = make(clock, evictions, max_items=3)
    await store.put("a", "first", b"1")  # expires at 160
    await store.add_many([("a", "short", 1, 10.0)])  # expires at 110, behind "first"
    await store.put("a", "seen", b"2")  # looks at the front: "first", 160
    if change == "touch":
        await store.get("a", ["first"], touch=True)
    elif change == "rewrite":
        await store.put("a", "first", b"3")
    elif change == "delete":
        await store.delete("a", "first")
    elif change == "evict":
        await store.put("a", "fourth", b"4")  # over max_items: "first" goes
    else:
        store.add_now("a", "first", 1)  # b"1" read as a counter: rewritten where it is, moved to the end
    clock.t += 11  # "short" (now the oldest) expired; "first" has not
    await store.put("a", "last", b"5")
    assert ("expired", 1) in evictions
    assert store.stats().items == (3 if change != "delete" else 2)


async def test_rewriting_a_value_replaces_its_bytes() -> None:
    store = make(Clock(), [])
    await store.put("a", "k", b"x" * 500)
    await store.put("a", "k", b"y")
    assert store.stats().bytes == 1 + 1 + 1 + ENTRY_OVERHEAD
    assert store.stats().items == 1


async def test_new_bounds_apply_at_once_oldest_out() -> None:
    evictions: list[tuple[str, int]] = []
    store = make(Clock(), evictions)
    for i in range(5):
        await store.put("a", f"k{i}", b"v")
    store.configure(ttl=60.0, max_items=2, max_bytes=1 << 20)
    assert await store.get("a", [f"k{i}" for i in range(5)]) == [None, None, None, b"v", b"v"]
    assert evictions == [("items", 3)]


async def test_counters_add_per_tenant() -> None:
    clock = Clock()
    store = make(clock, [])
    assert await store.add("a", "spend", 15) == 15
    assert await store.add("a", "spend", 2**62) == 2**62 + 15  # integers: exact at any size
    assert await store.add("b", "spend", 1) == 1
    clock.t += 61
    assert await store.add("a", "spend", 1) == 1  # the window's counter expired


async def test_a_batch_of_counters_each_with_its_own_ttl() -> None:
    clock = Clock()
    store = make(clock, [])
    await store.add_many([("a", "day", 3, 10.0), ("a", "total", 3, math.inf), ("b", "day", 4, None)])
    await store.add_many([("a", "day", 2, 10.0), ("a", "total", 2, math.inf)])
    assert await store.get("a", ["day", "total"]) == [b"5", b"5"]
    clock.t += 11  # a's day counter is gone; b's lives the store's 60 s
    assert await store.get("a", ["day", "total"]) == [None, b"5"]
    assert await store.get("b", ["day"]) == [b"4"]
    clock.t += 10**6
    assert await store.get("a", ["total"]) == [b"5"]  # no expiry


async def test_a_counter_added_to_is_a_write() -> None:
    """Adding to a live counter (updated in place) counts its bytes anew, makes it the newest and
    renews its time to live, as a write does."""
    clock = Clock()
    evictions: list[tuple[str, int]] = []
    store = make(clock, evictions, max_items=2)
    store.add_now("a", "c", 9)
    await store.put("a", "v", b"x")
    before = store.stats().bytes
    clock.t += 50
    assert store.add_now("a", "c", 1) == 10  # b"9" -> b"10": one byte more
    assert store.stats().bytes == before + 1
    await store.put("a", "w", b"y")  # over max_items: the oldest goes, now v, not the counter
    assert evictions == [("items", 1)]
    assert await store.get("a", ["c", "v"]) == [b"10", None]
    clock.t += 59  # 109 s after the counter was made, 59 after its last add: alive
    assert await store.get("a", ["c"]) == [b"10"]
    store.add_now("a", "c", 1, math.inf)
    clock.t += 10**6
    assert await store.get("a", ["c"]) == [b"11"]


@pytest.mark.parametrize("touch", [False, True])
async def test_reads_of_missing_keys_are_none_in_order(touch: bool) -> None:
    store = make(Clock(), [])
    await store.put("a", "b", b"2")
    assert await store.get("a", ["x", "b", "y"], touch=touch) == [None, b"2", None]
    assert await store.get("a", []) == []


async def test_stored_entries_add_nothing_for_the_collector_to_walk() -> None:
    """Written, touched and counted entries and their keys are untracked after the collector's first
    pass: a full store (10,000 turns by default) costs no later collection a walk over them."""
    clock = Clock()
    store = make(clock, [], max_items=5000)
    gc.collect()
    tracked = len(gc.get_objects())
    for i in range(2000):
        store.put_now("team-a", f"resp_{i}", b"turn %d" % i)
    store.get_now("team-a", ["resp_1", "resp_2"], touch=True)
    store.add_now("team-a", "spend", 5)
    store.add_now("team-a", "spend", 7)  # a live counter, rewritten
    store.add_now("team-b", "day", 1, math.inf)
    gc.collect()
    assert len(gc.get_objects()) - tracked < 100  # was one tracked object per entry (2,000 and more)
    entries = store._entries
    for key in [("team-a", "resp_0"), ("team-a", "resp_1"), ("team-a", "spend"), ("team-b", "day")]:
        stored_key = next(k for k in entries if k == key)
        assert not gc.is_tracked(stored_key), key
        assert not gc.is_tracked(entries[key]), key
    assert store.get_now("team-a", ["resp_1", "spend", "resp_1999"]) == [b"turn 1", b"12", b"turn 1999"]


@pytest.mark.parametrize("bound", ["items", "bytes"])
async def test_a_store_that_evicts_ahead_makes_room_for_the_next_writes(bound: str) -> None:
    """``ahead``: a write past a bound evicts that many 64ths of it more, oldest first, heard once;
    the next writes evict nothing until the bound is passed again, and the bound always holds."""
    evictions: list[tuple[str, int]] = []
    one = 1 + len("a") + len("k000") + ENTRY_OVERHEAD
    bounds = {"max_items": 128} if bound == "items" else {"max_bytes": 128 * one}
    store = MemoryStore("t", ttl=60.0, clock=Clock(), on_evict=lambda r, n: evictions.append((r, n)), ahead=1,
                        **{"max_items": 1000, "max_bytes": 1 << 20, **bounds})  # fmt: skip
    for i in range(128):
        await store.put("a", f"k{i:03}", b"v")
    assert evictions == [] and store.stats().items == 128
    await store.put("a", "k128", b"v")  # past the bound: down to 128 - 128 // 64 = 126
    assert evictions == [(bound, 3)]
    assert await store.get("a", ["k000", "k001", "k002", "k003"]) == [None, None, None, b"v"]
    for i in range(129, 131):  # room for two
        await store.put("a", f"k{i:03}", b"v")
        assert store.stats().items <= 128
    assert evictions == [(bound, 3)] and store.stats().items == 128
    await store.put("a", "k131", b"v")
    assert evictions == [(bound, 3), (bound, 3)] and store.stats().items == 126
    assert await store.get("a", ["k005", "k006"]) == [None, b"v"]  # still the oldest first


def test_the_conversation_store_evicts_ahead_and_the_other_stores_exactly() -> None:
    from gateway.conversations import ConversationStore
    from gateway.metrics import GatewayMetrics
    from schemas.config import ResponsesConfig

    conversations = ConversationStore.from_config(ResponsesConfig(), GatewayMetrics(["m"], ["b"]))
    assert isinstance(conversations.store, MemoryStore) and conversations.store.ahead == 1
    assert make(Clock(), []).ahead == 0

"""The limiter behind admission control and bulkheads, driven directly on the event loop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.flow.admission import Admission, Limiter, QueueRejected
from schemas.config import AdmissionConfig
from schemas.errors import InvalidRequestError

INTERACTIVE, BATCH = 0, 1


def limiter(limit: int = 1, queue_size: int = 10, timeout: float = 5.0) -> Limiter:
    return Limiter("b", limit, queue_size=queue_size, timeout=timeout)


async def test_cap_then_fifo_handoff() -> None:
    lim = limiter(limit=2)
    assert lim.try_acquire() and lim.try_acquire()
    assert not lim.try_acquire()
    order: list[str] = []

    async def wait(name: str) -> None:
        await lim.acquire(INTERACTIVE)
        order.append(name)

    tasks = [asyncio.create_task(wait(n)) for n in "abc"]
    await asyncio.sleep(0)
    assert lim.waiting == 3
    for _ in range(3):
        lim.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c"]
    assert lim.active == 2  # the slots changed hands, the cap held
    lim.release()
    lim.release()
    assert lim.active == 0 and lim.waiting == 0


async def test_interactive_is_admitted_before_batch() -> None:
    lim = limiter(limit=1)
    await lim.acquire(INTERACTIVE)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await lim.acquire(priority)
        order.append(name)
        lim.release()

    tasks = [
        asyncio.create_task(wait("batch-1", BATCH)),
        asyncio.create_task(wait("batch-2", BATCH)),
        asyncio.create_task(wait("interactive", INTERACTIVE)),
    ]
    await asyncio.sleep(0)
    lim.release()
    await asyncio.gather(*tasks)
    assert order == ["interactive", "batch-1", "batch-2"]


async def test_a_newcomer_does_not_barge_past_waiters() -> None:
    lim = limiter(limit=1)
    await lim.acquire(INTERACTIVE)
    waiter = asyncio.create_task(lim.acquire(BATCH))
    await asyncio.sleep(0)
    lim.release()  # handed to the waiter, which has not run yet
    assert not lim.try_acquire()
    await waiter
    assert lim.active == 1


async def test_full_queue_rejects_at_once() -> None:
    lim = limiter(limit=1, queue_size=1)
    await lim.acquire(INTERACTIVE)
    waiter = asyncio.create_task(lim.acquire(INTERACTIVE))
    await asyncio.sleep(0)
    with pytest.raises(QueueRejected) as caught:
        await lim.acquire(INTERACTIVE)
    assert caught.value.status == 429 and caught.value.reason == "queue_full"
    assert caught.value.retry_after is not None and caught.value.retry_after > 0
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert lim.waiting == 0


async def test_queue_timeout_rejects_and_leaves_the_queue() -> None:
    lim = limiter(limit=1, timeout=0.05)
    await lim.acquire(INTERACTIVE)
    with pytest.raises(QueueRejected) as caught:
        await lim.acquire(INTERACTIVE)
    assert caught.value.reason == "queue_timeout" and caught.value.type == "rate_limit_error"
    assert lim.waiting == 0
    lim.release()
    assert lim.active == 0


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    lim = limiter(limit=1)
    await lim.acquire(INTERACTIVE)
    waiter = asyncio.create_task(lim.acquire(INTERACTIVE))
    await asyncio.sleep(0)
    assert lim.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert lim.waiting == 0
    lim.release()
    assert lim.active == 0


async def test_a_slot_handed_to_a_waiter_that_is_cancelled_is_passed_on() -> None:
    lim = limiter(limit=1)
    await lim.acquire(INTERACTIVE)
    first = asyncio.create_task(lim.acquire(INTERACTIVE))
    second = asyncio.create_task(lim.acquire(INTERACTIVE))
    await asyncio.sleep(0)
    lim.release()  # the slot goes to ``first`` ...
    first.cancel()  # ... which is cancelled before it could run
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1)  # ... so it went on to ``second``
    assert lim.active == 1 and lim.waiting == 0
    lim.release()
    assert lim.active == 0


async def test_uncapped_limiter_only_counts() -> None:
    lim = Limiter("b", None, queue_size=0, timeout=1)
    for _ in range(10_000):
        assert lim.try_acquire()
    assert lim.active == 10_000


def test_priority_header() -> None:
    admission = Admission(AdmissionConfig(priority_header="x-priority", default_priority="interactive"))
    assert admission.priority_of({}) == INTERACTIVE
    assert admission.priority_of({"x-priority": "batch"}) == BATCH
    assert admission.priority_of({"x-priority": " Interactive "}) == INTERACTIVE
    with pytest.raises(InvalidRequestError) as caught:
        admission.priority_of({"x-priority": "urgent"})
    assert "x-priority" in caught.value.message
    batch_default = Admission(AdmissionConfig(default_priority="batch"))
    assert batch_default.priority_of({}) == BATCH

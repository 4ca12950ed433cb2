"""The time source of resilience decisions: retry backoff, deadlines, circuit cooldowns.

One object so tests can swap both halves together: a fake clock whose ``sleep`` only
advances ``now`` lets a test walk through backoffs and cooldowns without sleeping.
Queue timeouts are not on it: they are the event loop's own timers.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Clock"]


class Clock:
    """Monotonic seconds and a sleep; the default is the real thing."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

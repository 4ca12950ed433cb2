"""The serving process's garbage-collector settings, applied once the app has started.

Python's cycle collector costs a serving gateway more than it returns: requests make almost
no cyclic garbage (their objects are freed by reference counting), yet at the default
threshold (700 net allocations) the young generation is collected every ~17 requests at 64
in flight, each time walking every live object of every request in flight, and now and then
a full collection walks the whole start-up heap (modules, pydantic schemas, the config: ~75k
objects). ``bench/request_cost.py`` measured both at about 5-7% of the gateway's CPU per
request (c=64).

:func:`settle_heap`, once per process when the first server starts:

- collects, then freezes what exists then (``gc.freeze``): the start-up heap moves to the
  permanent generation, which no collection walks again. Garbage is collected first, so
  nothing dead is kept; what dies later among those objects (the first config's state after
  a SIGHUP reload) is freed by reference counting as usual, and only cyclic leftovers of that
  one generation stay (bounded: it happens once per process);
- raises the young generation's threshold to :data:`YOUNG_THRESHOLD`, so cycles are still
  collected, about 15 times less often; the older generations keep their defaults.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_heap"]

YOUNG_THRESHOLD = 10_000

_settled = False


def settle_heap() -> None:
    """Freeze the start-up heap and space out young collections; idempotent (once per process)."""
    global _settled
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, gc.get_threshold()[0]), older, oldest)

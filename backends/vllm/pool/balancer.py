"""Choosing a worker: least load, refined by the worker's own queue, and prefix affinity.

Load of an endpoint = requests in flight from this gateway + requests waiting in the
worker's own queue (``vllm:num_requests_waiting``, scraped) + its KV-cache usage (0..1,
scraped), so equal in-flight counts are broken towards the emptier cache. Ties go
round-robin, so an idle pool still spreads.

``prefix-affinity``: the request's prefix keys (``backends.vllm.pool.prefix``) are
looked up deepest first in each available endpoint's LRU; the endpoint holding the
longest matching prefix (the least loaded of several) is chosen unless it is
overloaded (load above the least loaded endpoint's by more than ``overload_margin``,
or KV cache at least ``kv_cache_high`` full): then the least loaded endpoint is
chosen instead. The chosen endpoint records the keys, so the next request with the
same prefix follows it. Every choice is counted by decision (``DECISIONS``).

Not thread-safe; called from the event loop only. ``pick`` is O(endpoints x keys)
dict lookups and allocates one small list.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.base import Backend
from backends.vllm.pool.prefix import PrefixLRU
from backends.vllm.pool.scrape import WorkerLoad
from schemas.config import PoolRoutingConfig

__all__ = ["DECISIONS", "Balancer", "Endpoint"]

# Fixed label values for metrics: why an endpoint was chosen.
DECISIONS = ("affinity_hit", "affinity_miss", "affinity_overloaded", "least_load", "round_robin")


class Endpoint:
    """One routable worker or server, as the balancer sees it.

    ``generation`` grows each time the endpoint is (re)started: a request that failed on
    one generation may be retried on the next. ``adapter`` is the HTTP adapter of the
    current generation (set while ``available``).
    """

    __slots__ = ("adapter", "available", "generation", "in_flight", "index", "load", "prefixes", "url")

    def __init__(self, index: int, affinity_entries: int, url: str = "") -> None:
        self.index = index
        self.url = url
        self.adapter: Backend | None = None
        self.available = False
        self.generation = 0
        self.in_flight = 0
        self.load = WorkerLoad()
        self.prefixes = PrefixLRU(affinity_entries)

    @property
    def ident(self) -> tuple[int, int]:
        return (self.index, self.generation)

    @property
    def score(self) -> float:
        load = self.load
        return self.in_flight + load.waiting + load.kv_cache_usage

    def __repr__(self) -> str:
        return f"<Endpoint {self.index} gen={self.generation} {self.url} available={self.available}>"


class Balancer:
    def __init__(self, routing: PoolRoutingConfig) -> None:
        self.routing = routing
        self.endpoints: list[Endpoint] = []
        self.decisions = dict.fromkeys(DECISIONS, 0)
        self._rr = 0

    def pick(self, keys: Sequence[int], exclude: frozenset[tuple[int, int]] | set[tuple[int, int]]) -> Endpoint | None:
        """The endpoint for a request with these prefix keys, or None when none is available."""
        cands = [ep for ep in self.endpoints if ep.available and ep.ident not in exclude]
        if not cands:
            return None
        n = len(cands)
        start = self._rr % n
        self._rr += 1
        strategy = self.routing.strategy
        if strategy == "round-robin":
            self.decisions["round_robin"] += 1
            return cands[start]
        least = _least_loaded(cands, start)
        if strategy == "least-load" or not keys:
            self.decisions["least_load"] += 1
            return least
        affine = _affine(cands, keys)
        if affine is None:
            decision, chosen = "affinity_miss", least
        elif affine is least or not self._overloaded(affine, least):
            decision, chosen = "affinity_hit", affine
        else:
            decision, chosen = "affinity_overloaded", least
        self.decisions[decision] += 1
        chosen.prefixes.add(keys)
        return chosen

    def _overloaded(self, affine: Endpoint, least: Endpoint) -> bool:
        routing = self.routing
        return (
            affine.score - least.score > routing.overload_margin or affine.load.kv_cache_usage >= routing.kv_cache_high
        )


def _least_loaded(cands: list[Endpoint], start: int) -> Endpoint:
    n = len(cands)
    best = cands[start]
    best_score = best.score
    for i in range(1, n):
        ep = cands[(start + i) % n]
        score = ep.score
        if score < best_score:
            best, best_score = ep, score
    return best


def _affine(cands: list[Endpoint], keys: Sequence[int]) -> Endpoint | None:
    for key in reversed(keys):  # deepest (longest shared prefix) first
        holders = [ep for ep in cands if key in ep.prefixes]
        if holders:
            return min(holders, key=lambda ep: ep.score)
    return None

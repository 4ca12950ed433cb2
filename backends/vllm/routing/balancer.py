"""Choosing a worker: least load, refined by the worker's own queue, prefix affinity, prefix hash.

Load of an endpoint = requests in flight from this gateway (every worker process of it with
``--workers N``: ``backends.vllm.routing.inflight``) + requests waiting in the
worker's own queue (``vllm:num_requests_waiting``, scraped) + its KV-cache usage (0..1,
scraped), so equal in-flight counts are broken towards the emptier cache. Ties go
round-robin, so an idle pool still spreads.

``prefix-affinity``: the request's prefix keys (``backends.vllm.routing.prefix``) are
looked up deepest first in each available endpoint's LRU; the endpoint holding the
longest matching prefix (the least loaded of several) is chosen unless it is
overloaded (load above the least loaded endpoint's by more than ``overload_margin``,
or KV cache at least ``kv_cache_high`` full): then the least loaded endpoint is
chosen instead. The chosen endpoint records the keys, so the next request with the
same prefix follows it.

``prefix-hash``: no learned state. The key of the prompt's first whole block
(``backends.vllm.routing.prefix``: BLAKE2b, equal in every process) ranks the available
endpoints by rendezvous hashing (highest ``blake2b(key, endpoint id)`` first; the id is
the endpoint's URL), and the first endpoint in that order whose load is within the bound
is chosen. So every gateway worker and every replica sends a prefix to the same server
without talking to each other, and when a server joins or leaves only the keys it wins
or held move (about 1/N of them). The first block, not the deepest, is the key so that a
conversation keeps its server while it grows; so ``block_chars`` / ``block_tokens`` set how
much of the prompt decides (about the length of the shared system prompt or document).
Bound (consistent hashing with bounded loads, Mirrokni et al. 2018): with ``n`` candidates
carrying ``L`` requests in all (load = in flight from this gateway + the server's scraped
queue), an endpoint may take the request only while ``load + 1 <= ceil((1 + HASH_EPSILON) * (L + 1) / n)``, i.e. no
server gets more than 1.25x its fair share (rounded up); a server whose KV cache is at
least ``kv_cache_high`` full is passed over too. The least loaded endpoint always meets
the bound, so the walk always ends. Replicas see different in-flight counts, so under
heavy load they may spill differently; below the bound they agree exactly. A prompt
shorter than one block has no key and goes to the least loaded endpoint.

``score``: each available endpoint within the load bound gets ``weights.queue * Q + weights.kv_cache
* K + weights.prefix * P`` and the highest wins (``backends.vllm.routing.score``: the terms, the bound,
the stale rule, the tie-break). Session affinity comes first: a request naming a session goes to
the session's rendezvous choice while that one is within the bound.

Every choice is counted by decision (``DECISIONS``); with ``score`` also per endpoint, by the term
that decided it (``Endpoint.decided``).

Not thread-safe; called from the event loop only. ``pick`` is O(endpoints x keys)
dict lookups and allocates one small list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from backends.base import Backend
from backends.vllm.routing.blocks import BlockHasher
from backends.vllm.routing.kv_events import BlockIndex
from backends.vllm.routing.prefix import PrefixLRU
from backends.vllm.routing.rendezvous import rendezvous_order
from backends.vllm.routing.score import SCORE_DECISIONS, RoutedRequest, score_pick
from backends.vllm.routing.scrape import WorkerLoad
from schemas.config import PoolRoutingConfig

__all__ = ["DECISIONS", "HASH_EPSILON", "Balancer", "Endpoint", "decision_names", "rendezvous_order"]

# Fixed label values for metrics: why an endpoint was chosen. ``hash_preferred``: the
# prefix's first rendezvous choice; ``hash_overloaded``: a later one, the earlier ones
# being over the load bound (or their KV cache full), or already tried by this request.
DECISIONS = (
    "affinity_hit",
    "affinity_miss",
    "affinity_overloaded",
    "hash_preferred",
    "hash_overloaded",
    "least_load",
    "round_robin",
    *SCORE_DECISIONS,
)
# prefix-hash: an endpoint may carry at most (1 + HASH_EPSILON) x the average load.
HASH_EPSILON = 0.25


class Endpoint:
    """One routable worker or server, as the balancer sees it.

    ``generation`` grows each time the endpoint is (re)started: a request that failed on
    one generation may be retried on the next. ``adapter`` is the HTTP adapter of the
    current generation (set while ``available``).
    """

    __slots__ = (
        "_url",
        "adapter",
        "available",
        "blocks",
        "decided",
        "events",
        "generation",
        "hash_id",
        "in_flight",
        "index",
        "load",
        "prefixes",
    )

    def __init__(self, index: int, affinity_entries: int, url: str = "", index_blocks: int = 1) -> None:
        self.index = index
        self.hash_id = b""
        self.url = url
        self.adapter: Backend | None = None
        self.available = False
        self.generation = 0
        self.in_flight = 0
        self.load = WorkerLoad()
        self.prefixes = PrefixLRU(affinity_entries)
        # ``score``: the blocks its KV events say it holds; the requests each term won it.
        self.blocks = BlockIndex(index_blocks)
        self.decided: dict[str, int] = {}
        self.events: str | None = None  # where the server publishes its KV events, if it does

    @property
    def url(self) -> str:
        return self._url

    @url.setter
    def url(self, url: str) -> None:
        # The endpoint's name in rendezvous hashing: the same in every process that knows
        # the server by the same URL (the pool's workers get theirs once their port is known).
        self._url = url
        self.hash_id = (url or f"#{self.index}").encode()

    @property
    def ident(self) -> tuple[int, int]:
        return (self.index, self.generation)

    def begin(self) -> None:
        """A call of this process starts on the endpoint."""
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1

    @property
    def gateway_in_flight(self) -> int:
        """Calls in flight to the endpoint from the whole gateway (this process, unless shared:
        :class:`backends.vllm.routing.inflight.SharedEndpoint` sums every gateway worker's)."""
        return self.in_flight

    def queue(self) -> float:
        """Requests at the server now, as the gateway estimates them (``score``'s queue input).

        The last scrape's ``waiting + running``, plus the calls the gateway started there since (minus
        those that ended), never below the gateway's own calls in flight; with stale metrics, just
        those calls.
        """
        now = self.gateway_in_flight
        load = self.load
        if load.stale:
            return float(now)
        return max(float(now), load.waiting + load.running + now - load.in_flight)

    @property
    def score(self) -> float:
        load = self.load
        return self.gateway_in_flight + load.waiting + load.kv_cache_usage

    def __repr__(self) -> str:
        return f"<Endpoint {self.index} gen={self.generation} {self.url} available={self.available}>"


class Balancer:
    def __init__(self, routing: PoolRoutingConfig) -> None:
        self.routing = routing
        self.endpoints: list[Endpoint] = []
        self.decisions = dict.fromkeys(decision_names(routing.strategy), 0)
        self._rr = 0
        # ``score`` with KV events: the hasher of an endpoint's server (None: its blocks are not known).
        self.hasher: Callable[[Endpoint], BlockHasher | None] = lambda ep: None
        # Requests whose prefix term came from the servers' KV events / from the prompt's hash.
        self.prefix_modes = {"kv_events": 0, "approximate": 0}

    def pick(
        self,
        keys: Sequence[int],
        exclude: frozenset[tuple[int, int]] | set[tuple[int, int]],
        request: RoutedRequest | None = None,
    ) -> Endpoint | None:
        """The endpoint for a request with these prefix keys, or None when none is available.

        ``request``: what ``score`` reads besides the keys (token ids, session); optional otherwise.
        """
        cands = [ep for ep in self.endpoints if ep.available and ep.ident not in exclude]
        if not cands:
            return None
        n = len(cands)
        start = self._rr % n
        self._rr += 1
        strategy = self.routing.strategy
        if strategy == "score":
            routed = request if request is not None else RoutedRequest(tuple(keys))
            available = [ep for ep in self.endpoints if ep.available]
            chosen, decision, mode = score_pick(self.routing, cands, available, routed, start, self.hasher)
            self.decisions[decision] += 1
            self.prefix_modes[mode] += 1
            chosen.decided[decision] = chosen.decided.get(decision, 0) + 1
            return chosen
        if strategy == "round-robin":
            self.decisions["round_robin"] += 1
            return cands[start]
        least = _least_loaded(cands, start)
        if strategy == "prefix-hash" and keys:
            return self._hashed(cands, keys[0], least, exclude)
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

    def _hashed(
        self,
        cands: list[Endpoint],
        key: int,
        least: Endpoint,
        exclude: frozenset[tuple[int, int]] | set[tuple[int, int]],
    ) -> Endpoint:
        total = sum(_hash_load(ep) for ep in cands)
        bound = math.ceil((1 + HASH_EPSILON) * (total + 1) / len(cands))
        kv_high = self.routing.kv_cache_high
        order = rendezvous_order(cands, key)
        # least meets the bound by construction: it is kept only when every KV cache is full.
        chosen = next((ep for ep in order if _hash_load(ep) + 1 <= bound and ep.load.kv_cache_usage < kv_high), least)
        # Preferred = first over every available endpoint, so a retry that skips the one it
        # already tried counts as a spill.
        first = order[0] if not exclude else rendezvous_order([e for e in self.endpoints if e.available], key)[0]
        self.decisions["hash_preferred" if chosen is first else "hash_overloaded"] += 1
        return chosen

    def _overloaded(self, affine: Endpoint, least: Endpoint) -> bool:
        routing = self.routing
        return (
            affine.score - least.score > routing.overload_margin or affine.load.kv_cache_usage >= routing.kv_cache_high
        )


def decision_names(strategy: str) -> list[str]:
    """The decisions a strategy can count: each series exists only where it can move (``hash_*`` with
    ``prefix-hash``; ``score`` counts its own only)."""
    if strategy == "score":
        return list(SCORE_DECISIONS)
    names = [d for d in DECISIONS if d not in SCORE_DECISIONS]
    return names if strategy == "prefix-hash" else [d for d in names if not d.startswith("hash_")]


def _hash_load(ep: Endpoint) -> int:
    # Whole requests: with integer loads the least loaded endpoint always meets the bound.
    return ep.gateway_in_flight + int(ep.load.waiting)


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

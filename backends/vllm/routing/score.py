"""``strategy: score``: each candidate server's weighted score, from the servers' own signals.

For the candidates of one request (available, not tried yet):

- the **load bound**: a server whose queue (``Endpoint.queue``: its scraped ``waiting + running``,
  freshened by the gateway's own calls since the scrape) is over ``max_load_ratio`` times the
  candidates' mean queue plus one is passed over; the least loaded one never is (the one request
  of slack keeps a prefix where it is while queues are short). This is what keeps prefix scoring
  from piling a popular prefix onto one server;
- **Q** (queue) = ``(max - q) / (max - min)`` over the servers within the bound (1 when all equal);
- **K** (KV cache) = ``1 - vllm:kv_cache_usage_perc``; a server whose metrics are stale (its last
  scrape failed) gets the lowest K among the others, so an unknown cache is never preferred, and
  its queue is the gateway's own calls in flight there;
- **P** (prefix) = with KV events (``prefix: kv-events``, a tokenizer and the server's block size
  known): the share of the request's own prompt blocks, from the first on, that the server holds
  (``backends.vllm.routing.kv_events``); otherwise (``approximate``, or when no server holds any
  of the prompt's blocks yet) 1 for the rendezvous choice of the prompt's first block (as
  ``prefix-hash``), 0 for the others.

Score = ``weights.queue * Q + weights.kv_cache * K + weights.prefix * P``; the highest wins, and
equal scores go to the rendezvous choice of the prompt's first block (so an idle pool keeps each
prefix on one server, alike in every process), or in turn when the prompt has no whole block.
Before all that, a request with a session (``x-session-id``, else ``user``) goes to the session's
rendezvous choice while that server is within the bound.

The term that decided (the largest weighted difference between the winner and the runner-up) is
counted (``score_queue``, ``score_kv_cache``, ``score_prefix``; ``score_tie`` when none told them
apart or there was no other choice; ``score_session``). Pure function of its inputs: no state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Protocol, TypeVar

from backends.vllm.routing.blocks import BlockHasher
from backends.vllm.routing.kv_events import BlockIndex
from backends.vllm.routing.rendezvous import rendezvous_first
from backends.vllm.routing.scrape import WorkerLoad
from schemas.config import PoolRoutingConfig

__all__ = ["SCORE_DECISIONS", "TERMS", "RoutedRequest", "Scored", "score_pick", "session_key"]

TERMS = ("queue", "kv_cache", "prefix")
SCORE_DECISIONS = ("score_queue", "score_kv_cache", "score_prefix", "score_tie", "score_session")
_EPS = 1e-9


@dataclass(slots=True)
class RoutedRequest:
    """What ``score`` reads of a request: its approximate prefix keys, its leading token ids when
    known (``backends.vllm.routing.tokens``), its session."""

    keys: tuple[int, ...]
    tokens: Sequence[int] | None = None
    session: str | None = None
    # Block keys per hasher (servers of one configuration share one).
    hashed: dict[int, list[int]] = field(default_factory=dict)


class Scored(Protocol):
    """An endpoint as the score reads it (``backends.vllm.routing.balancer.Endpoint``)."""

    load: WorkerLoad
    blocks: BlockIndex
    decided: dict[str, int]

    @property
    def hash_id(self) -> bytes: ...

    def queue(self) -> float: ...


E = TypeVar("E", bound=Scored)


def session_key(session: str) -> int:
    return int.from_bytes(blake2b(session.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def score_pick(
    routing: PoolRoutingConfig,
    cands: Sequence[E],
    available: Sequence[E],
    request: RoutedRequest,
    start: int,
    hasher: Callable[[E], BlockHasher | None],
) -> tuple[E, str, str]:
    """(the chosen endpoint, the decision, the prefix mode: ``kv_events`` or ``approximate``)."""
    n = len(cands)
    queues = [ep.queue() for ep in cands]
    bound = routing.max_load_ratio * sum(queues) / n + 1
    within = [i for i in range(n) if queues[i] <= bound]  # the least loaded always is
    if request.session is not None and routing.session_affinity:
        home = rendezvous_first(available, session_key(request.session))
        for i in within:
            if cands[i] is home:
                return home, "score_session", "approximate"
    prefix, mode = _prefix(routing, cands, available, request, hasher)
    qs = [queues[i] for i in within]
    qmin, qmax = min(qs), max(qs)
    fresh = [1.0 - cands[i].load.kv_cache_usage for i in within if not cands[i].load.stale]
    floor = min(fresh) if fresh else 0.0
    w = routing.weights
    rows: list[tuple[float, float, float, float, int]] = []
    for i in within:
        ep = cands[i]
        q = 1.0 if qmax == qmin else (qmax - queues[i]) / (qmax - qmin)
        k = floor if ep.load.stale else 1.0 - ep.load.kv_cache_usage
        p = prefix[i]
        rows.append((w.queue * q + w.kv_cache * k + w.prefix * p, w.queue * q, w.kv_cache * k, w.prefix * p, i))
    top = max(r[0] for r in rows)
    tied = [r for r in rows if r[0] >= top - _EPS]
    if len(tied) == 1:
        win = tied[0]
    elif request.keys:
        ep = rendezvous_first([cands[r[4]] for r in tied], request.keys[0])
        win = next(r for r in tied if cands[r[4]] is ep)
    else:
        win = tied[start % len(tied)]
    others = [r for r in rows if r is not win]
    decision = "score_tie"
    if others:
        runner = max(others, key=lambda r: r[0])
        gains = [win[t] - runner[t] for t in (1, 2, 3)]
        best = max(range(3), key=gains.__getitem__)
        if gains[best] > _EPS:
            decision = "score_" + TERMS[best]
    return cands[win[4]], decision, mode


def _prefix(
    routing: PoolRoutingConfig,
    cands: Sequence[E],
    available: Sequence[E],
    request: RoutedRequest,
    hasher: Callable[[E], BlockHasher | None],
) -> tuple[list[float], str]:
    if routing.prefix == "kv-events" and request.tokens is not None:
        hashers = [hasher(ep) for ep in cands]
        if all(h is not None for h in hashers):
            out: list[float] = []
            for ep, h in zip(cands, hashers, strict=True):
                assert h is not None
                keys = request.hashed.get(id(h))
                if keys is None:
                    keys = request.hashed[id(h)] = h.keys(request.tokens, 1 << 30)
                out.append(ep.blocks.run(keys) / len(keys) if keys else 0.0)
            if any(out):
                return out, "kv_events"
            # No server holds any of it (a new prefix, or one still being prefilled): its rendezvous
            # choice, so a burst of a new prefix lands on one server, alike in every process.
    if not request.keys:
        return [0.0] * len(cands), "approximate"
    first = rendezvous_first(available, request.keys[0])
    return [1.0 if ep is first else 0.0 for ep in cands], "approximate"

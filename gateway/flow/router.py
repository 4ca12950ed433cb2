"""Model names to routes, the capability check that runs before routing, and the strategies.

A configured model has one or more routes (backend + upstream model id). For a request
the router returns the routes that can honour every field it sets; when none can, the
request is refused with 400 ``unsupported_parameter`` naming the first field the
preferred route lacks. The model's strategy then puts those routes in try order: the
chosen route first, the rest in the order failover walks them.

Strategies (``models[].strategy``):

- ``failover``: configuration order.
- ``round_robin``: each request starts one route further along.
- ``weighted``: smooth weighted round robin over route ``weight`` (nginx's algorithm:
  deterministic, and with weights 3:1 the heavier route never gets more than its share
  in a row); failover continues in configuration order.
- ``least_outstanding``: fewest requests in flight at this gateway, ties broken round robin.

Every route of a backend shares that backend's :class:`BackendGuard` (circuit breaker,
limiter, retry policy), so a backend's health and load are the same whichever model used it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from backends.base import Backend
from gateway.flow.admission import Limiter
from gateway.flow.health import CircuitBreaker
from gateway.flow.retry import RetryPolicy
from schemas.completions import CompletionRequest
from schemas.config import GatewayConfig, ModelConfig
from schemas.errors import NotFoundError

__all__ = [
    "BackendGuard",
    "Failover",
    "LeastOutstanding",
    "ModelEntry",
    "RoundRobin",
    "Route",
    "Router",
    "Strategy",
    "Weighted",
    "make_strategy",
    "spread_starts",
]


@dataclass(frozen=True, slots=True, eq=False)
class BackendGuard:
    """What protects one backend; shared by every route to it."""

    breaker: CircuitBreaker
    limiter: Limiter
    retry: RetryPolicy


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    backend: Backend
    upstream_model: str
    weight: float
    guard: BackendGuard


class Strategy(Protocol):
    def order(self, routes: list[Route]) -> list[Route]:
        """``routes`` (at least two) in try order: the chosen one first, then failover order."""


class Failover:
    __slots__ = ()

    def order(self, routes: list[Route]) -> list[Route]:
        return routes


def spread_starts() -> None:
    """Start every rotation at a random place (``gateway serve --workers N``): N workers that all
    began at route 0 would send their first requests to the same backend."""
    global _start
    _start = random.randrange


def _first(_: int) -> int:
    return 0


_start: Callable[[int], int] = _first


class RoundRobin:
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = _start(1 << 16)

    def order(self, routes: list[Route]) -> list[Route]:
        i = self._next % len(routes)
        self._next = i + 1
        return routes[i:] + routes[:i] if i else routes


class Weighted:
    """Smooth weighted round robin; the running scores persist across requests."""

    __slots__ = ("_score", "_skip")

    def __init__(self) -> None:
        self._score: dict[int, float] = {}
        self._skip = _start(1 << 8)  # steps of the schedule taken before the first request

    def order(self, routes: list[Route]) -> list[Route]:
        while self._skip:
            self._skip -= 1
            self._step(routes)
        return self._step(routes)

    def _step(self, routes: list[Route]) -> list[Route]:
        score = self._score
        total = 0.0
        best: Route | None = None
        best_score = 0.0
        for route in routes:
            s = score.get(id(route), 0.0) + route.weight
            score[id(route)] = s
            total += route.weight
            if best is None or s > best_score:
                best, best_score = route, s
        assert best is not None
        score[id(best)] = best_score - total
        return [best, *(r for r in routes if r is not best)]


class LeastOutstanding:
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = _start(1 << 16)

    def order(self, routes: list[Route]) -> list[Route]:
        i = self._next % len(routes)
        self._next = i + 1
        rotated = routes[i:] + routes[:i] if i else routes
        # sorted() is stable: equally loaded routes keep the rotation, so ties take turns.
        return sorted(rotated, key=lambda r: r.guard.limiter.active)


def make_strategy(name: str) -> Strategy:
    match name:
        case "failover":
            return Failover()
        case "round_robin":
            return RoundRobin()
        case "weighted":
            return Weighted()
        case "least_outstanding":
            return LeastOutstanding()
    raise AssertionError(f"no strategy {name!r}")  # the config schema refuses unknown names


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    routes: tuple[Route, ...]
    strategy: Strategy


class Router:
    def __init__(
        self, config: GatewayConfig, backends: Mapping[str, Backend], guards: Mapping[str, BackendGuard]
    ) -> None:
        self.models: dict[str, ModelEntry] = {m.name: self._entry(m, backends, guards) for m in config.models}

    @staticmethod
    def _entry(model: ModelConfig, backends: Mapping[str, Backend], guards: Mapping[str, BackendGuard]) -> ModelEntry:
        routes = tuple(Route(backends[r.backend], r.model, r.weight, guards[r.backend]) for r in model.routes)
        return ModelEntry(model.name, routes, make_strategy(model.strategy))

    def lookup(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFoundError(
                f"The model '{name}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return entry

    def candidates(self, entry: ModelEntry, request: CompletionRequest) -> list[Route]:
        """Routes able to serve ``request``, in try order; raises if there are none."""
        routes = entry.routes
        if len(routes) == 1:  # the common case, without allocations beyond the list
            route = routes[0]
            error = route.backend.capabilities.refusal(request, route.backend.name, route.backend.kind)
            if error is not None:
                raise error
            return [route]
        eligible = [r for r in routes if r.backend.capabilities.first_violation(request) is None]
        if not eligible:
            first = routes[0].backend
            error = first.capabilities.refusal(request, first.name, first.kind)
            assert error is not None  # not eligible: it refuses something
            raise error
        return entry.strategy.order(eligible) if len(eligible) > 1 else eligible

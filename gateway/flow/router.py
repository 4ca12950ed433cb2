"""Model names to routes, the capability check that runs before routing, and the strategies.

A configured model has one or more routes (backend + upstream model id), and is served on the
endpoints ``models[].endpoints`` lists that its routes' backends serve (``Backend.endpoints``);
unlisted, on what they serve by default (``Backend.default_endpoints``: the generation endpoints, or
embeddings and rerank on a backend that serves nothing else). A request on another endpoint gets 404
naming the ones it is served on, as OpenAI answers a chat model on ``/v1/completions``. For a
request the router returns the routes of its endpoint that can honour every field it sets (that
endpoint's capability table: :class:`~gateway.flow.endpoints.EndpointOps`); when none can, the
request is refused with 400 ``unsupported_parameter`` naming the first field the preferred route
lacks. The model's strategy then puts those routes in try order: the chosen route first, the rest in
the order failover walks them.

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
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from backends.base import Backend
from backends.capabilities import AUDIT_USER_NOTE, Capabilities
from gateway.flow.admission import Limiter
from gateway.flow.endpoints import EndpointOps
from gateway.flow.health import CircuitBreaker
from gateway.flow.retry import RetryPolicy
from gateway.served import ServedRequest
from gateway.spend.prices import Price
from schemas.config import GatewayConfig, ModelConfig, PricingConfig
from schemas.endpoints import ENDPOINT_PATHS, TOKENIZER_ENDPOINTS, Endpoint
from schemas.errors import NotFoundError, UnsupportedParameterError

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
    "endpoint_problems",
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
    context: int | None = None  # ``routes[].context_length``: the window in tokens, when configured
    # What this route's tokens cost (``routes[].pricing``, else ``models[].pricing``); None: nothing.
    # Part of the route, so a request keeps the prices of the config it was routed under.
    price: Price | None = None

    def context_length(self) -> int | None:
        """The upstream model's context window: the configured one, else what the backend reports."""
        return self.context if self.context is not None else self.backend.context_length(self.upstream_model)


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


class LeastOutstanding(RoundRobin):
    """The least busy route first; equally busy routes in the round-robin turn."""

    __slots__ = ()

    def order(self, routes: list[Route]) -> list[Route]:
        # sorted() is stable: equally loaded routes keep the rotation, so ties take turns.
        return sorted(RoundRobin.order(self, routes), key=lambda r: r.guard.limiter.active)


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
    # The routes that serve each endpoint the model is served on (configuration order);
    # an endpoint absent here is not served (404 naming the ones that are).
    served: Mapping[Endpoint, tuple[Route, ...]] = field(default_factory=dict)
    # ``models[].responses.builtin_tools: omit``: built-in tools a backend cannot run are left out.
    omit_builtin_tools: bool = False

    def routes_for(self, ops: EndpointOps) -> tuple[Route, ...]:
        """The routes serving ``ops``'s endpoint; 404 naming the endpoints served when there are none."""
        routes = self.served.get(ops.endpoint)
        if routes is None:
            raise _not_served(self, ops)
        return routes


def _not_served(entry: ModelEntry, ops: EndpointOps) -> NotFoundError:
    if ops.endpoint in TOKENIZER_ENDPOINTS:
        backends = ", ".join(dict.fromkeys(f"'{r.backend.name}' (type {r.backend.kind})" for r in entry.routes))
        return NotFoundError(
            f"The model '{entry.name}' has no {ops.path} endpoint: its backend(s) {backends} expose no tokenizer; "
            f"POST {ops.path} is vLLM's API, served for models on vllm and vllm-pool routes.",
            param="model",
            code="model_not_supported_on_endpoint",
        )
    # OpenAI's wording for a chat model on /v1/completions, with the endpoints named.
    here = ops.path.lstrip("/")
    there = " or ".join(
        ENDPOINT_PATHS[e].lstrip("/") for e in Endpoint if e in entry.served and e not in TOKENIZER_ENDPOINTS
    )
    return NotFoundError(
        f"The model '{entry.name}' is not supported in the {here} endpoint: it is served on {there}. "
        f"Did you mean to use {there}?",
        param="model",
        code="model_not_supported_on_endpoint",
    )


def endpoint_problems(config: GatewayConfig, served_by: Callable[[str], frozenset[Endpoint]]) -> list[tuple[str, str]]:
    """``models[].endpoints`` entries no route's backend can serve, as ``(yaml_path, message)``.

    ``served_by(backend_name)`` says what a configured backend serves: the adapters declare it
    (``Backend.endpoints``), so nothing here lists which backend type serves what.
    """
    problems: list[tuple[str, str]] = []
    for i, model in enumerate(config.models):
        able: set[Endpoint] = set()
        for route in model.routes:
            able |= served_by(route.backend)
        for j, endpoint in enumerate(model.endpoints or ()):
            if endpoint not in able:
                backends = ", ".join(sorted({r.backend for r in model.routes}))
                problems.append(
                    (
                        f"models[{i}].endpoints[{j}]",
                        f"no route of model '{model.name}' can serve {endpoint.value!r}: its backends ({backends}) "
                        f"serve {', '.join(sorted(e.value for e in able)) or 'nothing'}",
                    )
                )
    return problems


class Router:
    def __init__(
        self, config: GatewayConfig, backends: Mapping[str, Backend], guards: Mapping[str, BackendGuard]
    ) -> None:
        self.models: dict[str, ModelEntry] = {m.name: self._entry(m, backends, guards) for m in config.models}
        # ``user`` is honoured on a server without an end-user field only by the audit line: with
        # the audit log off nothing would record it, so those backends refuse it by name.
        self._user_unrecorded: frozenset[str] = (
            frozenset() if config.server.audit_log else frozenset(n for n, b in backends.items() if _records_user(b))
        )

    @staticmethod
    def _entry(model: ModelConfig, backends: Mapping[str, Backend], guards: Mapping[str, BackendGuard]) -> ModelEntry:
        routes = tuple(
            Route(
                backends[r.backend],
                r.model,
                r.weight,
                guards[r.backend],
                r.context_length,
                _price(r.pricing or model.pricing),
            )
            for r in model.routes
        )
        listed = set(model.endpoints) if model.endpoints is not None else None
        served: dict[Endpoint, tuple[Route, ...]] = {}
        for endpoint in Endpoint:
            # Unlisted: what each route's backend serves by default (generation, or pooling where
            # it serves nothing else), so an embedding model never lands on chat, nor the reverse.
            # The tokenizer's endpoints generate nothing: served wherever a route's backend has them.
            tokenizer = endpoint in TOKENIZER_ENDPOINTS
            able = tuple(
                r
                for r in routes
                if endpoint in r.backend.endpoints
                and (tokenizer or listed is not None or endpoint in r.backend.default_endpoints)
            )
            allowed = listed if listed is not None and not tokenizer else {endpoint}
            if endpoint in allowed and able:
                served[endpoint] = able
        omit = model.responses.builtin_tools == "omit"
        return ModelEntry(model.name, routes, make_strategy(model.strategy), MappingProxyType(served), omit)

    def lookup(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFoundError(
                f"The model '{name}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return entry

    def candidates(self, entry: ModelEntry, request: ServedRequest, ops: EndpointOps) -> list[Route]:
        """Routes able to serve ``request`` on ``ops``'s endpoint, in try order; raises if there are none."""
        routes = entry.served.get(ops.endpoint)  # ModelEntry.routes_for, without its call on every request
        if routes is None:
            raise _not_served(entry, ops)
        refusal = ops.refusal
        if self._user_unrecorded and request.user is not None:
            refusal = _refusing_user(refusal, self._user_unrecorded)
        if len(routes) == 1:  # the common case, without allocations beyond the list
            route = routes[0]
            error = refusal(route.backend, request)
            if error is not None:
                raise error
            return [route]
        eligible = [r for r in routes if refusal(r.backend, request) is None]
        if not eligible:
            error = refusal(routes[0].backend, request)
            assert error is not None  # not eligible: it refuses something
            raise error
        return entry.strategy.order(eligible) if len(eligible) > 1 else eligible


def _price(config: PricingConfig | None) -> Price | None:
    return Price.of(config) if config is not None else None


_UNRECORDED_USER = (
    "the server has no end-user field and the gateway records `user` only in its audit log, "
    "which is off (server.audit_log: true turns it on)"
)


def _records_user(backend: Backend) -> bool:
    """Whether ``backend`` honours ``user`` only through the gateway's audit line."""
    chat = backend.chat_capabilities
    return backend.capabilities.notes.get("user") == AUDIT_USER_NOTE or (
        chat is not None and chat.note("user") == AUDIT_USER_NOTE
    )


def _refusing_user(
    refusal: Callable[[Backend, Any], UnsupportedParameterError | None], names: frozenset[str]
) -> Callable[[Backend, Any], UnsupportedParameterError | None]:
    def refuse(backend: Backend, request: ServedRequest) -> UnsupportedParameterError | None:
        if backend.name in names:
            return Capabilities.refusal_error("user", backend.name, backend.kind, _UNRECORDED_USER)
        return refusal(backend, request)

    return refuse

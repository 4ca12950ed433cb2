"""Model names to routes, and the capability check that runs before routing.

A configured model has one or more routes (backend + upstream model id). For a
request the router returns the routes that can honour every field it sets, in
the order they should be tried; when none can, the request is refused with
400 ``unsupported_parameter`` naming the first field the preferred route lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backends.base import Backend
from schemas.completions import CompletionRequest
from schemas.config import GatewayConfig
from schemas.errors import NotFoundError, UnsupportedParameterError

__all__ = ["ModelEntry", "Route", "Router"]


@dataclass(frozen=True, slots=True)
class Route:
    backend: Backend
    upstream_model: str
    weight: float


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    routes: tuple[Route, ...]
    strategy: str


class Router:
    def __init__(self, config: GatewayConfig, backends: Mapping[str, Backend]) -> None:
        self.models: dict[str, ModelEntry] = {
            model.name: ModelEntry(
                model.name,
                tuple(Route(backends[r.backend], r.model, r.weight) for r in model.routes),
                model.strategy,
            )
            for model in config.models
        }

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
            violation = route.backend.capabilities.first_violation(request)
            if violation is not None:
                raise _unsupported(route, violation)
            return [route]
        eligible = [r for r in routes if r.backend.capabilities.first_violation(request) is None]
        if not eligible:
            first = routes[0]
            raise _unsupported(first, first.backend.capabilities.first_violation(request) or "")
        return eligible


def _unsupported(route: Route, field: str) -> UnsupportedParameterError:
    return UnsupportedParameterError(
        f"'{field}' is not supported by backend '{route.backend.name}' (type {route.backend.kind}) "
        f"that serves this model",
        param=field,
        backend=route.backend.name,
    )

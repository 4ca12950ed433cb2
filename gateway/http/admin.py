"""The operators' endpoints: ``GET /admin/health`` (deep health) and ``GET /admin/keys`` (spend and budgets).

With auth on they need ``auth.admin_key`` (and are not served without one); with auth off they are
open, as ``/metrics`` is. Both are read when asked, from what the gateway already holds: nothing
per request. With ``gateway serve --workers N`` the answer is the worker's that took the request
(``worker`` says which): breakers and probes are each worker's own; spend is shared through Redis.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from backends.registry import backend_status
from gateway.flow.health import CircuitState
from gateway.security.auth import require
from gateway.state import STATE, GatewayState
from schemas.endpoints import Endpoint
from schemas.errors import PermissionDeniedError

__all__ = ["ADMIN_ROUTES", "admin_only", "deep_health", "keys_usage"]

_JSON = "application/json"
_CIRCUIT = {CircuitState.CLOSED: "closed", CircuitState.HALF_OPEN: "half_open", CircuitState.OPEN: "open"}


def admin_only(handler: Handler) -> Handler:
    """``handler`` behind ``auth.admin_key`` when auth is on (read per request: a reload may set it);
    auth on without an admin key: 403 naming the setting."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        keyring = request.app[STATE].request_guard.keyring
        if keyring is not None:
            if keyring.admin_digest is None:
                raise PermissionDeniedError(
                    "The admin endpoints need an admin key: set auth.admin_key (or auth.admin_key_sha256).",
                    code="admin_key_not_configured",
                )
            require(request.headers, keyring.admin_digest)
        return await handler(request)

    return guarded


async def deep_health(request: web.Request) -> web.Response:
    """Each backend: its circuit, last probe, version, the models and endpoints it serves, its load."""
    state = request.app[STATE]
    backends = [_backend(state, name) for name in state.backends]
    worst = "draining" if state.draining else "ok"
    if worst == "ok" and any(b["circuit"]["state"] != "closed" for b in backends):
        worst = "degraded"
    body = {"status": worst, "worker": os.getpid(), "time": round(time.time(), 3), "backends": backends}
    return web.Response(body=orjson.dumps(body), content_type=_JSON, status=503 if worst == "draining" else 200)


def _backend(state: GatewayState, name: str) -> dict[str, Any]:
    backend = state.backends[name]
    out: dict[str, Any] = {"name": name, **backend_status(backend)}
    guard = state.guards.get(name)
    if guard is not None:
        breaker = guard.breaker
        probe = breaker.last_probe
        out["circuit"] = {"state": _CIRCUIT[breaker.state], "retry_in": round(breaker.retry_in(), 3)}
        out["last_probe"] = (
            {"at": round(probe[0], 3), "age": round(time.time() - probe[0], 3), "healthy": probe[1]}
            if probe is not None
            else None  # no health_check configured, or none ran yet
        )
        limiter = guard.limiter
        out["in_flight"] = limiter.active
        out["waiting"] = limiter.waiting
    else:
        out["circuit"] = {"state": "closed", "retry_in": 0.0}
    served: list[dict[str, Any]] = []
    for entry in state.router.models.values():
        endpoints: dict[str, list[str]] = {}  # upstream model -> endpoints
        for endpoint, routes in entry.served.items():
            for route in routes:
                if route.backend.name == name:
                    endpoints.setdefault(route.upstream_model, []).append(Endpoint(endpoint).value)
        served.extend(
            {"model": entry.name, "upstream_model": upstream, "endpoints": sorted(eps)}
            for upstream, eps in endpoints.items()
        )
    out["models"] = served
    return out


async def keys_usage(request: web.Request) -> web.Response:
    """Each key's spend today, this month and in total, and its budget (``gateway keys usage`` reads it)."""
    guard = request.app[STATE].request_guard
    if guard.ledger is None or guard.keyring is None:
        data: list[dict[str, Any]] = []
    else:
        data = await guard.ledger.usage(guard.keyring.names)
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type=_JSON)


ADMIN_ROUTES = (("/admin/health", admin_only(deep_health)), ("/admin/keys", admin_only(keys_usage)))

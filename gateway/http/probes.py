"""``GET /ready``: may a load balancer send this gateway traffic now? (``/health`` is liveness.)

200 ``{"status":"ready"}`` when some model has a route that can serve; 503 otherwise:

- ``{"status":"draining"}`` from SIGTERM on (as ``/health``), so every worker and replica
  leaves the Service at once;
- ``{"status":"not_ready","reason":"no_routable_backend"}`` while no route of any model
  can serve: before a ``vllm-pool`` has its first ready worker or a discovered ``vllm``
  backend its first server, when every such endpoint is down, or when every backend's
  circuit breaker is open (and inside its cooldown).

Cheap by contract: no upstream call per probe. It reads only what the gateway keeps
anyway (the draining flag, each backend's breaker, each pool's endpoint availability as
its supervisor or prober last saw it), in O(routes + endpoints). The server only listens
once every backend started (``cleanup_ctx``), so "before start-up" needs no flag here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from aiohttp import web

from gateway.flow.health import CircuitState
from gateway.flow.router import Route
from gateway.state import STATE, GatewayState

__all__ = ["is_ready", "ready"]

_JSON = "application/json"
_READY = b'{"status":"ready"}'
_DRAINING = b'{"status":"draining"}'
_NOT_READY = b'{"status":"not_ready","reason":"no_routable_backend"}'


class _Endpoint(Protocol):
    @property
    def available(self) -> bool: ...


class _Endpoints(Protocol):
    @property
    def endpoints(self) -> Sequence[_Endpoint]: ...


@runtime_checkable
class _SpreadsOverEndpoints(Protocol):
    """A backend over several servers (``vllm-pool``, ``vllm`` with ``base_urls``/``discovery``).

    Structural, so handlers import no concrete adapter.
    """

    @property
    def dispatcher(self) -> _Endpoints: ...


def _can_serve(route: Route) -> bool:
    breaker = route.guard.breaker
    if breaker.state is CircuitState.OPEN and breaker.retry_in() > 0:
        return False  # refused until the cooldown ends (then one trial goes through)
    backend = route.backend
    if isinstance(backend, _SpreadsOverEndpoints):
        return any(ep.available for ep in backend.dispatcher.endpoints)
    return True


def is_ready(state: GatewayState) -> bool:
    """Whether some model has a route that can take a request now (draining aside)."""
    return any(_can_serve(route) for entry in state.router.models.values() for route in entry.routes)


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        return web.Response(body=_DRAINING, status=503, content_type=_JSON)
    if not is_ready(state):
        return web.Response(body=_NOT_READY, status=503, content_type=_JSON)
    return web.Response(body=_READY, content_type=_JSON)

"""What one running gateway holds, reachable from handlers through a typed app key."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from backends.base import Backend
from gateway.conversations import ConversationStore
from gateway.flow.admission import Admission
from gateway.flow.router import BackendGuard, Router
from gateway.flow.service import CompletionService
from gateway.metrics import GatewayMetrics
from gateway.security.guard import RequestGuard
from schemas.config import GatewayConfig

if TYPE_CHECKING:
    from gateway.tracing import Tracing

__all__ = ["STATE", "GatewayState", "InFlight"]

_CANCEL_GRACE = 2.0  # seconds cancelled handlers get to write their last words


class Generation:
    """The requests that began under one config (``gateway.reload``): counted by the request
    middleware (``gateway.http.middleware``), so that what that config alone used is closed only
    after the last of them ended.

    A field of the state that a reload swaps, so a request counts in the one it began in
    without a middleware of its own (two integer updates per request)."""

    __slots__ = ("active", "idle")

    def __init__(self) -> None:
        self.active = 0
        self.idle: asyncio.Event | None = None  # made when the generation is retired

    def retire(self) -> None:
        self.idle = asyncio.Event()
        if not self.active:
            self.idle.set()


class InFlight:
    """The handler tasks serving completions now: what a drain waits for, then cancels.

    ``enter()``/``leave()`` bracket each completion request (a set add and discard).
    ``expired`` turns true when the drain deadline passed and the remaining tasks are
    being cancelled, so a handler can tell that cancellation from a client that left.
    """

    __slots__ = ("_tasks", "expired")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self.expired = False

    def __len__(self) -> int:
        return len(self._tasks)

    def enter(self, task: asyncio.Task[object]) -> None:
        """``task``: the one serving the request (aiohttp's ``request.task``)."""
        self._tasks.add(task)

    def leave(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)

    async def wait_idle(self, within: float) -> bool:
        """Wait until no request is in flight, at most ``within`` seconds; True if none is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            # Tasks outlive their request on keep-alive connections: wait for the set to empty.
            await asyncio.wait(list(self._tasks), timeout=min(remaining, 0.05))
        return True

    async def cancel_all(self, grace: float = _CANCEL_GRACE) -> None:
        self.expired = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)


@dataclass
class GatewayState:
    """Built in one phase by ``create_app``: every part is there before the first request."""

    config: GatewayConfig
    backends: dict[str, Backend]
    router: Router
    metrics: GatewayMetrics
    service: CompletionService
    admission: Admission
    # Auth, request caps, rate limits and audit (gateway.security.guard).
    request_guard: RequestGuard
    # Stored responses and conversations for POST /v1/responses (previous_response_id, store) and
    # GET/DELETE /v1/responses/{id} (gateway.conversations); a reload keeps it.
    responses_state: ConversationStore
    started_at: float
    in_flight: InFlight = field(default_factory=InFlight)
    # The requests begun under this config; a reload swaps in the new state's.
    generation: Generation = field(default_factory=Generation)
    draining: bool = False
    # OpenTelemetry traces (gateway.tracing); None: off, and the request path makes no tracing call.
    tracing: Tracing | None = None
    # Each backend's breaker, limiter and retry policy (what GET /admin/health shows of them).
    guards: Mapping[str, BackendGuard] = field(default_factory=dict)


STATE: web.AppKey[GatewayState] = web.AppKey("gateway_state", GatewayState)

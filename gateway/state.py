"""What one running gateway holds, reachable from handlers through a typed app key."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from backends.base import Backend
from gateway.flow.admission import Admission
from gateway.flow.router import Router
from gateway.flow.service import CompletionService
from gateway.metrics import GatewayMetrics
from schemas.config import GatewayConfig

if TYPE_CHECKING:  # gateway.security.guard imports this module
    from gateway.security.guard import RequestGuard

__all__ = ["REQUEST_ID", "STATE", "GatewayState", "InFlight", "request_id_of"]

# A typed request key (aiohttp >= 3.14), so request storage is checked like app storage.
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)


_CANCEL_GRACE = 2.0  # seconds cancelled handlers get to write their last words


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
    config: GatewayConfig
    backends: dict[str, Backend]
    router: Router
    metrics: GatewayMetrics
    service: CompletionService
    admission: Admission
    in_flight: InFlight = field(default_factory=InFlight)
    models_body: bytes = b""
    # Auth, cost caps, rate limits and audit (gateway.security.guard); set by create_app.
    request_guard: RequestGuard | None = None
    draining: bool = False
    started_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        created = int(self.started_at)
        self.models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": model.name, "object": "model", "created": created, "owned_by": "gateway"}
                    for model in self.config.models
                ],
            }
        )


STATE: web.AppKey[GatewayState] = web.AppKey("gateway_state", GatewayState)


# A random per-process prefix plus a counter: unique across replicas and restarts without a
# syscall per request (os.urandom showed up in profiles). Re-made in a forked child, which
# would otherwise repeat the parent's ids.
def _new_id_prefix() -> None:
    global _ID_PREFIX, _id_counter
    _ID_PREFIX = "req-" + os.urandom(6).hex()
    _id_counter = itertools.count(1)


_ID_PREFIX = ""
_id_counter = itertools.count(1)
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):08x}"


def request_id_of(request: web.Request) -> str:
    """The id set by the middleware (the client's ``x-request-id`` or a fresh one)."""
    rid = request.get(REQUEST_ID)
    return rid if isinstance(rid, str) else new_request_id()

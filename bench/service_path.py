"""CPU per request of the routing and resilience path when nothing fails, in process.

    .venv/bin/python bench/service_path.py

Runs the part of a completion request between the handler's parsing and the backend
call (priority header, gateway-wide admission slot, in-flight tracking, the router's
candidates, the service's attempt under breaker, bulkhead and retry policy) 200,000
times against a backend that answers at once, and prints the best of 7 rounds in
microseconds of CPU per request. No sockets, so it is steady on a busy machine; the
end-to-end cost of a request is ``bench/run.py``'s job.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from multidict import CIMultiDict

from backends.base import Backend, CompletionResult, CompletionStream, TokenUsage, UpstreamCall
from backends.capabilities import Capabilities, Level
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.flow.endpoints import OPS
from gateway.state import STATE
from schemas.completions import CompletionRequest
from schemas.endpoints import Endpoint

CONFIG = """
backends:
  - {name: a, type: mock}
models:
  - {name: m, routes: [{backend: a, model: x}]}
"""
RESULT = CompletionResult(b"{}", TokenUsage(1, 1))
ROUNDS, N = 7, 200_000


class Instant(Backend):
    kind: ClassVar[str] = "instant"

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        return RESULT

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        raise NotImplementedError


async def main() -> None:
    backend = Instant("a", Capabilities.of(Level.NATIVE))
    state = create_app(parse_config(CONFIG, env={}), backends={"a": backend})[STATE]
    request = CompletionRequest.model_validate({"model": "m", "prompt": "hi"})
    entry = state.router.lookup("m")
    ops = OPS[Endpoint.COMPLETIONS]
    headers = CIMultiDict({"content-type": "application/json"})
    limiter, in_flight, task = state.admission.limiter, state.in_flight, asyncio.current_task()
    assert task is not None
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.process_time()
        for _ in range(N):
            routes = state.router.candidates(entry, request, ops)
            priority = state.admission.priority_of(headers)
            in_flight.enter(task)
            if not limiter.try_acquire():
                await limiter.acquire(priority)
            try:
                await state.service.complete(ops, entry, routes, request, "rid", priority)
            finally:
                limiter.release()
                in_flight.leave(task)
        best = min(best, (time.process_time() - t0) / N * 1e6)
    print(f"routing and resilience path: {best:.2f} us CPU per request (best of {ROUNDS} x {N:,})")


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(main())
    else:
        uvloop.run(main())

"""A scriptable fake OpenAI/vLLM upstream: a real aiohttp server on loopback.

Tests queue behaviours (``FakeUpstream.script``); requests with nothing queued
get ``FakeUpstream.default(body)`` when set (random faults for soak runs), else a
normal, deterministic completion. It records every request it received (body and
headers), counts TCP connections (seen, and open now), requests in progress and
requests whose client (the gateway) hung up, so tests can assert on the upstream's
side that connections were reused or closed and work was cancelled. It can also
refuse connections for a while (``go_down``/``come_up``, same port) and fail its
health endpoints (``healthy = False``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

__all__ = ["Behaviour", "FakeUpstream"]


@dataclass
class Behaviour:
    """What the fake does with one request.

    kind: ``ok`` (normal answer), ``status`` (answer ``status`` with ``body``),
    ``reset`` (drop the connection before answering), ``cut`` (stream ``events``
    chunks then drop the connection), ``stall`` (sleep ``delay`` before answering),
    ``stall_mid`` (stream ``events`` chunks then sleep ``delay``), ``garbage``
    (200 with a non-JSON body), ``error_event`` (stream ``events`` chunks then an
    error event and [DONE]), ``garbage_event`` (stream ``events`` chunks then an event
    that is not JSON, then [DONE]). ``delay`` on ``ok`` paces stream chunks.
    """

    kind: str = "ok"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: int = 0
    delay: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class FakeUpstream:
    def __init__(self, *, model_field: str | None = None, spaced_json: bool = False) -> None:
        self.requests: list[Seen] = []
        self.script: deque[Behaviour] = deque()
        self._peers: set[Any] = set()
        self.open_streams = 0
        self.cancelled_streams = 0
        self.active = 0  # completion requests being handled now
        self.cancelled = 0  # completion requests whose client hung up before the answer was complete
        self.health_checks = 0
        self.healthy = True  # False: /health and /v1/models answer 503
        # Chooses the behaviour of a request when ``script`` is empty (None: a normal answer).
        self.default: Callable[[dict[str, Any]], Behaviour] | None = None
        self._site: web.TCPSite | None = None
        self._model_field = model_field
        self._spaced = spaced_json
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def go_down(self) -> None:
        """Stop listening (new connections are refused) and drop every open connection."""
        assert self._runner is not None and self._site is not None
        await self._site.stop()
        self._site = None
        server = self._runner.server
        if server is not None:
            for handler in server.connections:
                handler.force_close()
        await asyncio.sleep(0)

    async def come_up(self) -> None:
        """Listen again on the same port."""
        assert self._runner is not None and self._site is None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    @property
    def connections(self) -> int:
        """Distinct client connections seen (by peer address and port)."""
        return len(self._peers)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- answers ----------------------------------------------------------------------
    def _dumps(self, obj: Any) -> bytes:
        if self._spaced:
            import json

            return json.dumps(obj).encode()
        return orjson.dumps(obj)

    def completion(self, body: dict[str, Any], *, text: str = " hello world") -> dict[str, Any]:
        n = int(body.get("n") or 1)
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": "length"} for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n, "total_tokens": 3 + 2 * n},
        }

    def chunk(self, body: dict[str, Any], text: str, finish: str | None = None) -> bytes:
        obj = {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 1,
            "model": body.get("model"),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }
        return b"data: " + self._dumps(obj) + b"\n\n"

    async def _models(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        if not self.healthy:
            return web.json_response({"error": {"message": "down"}}, status=503)
        return web.json_response({"object": "list", "data": [{"id": "up-model", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        hung_up = True
        try:
            response = await self._answer(request)
            hung_up = False
            if response is None:  # ``reset``: no answer at all
                raise asyncio.CancelledError
            return response
        except asyncio.CancelledError:
            if hung_up:
                self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse | None:
        raw = await request.read()
        if request.transport is not None:
            self._peers.add(request.transport.get_extra_info("peername"))
        body = orjson.loads(raw)
        self.requests.append(Seen(request.path, dict(request.headers), body))
        if self.script:
            behaviour = self.script.popleft()
        elif self.default is not None:
            behaviour = self.default(body)
        else:
            behaviour = Behaviour()
        if behaviour.kind == "reset":
            assert request.transport is not None
            request.transport.abort()
            return None
        if behaviour.kind == "stall":
            await asyncio.sleep(behaviour.delay)
        if behaviour.kind == "status":
            payload = behaviour.body if isinstance(behaviour.body, bytes) else orjson.dumps(behaviour.body)
            return web.Response(
                body=payload, status=behaviour.status, headers=behaviour.headers, content_type="application/json"
            )
        if behaviour.kind == "garbage":
            return web.Response(body=b"<html>oops</html>", content_type="text/html")
        if not body.get("stream"):
            return web.Response(body=self._dumps(self.completion(body)), content_type="application/json")
        return await self._stream(request, body, behaviour)

    async def _stream(self, request: web.Request, body: dict[str, Any], behaviour: Behaviour) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open_streams += 1
        tokens = int(body.get("max_tokens") or 16)
        try:
            for i in range(tokens):
                if behaviour.kind in ("cut", "stall_mid", "error_event", "garbage_event") and i == behaviour.events:
                    if behaviour.kind == "cut":
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    if behaviour.kind == "stall_mid":
                        await asyncio.sleep(behaviour.delay)
                    if behaviour.kind == "error_event":
                        err = {
                            "error": {
                                "message": "engine died",
                                "type": "InternalServerError",
                                "param": None,
                                "code": 500,
                            }
                        }
                        await resp.write(b"data: " + orjson.dumps(err) + b"\n\ndata: [DONE]\n\n")
                        return resp
                    if behaviour.kind == "garbage_event":
                        await resp.write(b"data: {not json at all\n\ndata: [DONE]\n\n")
                        return resp
                finish = "length" if i == tokens - 1 else None
                await resp.write(self.chunk(body, f" t{i}", finish))
                if behaviour.delay and behaviour.kind == "ok":
                    await asyncio.sleep(behaviour.delay)
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                usage = {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "created": 1,
                    "model": body.get("model"),
                    "choices": [],
                    "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
                }
                await resp.write(b"data: " + self._dumps(usage) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        finally:
            self.open_streams -= 1
        return resp

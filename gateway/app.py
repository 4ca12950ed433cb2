"""The aiohttp application factory and its lifecycle.

``create_app(config)`` builds everything from a validated config; tests build
the same app with a test config (and may pass ready-made backends). Backends
start in ``cleanup_ctx`` before the first request and close after the last.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from backends.base import Backend
from backends.registry import build_backends
from gateway import handlers
from gateway.metrics import GatewayMetrics
from gateway.middleware import request_middleware
from gateway.router import Router
from gateway.service import CompletionService
from gateway.state import STATE, GatewayState
from schemas.config import GatewayConfig

__all__ = ["create_app"]


def create_app(config: GatewayConfig, *, backends: Mapping[str, Backend] | None = None) -> web.Application:
    built = dict(backends) if backends is not None else build_backends(config.backends)
    metrics = GatewayMetrics((m.name for m in config.models), built)
    state = GatewayState(
        config=config,
        backends=built,
        router=Router(config, built),
        metrics=metrics,
        service=CompletionService(metrics),
    )
    app = web.Application(client_max_size=config.server.max_body_bytes, middlewares=[request_middleware])
    app[STATE] = state
    app.cleanup_ctx.append(_backends_lifecycle)
    app.on_shutdown.append(_start_draining)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)
    return app


async def _backends_lifecycle(app: web.Application) -> AsyncIterator[None]:
    backends = list(app[STATE].backends.values())
    started: list[Backend] = []
    try:
        for backend in backends:
            await backend.start()
            started.append(backend)
        yield
    finally:
        for backend in started:
            await backend.close()


async def _start_draining(app: web.Application) -> None:
    app[STATE].draining = True

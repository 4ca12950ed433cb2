"""The aiohttp application factory and its lifecycle.

``create_app(config)`` builds everything from a validated config; tests build
the same app with a test config (and may pass ready-made backends, or a fake
:class:`~gateway.clock.Clock` so backoffs and cooldowns take no real time).
Backends start in ``cleanup_ctx`` before the first request and close after the
last; health probes run between the two.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from backends.base import Backend
from backends.registry import build_backends, metric_collectors
from backends.transport.egress import warn_unverified
from gateway.clock import Clock
from gateway.configfile import ConfigError
from gateway.conversations import ConversationStore
from gateway.flow.admission import Admission, Limiter
from gateway.flow.health import CircuitBreaker, HealthProber
from gateway.flow.retry import RetryPolicy
from gateway.flow.router import BackendGuard, Router, endpoint_problems
from gateway.flow.service import CompletionService
from gateway.http import handlers
from gateway.http.admin import ADMIN_ROUTES
from gateway.http.explorer import add_explorer_routes
from gateway.http.hardening import handler_args, register_secrets
from gateway.http.middleware import expect_handler, request_middleware
from gateway.http.openapi import openapi_handler
from gateway.http.probes import ready
from gateway.http.stored_responses import delete_response, list_input_items, retrieve_response
from gateway.metrics import GatewayMetrics
from gateway.security.auth import protect
from gateway.security.guard import RequestGuard
from gateway.state import STATE, GatewayState
from gateway.tracing import SettingsError, TracingRuntime, resolve, trace_problems
from gateway.tracing import build as build_tracing
from schemas.config import GatewayConfig
from schemas.endpoints import ENDPOINT_ALIASES, ENDPOINT_PATHS

__all__ = ["PROBER", "TRACING", "backend_guards", "build_state", "check_endpoints", "create_app"]

PROBER: web.AppKey[HealthProber] = web.AppKey("gateway_prober", HealthProber)
TRACING: web.AppKey[TracingRuntime] = web.AppKey("gateway_tracing", TracingRuntime)


def create_app(
    config: GatewayConfig,
    *,
    backends: Mapping[str, Backend] | None = None,
    clock: Clock | None = None,
    env: Mapping[str, str] | None = None,
    workers: int = 1,
) -> web.Application:
    """The gateway for ``config``; ``env`` (default: the process's) holds the standard ``OTEL_*`` variables."""
    env = os.environ if env is None else env
    problems = trace_problems(config, env)  # before anything starts: tracing asked for and impossible
    if problems:
        raise ConfigError("<config>", problems)
    register_secrets(config)  # error bodies never carry them (gateway.http.hardening.redact)
    warn_unverified(config.backends, "start-up")
    built = dict(backends) if backends is not None else build_backends(config.backends)
    check_endpoints(config, built)
    keys = [k.name for k in config.auth.keys] if config.auth is not None else []
    metrics = GatewayMetrics((m.name for m in config.models), built, keys=keys, collectors=metric_collectors(built))
    clock = clock if clock is not None else Clock()
    guards = backend_guards(config, metrics, clock)
    # ``workers``: the processes serving this config (``gateway serve --workers N``); N in-memory
    # conversation stores would split conversations, so then only a Redis one keeps them.
    conversations = ConversationStore.from_config(config.responses, metrics, workers=workers)
    state = build_state(config, built, guards, metrics, clock, started_at=time.time(), responses_state=conversations)
    guard = state.request_guard
    try:
        tracing = build_tracing(resolve(config, env), metrics.registry)
    except SettingsError as exc:  # pragma: no cover - trace_problems reported it above
        raise ConfigError("<config>", [(exc.path, exc.message)]) from None
    prober = HealthProber(
        (built[b.name], guards[b.name].breaker, b.health_check) for b in config.backends if b.health_check is not None
    )
    app = web.Application(
        client_max_size=config.server.max_body_bytes,
        middlewares=[request_middleware(state)],
        handler_args=handler_args(config.server),  # header limits and the slow-header timeout
    )
    app[STATE] = state
    app.cleanup_ctx.append(_backends_lifecycle)
    app[PROBER] = prober
    app.cleanup_ctx.append(_probes_lifecycle)
    app.on_shutdown.append(_start_draining)
    if tracing is not None:
        state.tracing = tracing.tracing
        app[TRACING] = tracing
        app.on_cleanup.append(_stop_tracing)
    _add_routes(app, config, guard)
    return app


async def _stop_tracing(app: web.Application) -> None:
    """Export what the last requests left (at most 2 s: a dead collector does not hold the exit)."""
    await asyncio.to_thread(app[TRACING].shutdown, 2.0)


def build_state(
    config: GatewayConfig,
    built: dict[str, Backend],
    guards: Mapping[str, BackendGuard],
    metrics: GatewayMetrics,
    clock: Clock,
    *,
    started_at: float,
    request_guard: RequestGuard | None = None,
    admission: Admission | None = None,
    responses_state: ConversationStore | None = None,
    previous_guard: RequestGuard | None = None,
) -> GatewayState:
    """Everything a request reads, from ``config`` over ready-made backends and their guards.

    ``create_app`` calls it once; ``gateway.reload`` again on SIGHUP, passing the running
    request guard and admission when their config did not change (their counts carry over), else
    the guard it replaces as ``previous_guard`` (what it keeps in memory, such as spend, carries over),
    and always the running conversation store (``responses_state``; None builds one from the config).
    """
    # Auth, request caps, rate limits, audit: see gateway.security.guard (nothing per request when off).
    if request_guard is None:
        request_guard = RequestGuard.from_config(config, metrics, previous_guard)
    router = Router(config, built, guards)
    metrics.serve({name: entry.served for name, entry in router.models.items()})
    return GatewayState(
        config=config,
        backends=built,
        router=router,
        metrics=metrics,
        service=CompletionService(metrics, clock),
        admission=admission if admission is not None else Admission(config.server.admission, metrics),
        request_guard=request_guard,
        started_at=started_at,
        responses_state=(
            responses_state if responses_state is not None else ConversationStore.from_config(config.responses, metrics)
        ),
        guards=guards,
    )


def check_endpoints(config: GatewayConfig, backends: Mapping[str, Backend]) -> None:
    """Refuse to start when ``models[].endpoints`` names an endpoint no route's backend serves.

    Raises :class:`~gateway.configfile.ConfigError` with the YAML path. What a backend serves is
    its adapter's ``endpoints`` (a family gains chat by declaring it), never a list kept here.
    """
    problems = endpoint_problems(config, lambda name: backends[name].endpoints)
    if problems:
        raise ConfigError("<config>", problems)


def _add_routes(app: web.Application, config: GatewayConfig, guard: RequestGuard) -> None:
    """The endpoints; the security wrappers and hooks only where the config turns them on."""
    for endpoint, path in ENDPOINT_PATHS.items():
        for each in (path, *ENDPOINT_ALIASES.get(endpoint, ())):
            app.router.add_post(each, handlers.HANDLERS[endpoint], expect_handler=expect_handler)
    app.router.add_get("/v1/models", handlers.list_models)
    app.router.add_get("/v1/models/{model:.+}", handlers.retrieve_model)  # ids may hold slashes (org/name)
    app.router.add_get("/version", handlers.version)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/ready", ready)  # readiness, separate from liveness: gateway.http.probes
    metrics_digest = guard.keyring.metrics_digest if guard.keyring is not None else None
    app.router.add_get("/metrics", protect(handlers.metrics, metrics_digest) if metrics_digest else handlers.metrics)
    app.router.add_get("/openapi.json", openapi_handler(config, guard.keyring))
    if config.server.api_explorer:
        add_explorer_routes(app)  # GET /docs: Swagger UI over /openapi.json (gateway.http.explorer)
    app.router.add_get("/v1/responses/{response_id}", retrieve_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.on_cleanup.append(_close_conversations)
    for path, handler in ADMIN_ROUTES:  # behind auth.admin_key when auth is on: gateway.http.admin
        app.router.add_get(path, handler)
    if guard.store is not None:
        app.on_response_prepare.append(guard.on_prepare)
    # The running guard's stores (rate limits, spend: what it has not sent yet) close last, whatever
    # a reload put in place since start-up.
    app.on_cleanup.append(_close_guard)


async def _close_conversations(app: web.Application) -> None:
    await app[STATE].responses_state.close()


async def _close_guard(app: web.Application) -> None:
    await app[STATE].request_guard.close()


def backend_guards(config: GatewayConfig, metrics: GatewayMetrics, clock: Clock) -> dict[str, BackendGuard]:
    """One breaker, limiter and retry policy per backend, shared by every route to it."""
    admission = config.server.admission
    return {
        b.name: BackendGuard(
            breaker=CircuitBreaker(b.name, b.circuit_breaker, clock, metrics.circuit_changed),
            limiter=Limiter(
                b.name,
                b.max_concurrency,
                queue_size=admission.queue_size,
                timeout=admission.queue_timeout,
                metrics=metrics,
            ),
            retry=RetryPolicy.from_config(b.retry, clock),
        )
        for b in config.backends
    }


async def _backends_lifecycle(app: web.Application) -> AsyncIterator[None]:
    backends = list(app[STATE].backends.values())
    started: list[Backend] = []
    try:
        for backend in backends:
            await backend.start()
            started.append(backend)
        yield
        started = list(app[STATE].backends.values())  # a reload may have swapped them (gateway.reload)
    finally:
        for backend in started:
            await backend.close()


async def _start_draining(app: web.Application) -> None:
    app[STATE].draining = True


async def _probes_lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Probes run while the backends are up: registered after them, so they stop first."""
    prober = app[PROBER]
    prober.start()
    try:
        yield
    finally:
        await prober.close()

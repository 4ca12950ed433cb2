"""HTTP handlers: parse, call the service, write JSON or SSE. Nothing else lives here.

Errors are raised as ``GatewayError`` and rendered once by ``gateway.http.middleware``;
handlers only record metrics around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import NoReturn

import orjson
from aiohttp import web

from backends.errors import UpstreamError
from gateway.flow.router import ModelEntry, Route
from gateway.http.hardening import read_body, redact
from gateway.http.validation import parse_completion_request
from gateway.security.guard import Ticket
from gateway.state import STATE, GatewayState, request_id_of
from schemas.completions import CompletionRequest
from schemas.errors import GatewayError, ServiceUnavailableError, UnsupportedParameterError

__all__ = ["completions", "health", "list_models", "metrics"]

log = logging.getLogger("gateway")

_JSON = "application/json"
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell nginx-like proxies in front of us not to buffer
}


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    metrics = state.metrics
    loop = asyncio.get_running_loop()
    started = loop.time()
    rid = request_id_of(request)
    body = await read_body(request, state.config.server.client_body_timeout)
    model: str | None = None
    try:
        req = parse_completion_request(body)
        entry = state.router.lookup(req.model)
        model = entry.name
        # Key permissions, cost caps, rate limits (gateway.security.guard); settled when the request ends.
        guard = state.request_guard
        ticket = await guard.admit(request, req, model) if guard is not None else None
        routes = state.router.candidates(entry, req)
        priority = state.admission.priority_of(request.headers)
    except UnsupportedParameterError as exc:
        metrics.unsupported_parameter(exc.backend, exc.param or "")
        metrics.request_finished(model, None, exc.status, None)
        raise
    except GatewayError as exc:
        metrics.request_finished(model, None, exc.status, None)
        raise

    metrics.request_started(entry.name)
    task = request.task
    state.in_flight.enter(task)
    limiter = state.admission.limiter
    try:
        try:
            if not limiter.try_acquire():  # the common case takes a slot without a coroutine
                await limiter.acquire(priority)
        except GatewayError as exc:  # the gateway is saturated: 429
            metrics.request_finished(entry.name, None, exc.status, loop.time() - started)
            raise
        except asyncio.CancelledError:
            _cancelled(state, entry.name, None, started)
        try:
            if req.stream:
                return await _stream(request, state, entry, routes, req, rid, priority, started, ticket)
            return await _complete(state, entry, routes, req, rid, priority, started, ticket)
        finally:
            limiter.release()
    finally:
        state.in_flight.leave(task)
        metrics.request_ended(entry.name)


def _cancelled(state: GatewayState, model: str, backend: str | None, started: float) -> NoReturn:
    """Account for a cancelled request and end it: a client that left (499), or the drain deadline (503)."""
    seconds = asyncio.get_running_loop().time() - started
    if state.in_flight.expired:
        # Our own drain cancelled it: the client is still there and gets a 503 it can retry elsewhere.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        state.metrics.request_finished(model, backend, 503, seconds)
        raise _shutting_down()
    state.metrics.client_disconnected(model, backend)
    state.metrics.request_finished(model, backend, 499, seconds)  # nginx's "client closed request"
    raise asyncio.CancelledError


def _shutting_down() -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "the gateway is shutting down; retry the request", code="gateway_shutting_down", retry_after=1.0
    )


async def _complete(
    state: GatewayState,
    entry: ModelEntry,
    routes: list[Route],
    req: CompletionRequest,
    rid: str,
    priority: int,
    started: float,
    ticket: Ticket | None,
) -> web.Response:
    metrics = state.metrics
    loop = asyncio.get_running_loop()
    try:
        result, route = await state.service.complete(entry, routes, req, rid, priority)
    except GatewayError as exc:
        metrics.request_finished(entry.name, getattr(exc, "backend", None), exc.status, loop.time() - started)
        raise
    except asyncio.CancelledError:
        _cancelled(state, entry.name, None, started)
    except Exception:  # a bug: the middleware logs it and answers 500
        metrics.request_finished(entry.name, None, 500, loop.time() - started)
        raise
    backend = route.backend.name
    if result.usage is not None:
        metrics.tokens(entry.name, backend, result.usage.prompt_tokens, result.usage.completion_tokens)
    metrics.request_finished(entry.name, backend, 200, loop.time() - started)
    if ticket is not None:
        ticket.record(backend, 200, result.usage)
    return web.Response(body=result.body, content_type=_JSON, headers={"x-request-id": rid})


async def _stream(
    request: web.Request,
    state: GatewayState,
    entry: ModelEntry,
    routes: list[Route],
    req: CompletionRequest,
    rid: str,
    priority: int,
    started: float,
    ticket: Ticket | None,
) -> web.StreamResponse:
    metrics = state.metrics
    model = entry.name
    loop = asyncio.get_running_loop()
    try:
        opened = await state.service.open_stream(entry, routes, req, rid, priority)
    except GatewayError as exc:
        metrics.request_finished(model, getattr(exc, "backend", None), exc.status, loop.time() - started)
        raise
    except asyncio.CancelledError:
        _cancelled(state, model, None, started)
    except Exception:  # a bug: the middleware logs it and answers 500
        metrics.request_finished(model, None, 500, loop.time() - started)
        raise
    backend = opened.route.backend.name
    stream = opened.stream
    status = 200
    response = web.StreamResponse(headers={**_SSE_HEADERS, "x-request-id": rid})
    try:
        await response.prepare(request)
        # When the upstream has already finished, the chunk, [DONE] and the end of the
        # body leave in one write (one syscall instead of three for short streams).
        if stream.finished:
            await response.write_eof(opened.first + _DONE)
            metrics.first_token(model, backend, loop.time() - started)
            return response
        if opened.first:
            await response.write(opened.first)
        metrics.first_token(model, backend, loop.time() - started)
        tail = _DONE
        try:
            async for chunk in stream:
                if stream.finished:
                    tail = chunk + _DONE
                    break
                await response.write(chunk)
        except UpstreamError as exc:
            # After the first byte nothing is retried: say what happened, then end cleanly.
            status = exc.status
            opened.failed(exc)
            metrics.upstream_error(backend, exc.reason)
            metrics.stream_failed(model, backend, exc.reason)
            tail = _error_event(exc)
        except ConnectionResetError:
            raise
        except Exception as exc:
            # Not an upstream failure but a bug. The response has started, so the middleware
            # can no longer answer (it would write a second response into this body): log it
            # and end the stream here, the same way as an upstream failure.
            log.exception("unexpected error while streaming %s (request %s)", request.path, rid)
            error = (
                exc
                if isinstance(exc, GatewayError)
                else GatewayError("The gateway failed to process the request; see its log.", code="internal_error")
            )
            status = error.status
            metrics.stream_failed(model, backend, "internal")
            tail = _error_event(error)
        await response.write_eof(tail)
    except asyncio.CancelledError:
        if not state.in_flight.expired:
            metrics.client_disconnected(model, backend)
            status = 499  # nginx's "client closed request"
            raise
        # The drain deadline passed: end the stream with an error the client can act on, not a bare cut.
        status = 503
        metrics.stream_failed(model, backend, "shutdown")
        if response.prepared:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await response.write_eof(_error_event(_shutting_down()))
        raise
    except ConnectionResetError:
        metrics.client_disconnected(model, backend)
        status = 499
        raise
    finally:
        await opened.aclose()
        usage = stream.usage
        if usage is not None:
            metrics.tokens(model, backend, usage.prompt_tokens, usage.completion_tokens)
        metrics.request_finished(model, backend, status, loop.time() - started)
        if ticket is not None:
            ticket.record(backend, status, usage)
    return response


def _error_event(error: GatewayError) -> bytes:
    return b"data: " + redact(orjson.dumps(error.envelope())) + b"\n\n" + _DONE


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(body=state.models_body, content_type=_JSON)


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        return web.Response(body=b'{"status":"draining"}', status=503, content_type=_JSON)
    return web.Response(body=b'{"status":"ok"}', content_type=_JSON)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(
        body=state.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )

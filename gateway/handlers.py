"""HTTP handlers: parse, call the service, write JSON or SSE. Nothing else lives here.

Errors are raised as ``GatewayError`` and rendered once by ``gateway.middleware``;
handlers only record metrics around them.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from aiohttp import web

from backends.errors import UpstreamError
from gateway.state import STATE, GatewayState, request_id_of
from gateway.validation import parse_completion_request
from schemas.completions import CompletionRequest
from schemas.errors import GatewayError, UnsupportedParameterError

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
    body = await request.read()
    model: str | None = None
    try:
        req = parse_completion_request(body)
        entry = state.router.lookup(req.model)
        model = entry.name
        routes = state.router.candidates(entry, req)
    except UnsupportedParameterError as exc:
        metrics.unsupported_parameter(exc.backend, exc.param or "")
        metrics.request_finished(model, None, exc.status, None)
        raise
    except GatewayError as exc:
        metrics.request_finished(model, None, exc.status, None)
        raise

    metrics.request_started(entry.name)
    try:
        if req.stream:
            return await _stream(request, state, entry.name, routes, req, rid, started)
        try:
            result, route = await state.service.complete(entry, routes, req, rid)
        except GatewayError as exc:
            metrics.request_finished(entry.name, getattr(exc, "backend", None), exc.status, loop.time() - started)
            raise
        except asyncio.CancelledError:
            metrics.client_disconnected(entry.name, None)
            metrics.request_finished(entry.name, None, 499, loop.time() - started)
            raise
        except Exception:  # a bug: the middleware logs it and answers 500
            metrics.request_finished(entry.name, None, 500, loop.time() - started)
            raise
        backend = route.backend.name
        if result.usage is not None:
            metrics.tokens(entry.name, backend, result.usage.prompt_tokens, result.usage.completion_tokens)
        metrics.request_finished(entry.name, backend, 200, loop.time() - started)
        return web.Response(body=result.body, content_type=_JSON, headers={"x-request-id": rid})
    finally:
        metrics.request_ended(entry.name)


async def _stream(
    request: web.Request,
    state: GatewayState,
    model: str,
    routes: list,  # type: ignore[type-arg]
    req: CompletionRequest,
    rid: str,
    started: float,
) -> web.StreamResponse:
    metrics = state.metrics
    loop = asyncio.get_running_loop()
    try:
        opened = await state.service.open_stream(state.router.models[model], routes, req, rid)
    except GatewayError as exc:
        metrics.request_finished(model, getattr(exc, "backend", None), exc.status, loop.time() - started)
        raise
    except asyncio.CancelledError:
        metrics.client_disconnected(model, None)
        metrics.request_finished(model, None, 499, loop.time() - started)
        raise
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
            metrics.upstream_error(backend, exc.reason)
            metrics.stream_failed(model, backend, exc.reason)
            tail = b"data: " + orjson.dumps(exc.envelope()) + b"\n\n" + _DONE
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
            tail = b"data: " + orjson.dumps(error.envelope()) + b"\n\n" + _DONE
        await response.write_eof(tail)
    except (ConnectionResetError, asyncio.CancelledError):
        metrics.client_disconnected(model, backend)
        status = 499  # nginx's "client closed request"
        raise
    finally:
        await stream.aclose()
        usage = stream.usage
        if usage is not None:
            metrics.tokens(model, backend, usage.prompt_tokens, usage.completion_tokens)
        metrics.request_finished(model, backend, status, loop.time() - started)
    return response


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

"""HTTP handlers: parse, call the service, write JSON or SSE. Nothing else lives here.

``POST /v1/completions``, ``POST /v1/chat/completions`` and ``POST /v1/responses`` are one path,
:func:`serve`, bound to an endpoint (:func:`endpoint_handler`): only the parse differs
(:data:`PARSERS`); everything after it sees the request through
:class:`~gateway.flow.endpoints.ServedRequest` and the endpoint's
:class:`~gateway.flow.endpoints.EndpointOps` (for Responses also its ``turns``: the
conversation state before and after the call, the built-in-tools header).

Errors are raised as ``GatewayError`` and rendered once by ``gateway.http.middleware``;
what each request was and cost goes into its :class:`gateway.accounting.RequestRecord`,
closed once when the handler ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from time import monotonic
from types import MappingProxyType
from typing import Any, NoReturn

import orjson
from aiohttp import web

from backends.base import ROUTING_SESSION, CompletionStream
from backends.errors import UpstreamError
from gateway.accounting import RequestRecord
from gateway.catalog import model_list, model_object
from gateway.flow.endpoints import OPS, EndpointOps
from gateway.flow.opened import OpenedStream
from gateway.flow.responses_turns import StreamEnd
from gateway.http.hardening import read_body, redact
from gateway.http.request_id import request_id_of
from gateway.http.validation import (
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_embedding_request,
    parse_rerank_request,
    parse_responses_request,
    parse_tokenize_request,
)
from gateway.served import ServedRequest
from gateway.state import STATE, GatewayState
from gateway.version import gateway_version
from schemas.endpoints import Endpoint
from schemas.errors import GatewayError, NotFoundError, ServiceUnavailableError, UnsupportedParameterError

__all__ = [
    "HANDLERS",
    "PARSERS",
    "chat_completions",
    "completions",
    "detokenize",
    "embeddings",
    "endpoint_handler",
    "health",
    "list_models",
    "metrics",
    "rerank",
    "responses",
    "retrieve_model",
    "serve",
    "tokenize",
    "version",
]

# The one thing each endpoint does its own way at the door: the schema its body must match.
PARSERS: Mapping[Endpoint, Callable[[bytes], Any]] = MappingProxyType(
    {
        Endpoint.COMPLETIONS: parse_completion_request,
        Endpoint.CHAT: parse_chat_request,
        Endpoint.EMBEDDINGS: parse_embedding_request,
        Endpoint.RERANK: parse_rerank_request,
        Endpoint.RESPONSES: parse_responses_request,
        Endpoint.TOKENIZE: parse_tokenize_request,
        Endpoint.DETOKENIZE: parse_detokenize_request,
    }
)

log = logging.getLogger("gateway")

_JSON = "application/json"
_VERSION = orjson.dumps({"version": gateway_version()})
_EVENT = b"data: "  # an SSE event's start: each carries at least one generated token of one choice
_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell nginx-like proxies in front of us not to buffer
}


def endpoint_handler(endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of ``endpoint``: :func:`serve` bound to it.

    A ``partial``, not a wrapping coroutine: aiohttp sees a coroutine function all the same,
    and each request saves a coroutine (an allocation the collector tracks) and its frames.
    """
    handler = functools.partial(serve, endpoint=endpoint)
    handler.__name__ = handler.__qualname__ = f"serve_{endpoint.value}"  # type: ignore[attr-defined]
    return handler


async def serve(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """A request on ``endpoint``: every answer, refusals included, is accounted once by its record.

    One coroutine for the whole request (not an accounting wrapper around a body): each
    coroutine level costs a frame per resumption, on every request.
    """
    state = request.app[STATE]
    guard = state.request_guard
    record = RequestRecord(state.metrics, guard.audit, request_id_of(request), endpoint)
    tracing = state.tracing
    status = 500  # a bug: the middleware answers 500
    body = b""
    try:
        if tracing is not None:  # off: no tracing call at all (gateway.tracing)
            record.trace = tracing.start(request, endpoint)
        if guard.keyring is not None:  # auth off: there is no key to find
            record.key = guard.identify(request)
        body = await read_body(request, state.config.server.client_body_timeout)
        ops = OPS[endpoint]
        try:
            # Everything that can refuse the request without an upstream, before the key's budget is touched.
            req: ServedRequest = PARSERS[endpoint](body)
            record.request = req
            record.user = req.user
            if record.trace is not None:
                record.trace.request = req
            entry = state.router.lookup(req.model)
            record.model = entry.name
            turns = ops.turns
            if turns is not None:  # Responses: the stored turns, the model's built-in tools policy
                continuing = turns.begin_now(req, entry, state.responses_state, record.key)
                if continuing is not None:  # previous_response_id: the stored turns read (a first turn has none)
                    req = await continuing
            # The caps may give a request without max tokens the cap as its limit (a new request).
            if record.key is None:
                req = guard.caps.check(req)  # no key: the deployment's caps alone
            else:
                req = guard.check(record.key, req, entry.name)
            if record.trace is not None:
                record.trace.request = req
            routes = state.router.candidates(entry, req, ops)
            priority = state.admission.priority_of(request.headers)
            ROUTING_SESSION.set(request.headers.get("x-session-id"))  # a routing hint (backends.base)
        except UnsupportedParameterError as exc:
            state.metrics.unsupported_parameter(exc.backend, exc.param or "", endpoint=endpoint)
            raise
        ledger = guard.ledger
        if ledger is not None and record.key is not None:  # auth on: the key's spend is counted
            record.ledger = ledger
            if record.key.name in ledger.budgets:
                await guard.check_budget(record.key)
        if guard.store is not None:  # no store: no key has limits, nothing to reserve
            record.reservation, record.prompt_estimate = await guard.reserve(request, record.key, req)
        metrics = state.metrics
        metrics.request_started(entry.name, endpoint=endpoint)
        task = request.task
        state.in_flight.enter(task)
        limiter = state.admission.limiter
        try:
            try:
                if not limiter.try_acquire():  # the common case takes a slot without a coroutine
                    await limiter.acquire(priority)
            except asyncio.CancelledError:
                _cancelled(state)
            try:
                service = state.service
                try:
                    if req.stream:
                        opened = await service.open_stream(ops, entry, routes, req, record.request_id, priority, record)
                    else:
                        result, route = await service.complete(
                            ops, entry, routes, req, record.request_id, priority, record
                        )
                except asyncio.CancelledError:
                    _cancelled(state)  # before an answer: a cancel while relaying one is _stream's to end
                if req.stream:
                    headers = end = None
                    if turns is not None:
                        headers = turns.headers(req, opened.route.backend)
                        end = StreamEnd(turns, req, opened.stream, state.responses_state, record.key)
                    try:
                        response = await _stream(request, state, ops, entry.name, opened, record, headers, end)
                    finally:
                        if end is not None and not end.done:
                            await end()  # a stream cut short: kept as it stood (cancelled)
                else:
                    record.backend = route.backend.name
                    record.usage = result.usage
                    headers = {"x-request-id": record.request_id}
                    if result.headers:  # vLLM's binary embeddings carry their metadata in a header
                        headers.update(result.headers)
                    if turns is not None:
                        extra = turns.headers(req, route.backend)
                        if extra:  # most turns add none: no update call
                            headers.update(extra)
                        dumped = result.body if result.dumped else None  # the store's record is cut from it
                        saving = turns.end_now(
                            req, result.answer, state.responses_state, record.key, dumped, result.output_at
                        )
                        if saving is not None:  # (the memory store saved it already: nothing to await)
                            await saving
                    response = web.Response(body=result.body, content_type=result.content_type, headers=headers)
            finally:
                limiter.release()
        finally:
            state.in_flight.leave(task)
            metrics.request_ended(entry.name, endpoint=endpoint)
        status = record.status or response.status
        return response
    except GatewayError as exc:
        status = exc.status
        record.error = exc
        if record.backend is None and isinstance(exc, UpstreamError):
            record.backend = exc.backend or None  # the backend whose failure is the answer
        elif record.model is None and body:  # refused before the lookup: a body that failed its schema
            record.model = _named_model(body, state)
        raise
    except web.HTTPException as exc:  # aiohttp's own answers: the body limit's 413
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 503 if state.in_flight.expired else 499
        raise
    except ConnectionResetError:
        status = 499
        raise
    finally:
        record.close(status)


completions = endpoint_handler(Endpoint.COMPLETIONS)  # POST /v1/completions
chat_completions = endpoint_handler(Endpoint.CHAT)  # POST /v1/chat/completions
embeddings = endpoint_handler(Endpoint.EMBEDDINGS)  # POST /v1/embeddings
rerank = endpoint_handler(Endpoint.RERANK)  # POST /v1/rerank, /v2/rerank, /rerank
responses = endpoint_handler(Endpoint.RESPONSES)  # POST /v1/responses
tokenize = endpoint_handler(Endpoint.TOKENIZE)  # POST /tokenize (vLLM's API)
detokenize = endpoint_handler(Endpoint.DETOKENIZE)  # POST /detokenize (vLLM's API)
HANDLERS: Mapping[Endpoint, Callable[[web.Request], Awaitable[web.StreamResponse]]] = MappingProxyType(
    {Endpoint.COMPLETIONS: completions, Endpoint.CHAT: chat_completions, Endpoint.EMBEDDINGS: embeddings,
     Endpoint.RERANK: rerank, Endpoint.RESPONSES: responses, Endpoint.TOKENIZE: tokenize,
     Endpoint.DETOKENIZE: detokenize}
)  # fmt: skip


def _named_model(body: bytes, state: GatewayState) -> str | None:
    """The configured model a refused body names, so its 400 counts under that model, not ``_unknown``
    (read only on this error path; a name the config does not have stays unknown)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = data.get("model") if type(data) is dict else None
    return model if type(model) is str and model in state.router.models else None


def _cancelled(state: GatewayState) -> NoReturn:
    """End a cancelled request: a client that left (499), or the drain deadline (503)."""
    if state.in_flight.expired:
        # Our own drain cancelled it: the client is still there and gets a 503 it can retry elsewhere.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        raise _shutting_down()
    raise asyncio.CancelledError


def _shutting_down() -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "the gateway is shutting down; retry the request", code="gateway_shutting_down", retry_after=1.0
    )


async def _stream(
    request: web.Request,
    state: GatewayState,
    ops: EndpointOps,
    model: str,
    opened: OpenedStream,
    record: RequestRecord,
    headers: Mapping[str, str] | None = None,
    end: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """Relay ``opened``; ``end`` (Responses: the turn's save) is awaited just before the last event
    is written, so the turn is stored before the client can act on its end."""
    metrics = state.metrics
    endpoint = ops.endpoint
    done = ops.done  # after the last event: chat's and completions' [DONE]; nothing for Responses
    backend = record.backend = opened.route.backend.name
    stream = opened.stream
    record.relayed = 0
    response = web.StreamResponse(headers={**_SSE_HEADERS, **(headers or {}), "x-request-id": record.request_id})
    # A stream that counts its events as it cuts them (the OpenAI-shaped relays) is read after
    # each write; another one's chunks are counted here. Either way what a write that never
    # happened (a client that left meanwhile) carried is not counted. Written out at each write,
    # not in a helper: a call per chunk on every stream.
    counts = stream.relayed_events is not None
    try:
        await response.prepare(request)
        # When the upstream has already finished, the chunk, [DONE] and the end of the
        # body leave in one write (one syscall instead of three for short streams).
        if stream.finished:
            record.upstream_ended = monotonic()
            if end is not None:
                await end()
            await response.write_eof(opened.first + done)
            record.answered()  # finished: what the client does next is no disconnect
            record.relayed = (stream.relayed_events or 0) if counts else opened.first.count(_EVENT)
            metrics.first_token(model, backend, asyncio.get_running_loop().time() - record.started, endpoint=endpoint)
            return response
        if opened.first:
            await response.write(opened.first)
            record.relayed = (stream.relayed_events or 0) if counts else opened.first.count(_EVENT)
        metrics.first_token(model, backend, asyncio.get_running_loop().time() - record.started, endpoint=endpoint)
        record.first_at = monotonic()
        tail = done
        try:
            async for chunk in opened:  # an upstream failure reaches the breaker through ``opened``
                if stream.finished:
                    record.upstream_ended = monotonic()
                    tail = chunk + done
                    record.relayed = (stream.relayed_events or 0) if counts else record.relayed + chunk.count(_EVENT)
                    break
                await response.write(chunk)
                record.relayed = (stream.relayed_events or 0) if counts else record.relayed + chunk.count(_EVENT)
            else:  # ended without a chunk marked last (an upstream that just closes after its [DONE])
                record.upstream_ended = monotonic()
        except UpstreamError as exc:
            # After the first byte nothing is retried: say what happened, then end cleanly.
            record.status = exc.status
            metrics.stream_failed(model, backend, exc.reason, endpoint=endpoint)
            tail = _error_event(exc, stream, ops)
        except ConnectionResetError:
            raise
        except Exception as exc:
            # Not an upstream failure but a bug. The response has started, so the middleware
            # can no longer answer (it would write a second response into this body): log it
            # and end the stream here, the same way as an upstream failure.
            log.exception("unexpected error while streaming %s (request %s)", request.path, record.request_id)
            error = (
                exc
                if isinstance(exc, GatewayError)
                else GatewayError("The gateway failed to process the request; see its log.", code="internal_error")
            )
            record.status = error.status
            metrics.stream_failed(model, backend, "internal", endpoint=endpoint)
            tail = _error_event(error, stream, ops)
        if end is not None:
            await end()
        await response.write_eof(tail)
        record.answered()  # finished: a cancel while the upstream is released below is no disconnect
    except asyncio.CancelledError:
        if not state.in_flight.expired:
            raise  # the client left: 499
        # The drain deadline passed: end the stream with an error the client can act on, not a bare cut.
        metrics.stream_failed(model, backend, "shutdown", endpoint=endpoint)
        if response.prepared:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await response.write_eof(_error_event(_shutting_down(), stream, ops))
        raise
    finally:
        record.usage = stream.usage  # before the await: a cancel there must not drop the tokens
        await opened.aclose()
    return response


def _error_event(error: GatewayError, stream: CompletionStream, ops: EndpointOps) -> bytes:
    """The end of a stream that failed midway: the endpoint's own (Responses: ``response.failed``),
    else the error envelope as a ``data:`` event and ``[DONE]``; secrets redacted either way."""
    if ops.failure is not None:
        return redact(ops.failure(stream, error))
    return b"data: " + redact(orjson.dumps(error.envelope())) + b"\n\n" + ops.done


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the models the caller may use (all of them with auth off)."""
    state = request.app[STATE]
    key = state.request_guard.identify(request)
    listing = model_list(state.router, int(state.started_at), None if key is None else key.models)
    return web.Response(body=orjson.dumps(listing), content_type=_JSON)


async def retrieve_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{id}``: one model; 404 alike for a model that does not exist and one the key may not use."""
    state = request.app[STATE]
    key = state.request_guard.identify(request)
    name = request.match_info["model"]
    entry = state.router.models.get(name)
    if entry is None or (key is not None and name not in key.models):
        raise NotFoundError(
            f"The model '{name}' does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    return web.Response(body=orjson.dumps(model_object(entry, int(state.started_at))), content_type=_JSON)


async def version(request: web.Request) -> web.Response:
    """``GET /version``: the gateway's version (as vLLM's ``/version``); with auth on, for any valid key."""
    request.app[STATE].request_guard.identify(request)
    return web.Response(body=_VERSION, content_type=_JSON)


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        return web.Response(body=b'{"status":"draining"}', status=503, content_type=_JSON)
    return web.Response(body=b'{"status":"ok"}', content_type=_JSON)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    view = state.metrics.gateway_view  # N workers: every worker's series, merged (gateway.workers)
    body = await view() if view is not None else state.metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

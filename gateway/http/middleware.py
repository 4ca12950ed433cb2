"""The one place errors become HTTP answers, and where request ids are assigned.

Every error leaves as OpenAI's envelope with the right status: our own
``GatewayError``s as they are, aiohttp's HTTP exceptions (unknown path, wrong
method, oversized body) translated, and anything unexpected as a plain 500
envelope with the traceback only in our log, never in the body.
"""

from __future__ import annotations

import logging
import re

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.http.hardening import redact
from gateway.http.request_id import REQUEST_ID, new_request_id
from gateway.state import GatewayState
from schemas.errors import (
    GatewayError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
)

__all__ = ["error_response", "request_middleware"]

log = logging.getLogger("gateway")

# A client-supplied id is echoed and sent upstream, so keep it to a safe alphabet and size.
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


def error_response(error: GatewayError, request_id: str) -> web.Response:
    headers = {"x-request-id": request_id}
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after)))
    return web.Response(
        body=redact(orjson.dumps(error.envelope())),  # an upstream may echo a secret in its message
        status=error.status,
        content_type="application/json",
        headers=headers,
    )


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> GatewayError:
    if exc.status == 404:
        return NotFoundError(f"Unknown path: {request.method} {request.path}", code="unknown_url")
    if exc.status == 405:
        return MethodNotAllowedError(
            f"Method {request.method} is not allowed on {request.path}", code="method_not_allowed"
        )
    if exc.status == 413:
        limit = request.app._client_max_size
        return PayloadTooLargeError(f"The request body is larger than the {limit}-byte limit.")
    return GatewayError(exc.reason or "HTTP error", status=exc.status, type="invalid_request_error")


def request_middleware(state: GatewayState) -> Middleware:
    """The app's one middleware: request ids, error answers, and the request's count in ``state``'s
    config generation (``gateway.reload``). Closed over ``state``: a reload swaps its fields, not it."""

    @web.middleware
    async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = request.headers.get("x-request-id")
        if rid is None or not _CLIENT_ID.match(rid):
            rid = new_request_id()
        request[REQUEST_ID] = rid
        # Counted in the config generation the request began in (gateway.reload closes what an old
        # config alone used once its last request ended): here, not in a middleware of its own,
        # which cost every request a coroutine layer.
        generation = state.generation
        generation.active += 1
        try:
            response = await handler(request)
        except GatewayError as exc:
            return error_response(exc, rid)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(_from_http_exception(exc, request), rid)
        except (ConnectionResetError, ConnectionError):
            raise
        except Exception:
            log.exception("unexpected error while serving %s %s (request %s)", request.method, request.path, rid)
            return error_response(
                GatewayError("The gateway failed to process the request; see its log.", code="internal_error"), rid
            )
        finally:
            generation.active -= 1  # Generation.leave(), inline: a call less per request
            if not generation.active and generation.idle is not None:
                generation.idle.set()
        if not response.prepared:
            response.headers.setdefault("x-request-id", rid)
        return response

    return request_middleware

"""The one place errors become HTTP answers, and where request ids are assigned.

Every error leaves as OpenAI's envelope with the right status: our own
``GatewayError``s as they are, aiohttp's HTTP exceptions (unknown path, wrong
method, oversized body) translated, and anything unexpected as a plain 500
envelope with the traceback only in our log, never in the body.

``Expect: 100-continue`` is answered by :func:`expect_handler` (the POST routes' expect handler,
run by aiohttp before any middleware): a body announced larger than the limit gets its 413 before
the client sends it, an expectation we do not know a 417, both as envelopes.
"""

from __future__ import annotations

import logging
import re

import orjson
from aiohttp import HttpVersion11, hdrs, web
from aiohttp.typedefs import Handler, Middleware

from gateway.http.hardening import redact
from gateway.http.protocol import EXPECTATION_FAILED
from gateway.http.request_id import REQUEST_ID, new_request_id
from gateway.state import GatewayState
from schemas.errors import (
    ExpectationFailedError,
    GatewayError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

__all__ = ["error_response", "expect_handler", "request_middleware"]

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


def _request_id(request: web.Request) -> str:
    rid = request.headers.get("x-request-id")
    return rid if rid is not None and _CLIENT_ID.match(rid) else new_request_id()


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's ``expect_handler`` for the POST routes: ``None`` lets the request go on.

    aiohttp's default invites any body with a 100 and refuses an unknown expectation in plain text
    quoting it; only requests that carry ``Expect`` come here, so the common path pays nothing.
    """
    if request.version != HttpVersion11:
        return None  # HTTP/1.0 has no 100 Continue: the client sends its body anyway
    refusal: GatewayError
    if request.headers.get(hdrs.EXPECT, "").strip().lower() != "100-continue":
        refusal = ExpectationFailedError(EXPECTATION_FAILED)
    else:
        limit = request.app._client_max_size
        length = request.content_length
        coding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
        # A compressed body is limited after it is inflated (gateway.http.hardening): its wire size
        # alone cannot be refused here.
        if length is None or length <= limit or coding != "identity":
            await request.writer.write(_CONTINUE)
            return None
        refusal = PayloadTooLargeError(f"The request body is larger than the {limit}-byte limit.")
    response = error_response(refusal, _request_id(request))
    # The body was never invited: whether the client sends it anyway is unknown, so the connection
    # cannot carry another request (aiohttp reads what comes for its lingering time, then closes).
    response.force_close()
    return response


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
            response = error_response(_from_http_exception(exc, request), rid)
            allow = exc.headers.get(hdrs.ALLOW)
            if allow is not None:  # a 405 says which methods the path takes (RFC 9110 15.5.6)
                response.headers[hdrs.ALLOW] = allow
            return response
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

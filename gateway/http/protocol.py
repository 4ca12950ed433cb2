"""The connection layer under the app: malformed HTTP answered in our envelope, and a lossless drain.

aiohttp answers what its HTTP parser cannot read (a NUL or bare CR in a header, a line or a
header block over ``server.max_header_bytes``, a bad ``Content-Encoding``) before any
middleware runs: with a plain-text 400 quoting the offending line, which may hold a client's
API key, and an ERROR traceback quoting it again. :class:`FrontDoorRunner` serves the app
with :class:`FrontDoorProtocol` instead, whose ``handle_error`` answers OpenAI's envelope with
a fixed message per kind of defect, logs one INFO line naming only the kind and the peer, and
closes the connection. Nothing a client sent is echoed or logged.

Draining (:meth:`FrontDoorRunner.start_draining`): from then on every answer is prepared with
``Connection: close`` (a request that arrives while draining is made as if the client had sent
``Connection: close``; an answer to an earlier one not yet prepared is closed in
``finish_response``; no per-response hook while serving normally), so a client that has just sent its
next request on a keep-alive connection still gets that request answered and learns that the
connection ends. Connections are never closed under a client that may be writing:
:meth:`FrontDoorRunner.close_idle` closes only those idle for ``grace`` seconds since their
last answer (aiohttp's own ``pre_shutdown`` closes every idle connection at once, which loses
a request already on the wire).

No answer names the server software: aiohttp's ``Server: Python/3.x aiohttp/3.y`` hands a
probe the exact versions to look up; :func:`_hide_server_software` sets the one module-level
default aiohttp reads when a response has no ``Server`` (no per-response work).

The runner reaches three private corners of aiohttp (3.14): the ``Server`` it builds gets our
protocol class, and the idle test reads the protocol's waiter. Both are covered by the tests
in ``tests/gateway/http/test_front_door.py`` and ``tests/gateway/http/test_drain_load.py``;
``tests/gateway/http/test_aiohttp_private_api.py`` names each private attribute used, and
``pyproject.toml`` pins aiohttp to the minor release those tests ran on.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import http_exceptions, web, web_response
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.http.heap import settle_heap
from gateway.http.request_id import new_request_id

__all__ = ["EXPECTATION_FAILED", "UNSUPPORTED_ENCODING", "FrontDoorProtocol", "FrontDoorRunner", "malformed_message"]

log = logging.getLogger("gateway")

# Fixed wording per parser error class: the parser's own message quotes the offending bytes.
_MALFORMED: tuple[tuple[type[BaseException], int, str, str], ...] = (
    (http_exceptions.LineTooLong, 400, "A request line or header is larger than this server accepts.",
     "header_too_large"),
    (http_exceptions.ContentEncodingError, 400, "The request body could not be decoded per its Content-Encoding.",
     "invalid_content_encoding"),
    (http_exceptions.InvalidHeader, 400, "A request header is malformed.", "invalid_header"),
    (http_exceptions.InvalidURLError, 400, "The request target is malformed.", "invalid_url"),
    (http_exceptions.BadStatusLine, 400, "The request line is malformed.", "invalid_request_line"),
    (http_exceptions.TransferEncodingError, 400, "The request body's chunked framing is malformed.", "invalid_framing"),
    (http_exceptions.ContentLengthError, 400, "The request body does not match its Content-Length.", "invalid_framing"),
)  # fmt: skip
_TOO_MANY_HEADERS = "Too many headers"  # aiohttp raises a bare BadHttpMessage for max_headers
EXPECTATION_FAILED = "The request's Expect header is not supported; only 100-continue is."
SERVER_NAME = "completions-gateway"  # what the Server header says, without a version
UNSUPPORTED_ENCODING = "The request's Content-Encoding is not supported; send identity, gzip or deflate."


def malformed_message(exc: BaseException | None, status: int) -> tuple[int, str, str]:
    """(status, message, code) for an HTTP message aiohttp could not parse; never quotes the input."""
    if isinstance(exc, web.RequestPayloadError) and exc.__cause__ is not None:
        exc = exc.__cause__  # the C parser wraps the body's error; the pure-Python one does not
    if isinstance(exc, http_exceptions.ContentEncodingError) and "install" in str(exc.message):
        # A coding aiohttp knows but cannot decode here (br, zstd without their libraries).
        return 415, UNSUPPORTED_ENCODING, "unsupported_content_encoding"
    for kind, code_status, message, code in _MALFORMED:
        if isinstance(exc, kind):
            return code_status, message, code
    if isinstance(exc, http_exceptions.BadHttpMessage) and str(exc.message).startswith(_TOO_MANY_HEADERS):
        return 400, "The request has more headers than this server accepts.", "too_many_headers"
    if status == 504:
        return 504, "The gateway timed out while handling the request.", "timeout"
    if status >= 500:
        return status, "The gateway failed to process the request; see its log.", "internal_error"
    return status, "The request is not valid HTTP.", "malformed_request"


def _envelope(status: int, message: str, code: str, request_id: str) -> web.Response:
    """OpenAI's envelope for an answer made below the middleware; the connection closes after it."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    response = web.Response(
        status=status,
        reason=HTTPStatus(status).phrase,
        body=body,
        content_type="application/json",
        headers={"x-request-id": request_id},
    )
    response.force_close()
    return response


def _hide_server_software() -> None:
    # aiohttp's StreamResponse sets ``Server`` from this module global when the response has none.
    web_response.SERVER_SOFTWARE = SERVER_NAME  # type: ignore[attr-defined]


class FrontDoorProtocol(RequestHandler):
    """aiohttp's connection protocol, answering its own errors in our envelope (one per connection)."""

    def __init__(self, manager: _FrontDoorServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._front_door = manager
        make_request = self._request_factory
        assert make_request is not None

        def request_factory(message: Any, *args: Any) -> BaseRequest:
            if manager.draining and not message.should_close:
                message = message._replace(should_close=True)  # its answer says "Connection: close"
            return make_request(message, *args)

        self._request_factory = request_factory

    last_answer: float = 0.0  # loop time of the connection's opening or of its last finished answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.last_answer = self._loop.time()  # a new connection gets its grace like an answered one

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # the answer has begun: nothing to add but a cut
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        status, text, code = malformed_message(exc, status)
        peer = request.remote or "unknown"
        # A fresh id (the client's header may be the malformed part): the client can quote it,
        # the log line carries it.
        rid = new_request_id()
        if status >= 500 and status != 504:
            # Our own bug below the middleware: the traceback is ours, not the client's bytes.
            log.error("unhandled error on a connection from %s (request %s)", peer, rid, exc_info=exc)
        else:
            log.info("refused a malformed request from %s: %s (%s, request %s)", peer, code, type(exc).__name__, rid)
        return _envelope(status, text, code, rid)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            # The rest of a body that failed to decode, read after its 400 went out (aiohttp's
            # lingering read): the client's fault, already answered; its message may quote the body.
            log.info("closed a connection after a malformed request body (%s)", type(exc).__name__)
            return
        super().log_exception(*args, **kw)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if self._front_door.draining and not resp.prepared:
            resp.force_close()  # begun before the drain, answered during it
        if resp.__class__ is web.HTTPExpectationFailed:
            # aiohttp's own refusal of an unknown Expect (a route without our expect handler, an
            # unknown path), raised before any middleware: plain text quoting the header otherwise.
            resp = _envelope(417, EXPECTATION_FAILED, "expectation_failed", new_request_id())
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self.last_answer = self._loop.time()

    def idle_for(self, now: float) -> float | None:
        """Seconds since the last answer when waiting for a next request with none buffered, else None."""
        if self._request_in_progress or self._messages or self._waiter is None:
            return None
        return now - self.last_answer


class _FrontDoorServer(web.Server):
    draining = False

    def __call__(self) -> RequestHandler:
        return FrontDoorProtocol(self, loop=self._loop, **self._kwargs)


class FrontDoorRunner(web.AppRunner):
    """``web.AppRunner`` serving with :class:`FrontDoorProtocol`, able to drain losslessly."""

    def __init__(self, app: web.Application, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # the app's startup has run: its heap is built
        # Same state, our protocol factory (aiohttp builds the Server inside the app, privately).
        server.__class__ = _FrontDoorServer
        settle_heap()  # the collector's settings for serving (gateway.http.heap)
        _hide_server_software()
        return server

    def start_draining(self) -> None:
        """Every answer prepared from now on closes its connection."""
        if isinstance(self.server, _FrontDoorServer):
            self.server.draining = True

    def open_connections(self) -> int:
        return len(self.server._connections) if self.server is not None else 0

    def close_idle(self, grace: float) -> int:
        """Close the connections idle for at least ``grace`` seconds since their last answer."""
        if self.server is None:
            return 0
        now = asyncio.get_running_loop().time()
        closed = 0
        for conn in list(self.server._connections):
            idle = conn.idle_for(now) if isinstance(conn, FrontDoorProtocol) else None
            if idle is not None and idle >= grace:
                # force_close, not close: close() only cancels the keep-alive wait, which ends
                # aiohttp's connection task before it closes the socket, so the connection
                # stayed open (and the drain waited out its whole timeout for it).
                conn.force_close()
                closed += 1
        return closed

"""One HTTP/1.1 exchange on a raw asyncio connection, framed by httptools (llhttp).

:class:`Conn` is the asyncio protocol of one keep-alive connection; :class:`Exchange` is
one request/response on it: the httptools parser's callback object, the
:class:`~backends.transport.base.UpstreamResponse` the caller holds, and the chunk
iterator, all in one slotted object so that a request allocates one response, one
parser, one future and one timer handle. The pool that owns the connections and sends
the request is ``backends.transport.httptools_client`` (its docstring has the whole
contract); this module owns what happens once the bytes are on the socket:

- Size: the response head (status line and header fields, interim 1xx heads included)
  is at most 64 KiB and 100 fields; beyond either, ``UpstreamProtocolError`` (502
  ``upstream_protocol_error``) as soon as it is crossed, without waiting for the rest.
  llhttp itself bounds neither. A non-streamed body over ``max_body`` bytes fails with
  ``UpstreamTooLargeError`` as soon as it crosses the cap (an endless chunked body
  included); an answer in any ``Content-Encoding`` but identity is refused.
- Timeouts: non-stream: ``first_byte`` until the headers and ``total`` for the whole
  exchange including ``read()``; stream: ``first_byte`` until the headers, then
  ``stream_idle`` of upstream silence (reason ``stream_idle``). Time our own slow
  consumer holds data, or reading is paused for it, does not count.
- ``iter_chunks`` yields the de-chunked body as it arrives (all that is buffered,
  joined); reading pauses above 256 KiB unconsumed and resumes when drained.
- Errors: dead before the request was written -> :class:`Unsent` (the pool may resend);
  closed after the write, before any response byte -> UpstreamClosedError (UpstreamTLSError when
  TLS ended it: a TLS 1.3 server refuses a client certificate only after the handshake);
  unparseable response -> UpstreamProtocolError; cut after the headers ->
  UpstreamProtocolError(reason="stream_cut"). No OSError/httptools error escapes.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Protocol, cast

import httptools

from backends.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from backends.transport.base import refuse_encoding, too_large
from backends.transport.egress import tls_error
from schemas.config import TimeoutConfig

__all__ = ["Conn", "Exchange", "Origin", "Pool", "Unsent"]

_HIGH_WATER = 256 * 1024  # unconsumed body bytes before reading pauses
_MAX_HEAD = 64 * 1024  # bytes of status line and header fields (aiohttp's client: 8190 per field)
_MAX_FIELDS = 100  # header fields (aiohttp's client: 128)
_SLACK = 0.002  # loop timers may fire this much early
Origin = tuple[str, str, int]  # scheme, host, port: one keep-alive pool each


class Pool(Protocol):
    """What an exchange needs of the pool that owns its connection (``FastHTTPTransport``)."""

    _backend: str
    _timeout: TimeoutConfig
    _max_body: int

    def _put(self, conn: Conn) -> None: ...

    def _forget(self, conn: Conn) -> None: ...


class _Extra(Exception):
    """Bytes after the end of the response: the connection cannot be reused."""


class _Abort(Exception):
    """Raised from a parser callback after ``_fail``: stop parsing what is left of the read."""


class Unsent(UpstreamConnectError):
    """The connection was dead before or while the request was written: safe to send again."""


class Conn(asyncio.Protocol):
    __slots__ = ("key", "lost", "owner", "resp", "transport")

    def __init__(self, owner: Pool, key: Origin) -> None:
        self.owner = owner
        self.key = key
        self.resp: Exchange | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # an idle connection talking: not reusable
            self.transport.close()
        else:
            resp._feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.resp is not None:
            self.resp._lost(exc)
        self.owner._forget(self)

    def usable(self) -> bool:
        return not self.lost and not self.transport.is_closing()


class Exchange:
    """One exchange; also the httptools parser's callback object and the chunk iterator."""

    __slots__ = (
        "_all", "_backend", "_buffered", "_chunks", "_conn", "_deadline", "_done", "_eof_framed", "_exc", "_fut",
        "_got", "_hbytes", "_hcount", "_hdrs", "_head", "_hmap", "_idle", "_info", "_keep", "_last", "_left",
        "_loop", "_owner", "_parser", "_paused", "_raw", "_stream", "_t0", "_timer", "_written", "status",
    )  # fmt: skip

    def __init__(self, owner: Pool, conn: Conn, loop: asyncio.AbstractEventLoop, t0: float, stream: bool) -> None:
        self._owner = owner
        self._backend = owner._backend
        self._conn: Conn | None = conn
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self._raw: list[tuple[bytes, bytes]] = []
        self._hmap: dict[str, str] | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._hdrs = self._done = self._got = self._all = self._paused = self._keep = self._eof_framed = False
        self._info = self._written = False
        self._head = 0  # bytes fed while the head was incomplete
        self._hcount = self._hbytes = 0  # header fields and their bytes, interim 1xx heads included
        self._left = owner._max_body  # body bytes a non-streamed response may still send
        self._exc: UpstreamError | None = None
        self._fut: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        tc = owner._timeout
        self._t0 = t0
        self._stream = stream
        self._idle = tc.stream_idle
        self._last = t0
        self._deadline = t0 + (tc.first_byte if stream else min(tc.first_byte, tc.total))

    # --- the UpstreamResponse protocol ----------------------------------------------
    def header(self, name: str) -> str | None:
        hmap = self._hmap
        if hmap is None:
            hmap = self._hmap = {}
            for raw_name, raw_value in self._raw:
                key, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
                hmap[key] = f"{hmap[key]}, {value}" if key in hmap else value
        return hmap.get(name.lower())

    async def read(self) -> bytes:
        self._all = True
        if self._paused:
            self._resume()
        while not self._done:
            if self._exc is not None:
                raise self._exc
            if self._conn is None:
                raise UpstreamProtocolError("read() after release()", backend=self._backend)
            self._fut = fut = self._loop.create_future()
            await fut
        return self._take()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self

    def __aiter__(self) -> Exchange:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._done or self._conn is None:
                raise StopAsyncIteration
            self._fut = fut = self._loop.create_future()
            await fut
        return self._take()

    def release(self) -> None:
        conn = self._conn
        if conn is None:
            return
        self._conn = conn.resp = None
        del self._parser  # break the parser <-> callbacks cycle
        self._stop_timer()
        if self._done and self._keep and self._exc is None and conn.usable():
            if self._paused:
                conn.transport.resume_reading()
            self._owner._put(conn)
        else:
            conn.transport.close()

    # --- internals ----------------------------------------------------------------------
    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    def _resume(self) -> None:
        self._paused = False
        self._last = self._loop.time()
        if self._conn is not None:
            self._conn.transport.resume_reading()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        fut = self._fut
        if fut is not None:
            self._fut = None
            if not fut.done():
                fut.set_result(None)

    async def _start(self, data: bytes) -> None:
        conn = self._conn
        assert conn is not None
        conn.resp = self
        self._timer = self._loop.call_at(self._deadline, self._on_timer)
        if conn.lost or conn.transport.is_closing():
            self._fail(Unsent("the upstream connection was closed before the request", backend=self._backend))
        else:
            conn.transport.write(data)
            if conn.transport.is_closing():  # the write failed at once: nothing reached the upstream
                self._fail(Unsent("the upstream connection failed while sending", backend=self._backend))
            self._written = True
        while not self._hdrs:
            if self._exc is not None:
                raise self._exc
            self._fut = fut = self._loop.create_future()
            await fut

    def _feed(self, data: bytes) -> None:
        self._got = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self._done:
                self._keep = False
            else:
                self._fail(UpstreamProtocolError(f"bad upstream response ({exc})", backend=self._backend))
            return
        if not self._hdrs and self._exc is None:
            # llhttp buffers a field until its end: count what arrived, not what was parsed.
            self._head += len(data)
            if self._head > _MAX_HEAD:
                self._fail(self._head_too_large(f"larger than {_MAX_HEAD} bytes"))

    def _head_too_large(self, what: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(f"the upstream response head is {what}", backend=self._backend)

    def _lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        if self._hdrs and self._eof_framed and exc is None:  # a body delimited by the connection's end
            self.on_message_complete()
            return
        why = f" ({type(exc).__name__})" if exc is not None else ""
        err: UpstreamError
        if isinstance(exc, ssl.SSLError) and not self._got:
            # TLS 1.3: a server that refuses our client certificate says so after the handshake
            err = tls_error(exc, self._backend)
        elif not self._got:
            err = UpstreamClosedError(
                f"the upstream closed the connection without answering; the request had been sent{why}",
                backend=self._backend,
            )
        elif not self._hdrs:
            err = UpstreamProtocolError(f"the upstream hung up mid-headers{why}", backend=self._backend)
        else:
            err = UpstreamProtocolError(
                f"the upstream response was cut{why}", backend=self._backend, reason="stream_cut"
            )
        self._fail(err)

    def _fail(self, exc: UpstreamError) -> None:
        if self._exc is not None or self._done:
            return
        self._exc = exc
        self._stop_timer()
        if self._conn is not None:
            self._conn.transport.close()
        self._wake()

    def _on_timer(self) -> None:
        self._timer = None
        if self._done or self._exc is not None or self._conn is None:
            return
        now = self._loop.time()
        idle = self._hdrs and self._stream
        if not idle:
            deadline = self._deadline
        elif self._paused or (self._chunks and not self._all):
            deadline = now + self._idle  # our consumer is behind, the upstream is not idle
        else:
            deadline = self._last + self._idle
        if deadline > now + _SLACK:
            self._timer = self._loop.call_at(deadline, self._on_timer)
        elif idle:
            self._fail(
                UpstreamTimeoutError("the upstream stream went idle", backend=self._backend, reason="stream_idle")
            )
        else:
            self._fail(UpstreamTimeoutError("timed out waiting for the upstream", backend=self._backend))

    # --- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._done:
            raise _Extra

    def on_header(self, name: bytes, value: bytes) -> None:
        self._hcount += 1
        self._hbytes += len(name) + len(value) + 4
        if self._hcount > _MAX_FIELDS:
            self._fail(self._head_too_large(f"more than {_MAX_FIELDS} header fields"))
            raise _Abort
        if self._hbytes > _MAX_HEAD:
            self._fail(self._head_too_large(f"larger than {_MAX_HEAD} bytes"))
            raise _Abort
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        self.status = parser.get_status_code()
        if self.status < 200:  # an interim 1xx (e.g. 103 Early Hints): wait for the real one
            self._raw.clear()
            self._info = True
            return
        self._keep = parser.should_keep_alive() and parser.get_http_version() == "1.1"
        framed = False
        for name, value in self._raw:
            lower = name.lower()
            if lower == b"content-length" or lower == b"transfer-encoding":
                framed = True
            elif lower == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                self._fail(refuse_encoding(value.decode("latin-1"), self._backend))
                return
        self._eof_framed = not framed
        self._hdrs = True
        tc = self._owner._timeout
        if self._stream:
            self._last = max(self._loop.time(), self._t0 + tc.first_byte - tc.stream_idle)
        else:
            self._deadline = self._t0 + tc.total
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._exc is not None:
            return
        if not self._stream:
            self._left -= len(body)
            if self._left < 0:
                self._fail(too_large(self._owner._max_body, self._backend))
                return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._stream:
            self._last = self._loop.time()
        if not self._all:
            if self._fut is not None:
                self._wake()
            if self._buffered > _HIGH_WATER and not self._paused and self._conn is not None:
                self._paused = True
                self._conn.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._info:
            self._info = False
            return
        self._done = True
        self._stop_timer()
        self._wake()

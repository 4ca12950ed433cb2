"""A lean HTTP/1.1 upstream client: raw asyncio protocols plus httptools (llhttp) framing.

Implements the :class:`backends.transport.base.HTTPTransport` seam at a fraction of
aiohttp's ``ClientSession`` cost per request: no request/response objects beyond
one small response, one parser, one future and one timer handle per exchange.

Contract (on top of the one in ``backends.transport.base``):
- ``send`` returns once the status line and headers arrived. The request is one
  ``transport.write``: request line, ``Host``, ``Content-Length``, the caller's
  ``Accept-Encoding: identity``, the caller's headers (which must not repeat those; CR/LF
  in them raises ``ValueError``), then the body. An answer in any ``Content-Encoding``
  but identity is refused (``UpstreamTooLargeError``): inflating what we did not ask
  for is how a small gzip bomb becomes hundreds of megabytes.
- Size: the response head (status line and header fields, interim 1xx heads included)
  is at most 64 KiB and 100 fields; beyond either, ``UpstreamProtocolError`` (502
  ``upstream_protocol_error``) as soon as it is crossed, without waiting for the rest.
  llhttp itself bounds neither, so without this only ``first_byte`` would.
  A non-streamed body over ``max_body`` bytes fails with
  ``UpstreamTooLargeError`` as soon as it crosses the cap (an endless chunked body
  included); streams are bounded per event by their decoder (``backends.transport.sse``)
  and in memory by the read pause below.
- Keep-alive pool per (scheme, host, port), idle connections reused LIFO, at most
  ``max_connections`` in all; waiting for one is bounded by ``timeout.connect``
  (then :class:`UpstreamTimeoutError`). A connection goes back to the pool only from
  ``release()`` after its whole body arrived, on an HTTP/1.1 keep-alive response;
  otherwise it is closed, which is how an abandoned stream stops upstream work.
  An idle connection the server closed is never reused. A request is sent once more, on a
  fresh connection, only when it provably never reached the upstream: its reused
  connection was found closed before the write, or the write itself failed. Once the
  request was handed to the socket it is never resent (the upstream may be running it):
  a close without a response byte is then :class:`UpstreamClosedError`.
- Timeouts: ``connect`` for getting a connection; non-stream: ``first_byte`` until
  the headers and ``total`` for the whole exchange including ``read()``; stream:
  ``first_byte`` until the headers, then ``stream_idle`` of upstream silence
  (reason ``stream_idle``; the first chunk also gets until ``first_byte``). Time our
  own slow consumer holds data, or reading is paused for it, does not count.
- ``iter_chunks`` yields the de-chunked body as it arrives (all that is buffered,
  joined); reading pauses above 256 KiB unconsumed and resumes when drained.
- Errors: no connection / dead before the request was written -> UpstreamConnectError;
  closed after the write, before any response byte -> UpstreamClosedError;
  unparseable response -> UpstreamProtocolError; cut after the headers ->
  UpstreamProtocolError(reason="stream_cut"). No OSError/httptools error escapes.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools

from backends.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from backends.transport.base import UpstreamResponse, refuse_encoding, too_large
from schemas.config import TimeoutConfig

__all__ = ["FastHTTPTransport"]

_HIGH_WATER = 256 * 1024  # unconsumed body bytes before reading pauses
_MAX_HEAD = 64 * 1024  # bytes of status line and header fields (aiohttp's client: 8190 per field)
_MAX_FIELDS = 100  # header fields (aiohttp's client: 128)
_SLACK = 0.002  # loop timers may fire this much early
_Key = tuple[str, str, int]  # scheme, host, port


class _Target(NamedTuple):
    key: _Key
    host: str  # the Host header
    path: str  # the request target


class _Extra(Exception):
    """Bytes after the end of the response: the connection cannot be reused."""


class _Abort(Exception):
    """Raised from a parser callback after ``_fail``: stop parsing what is left of the read."""


class _Unsent(UpstreamConnectError):
    """The connection was dead before or while the request was written: safe to send again."""


class _Conn(asyncio.Protocol):
    __slots__ = ("key", "lost", "owner", "resp", "transport")

    def __init__(self, owner: FastHTTPTransport, key: _Key) -> None:
        self.owner = owner
        self.key = key
        self.resp: _Response | None = None
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


class _Response:
    """One exchange; also the httptools parser's callback object and the chunk iterator."""

    __slots__ = (
        "_all", "_backend", "_buffered", "_chunks", "_conn", "_deadline", "_done", "_eof_framed", "_exc", "_fut",
        "_got", "_hbytes", "_hcount", "_hdrs", "_head", "_hmap", "_idle", "_info", "_keep", "_last", "_left",
        "_loop", "_owner", "_parser", "_paused", "_raw", "_stream", "_t0", "_timer", "_written", "status",
    )  # fmt: skip

    def __init__(
        self, owner: FastHTTPTransport, conn: _Conn, loop: asyncio.AbstractEventLoop, t0: float, stream: bool
    ) -> None:
        self._owner = owner
        self._backend = owner._backend
        self._conn: _Conn | None = conn
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

    def __aiter__(self) -> _Response:
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
            self._fail(_Unsent("the upstream connection was closed before the request", backend=self._backend))
        else:
            conn.transport.write(data)
            if conn.transport.is_closing():  # the write failed at once: nothing reached the upstream
                self._fail(_Unsent("the upstream connection failed while sending", backend=self._backend))
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
        if not self._got:
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


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class FastHTTPTransport:
    """HTTP/1.1 over raw asyncio protocols with a per-origin keep-alive pool (see the module docstring)."""

    def __init__(
        self, backend: str, timeout: TimeoutConfig, max_connections: int, *, max_body: int = 64 * 1024 * 1024
    ) -> None:
        self._backend = backend
        self._timeout = timeout
        self._max_body = max_body
        self._max = max(1, max_connections)
        self._targets: dict[str, _Target] = {}
        self._idle: dict[_Key, list[_Conn]] = {}
        self._conns: set[_Conn] = set()  # connected ones, idle or in use
        self._count = 0  # connected plus connecting
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._ssl: ssl.SSLContext | None = None

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], stream: bool
    ) -> UpstreamResponse:
        target = self._targets.get(url) or self._target(url)
        extra = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        if extra.count("\n") != len(headers) or extra.count("\r") != len(headers):
            raise ValueError("CR or LF in an upstream request header")
        size = len(body) if body else 0
        head = (
            f"{method} {target.path} HTTP/1.1\r\nHost: {target.host}\r\nContent-Length: {size}\r\n"
            f"Accept-Encoding: identity\r\n{extra}\r\n"
        )
        data = head.encode()
        if body:
            data += body
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        conn, reused = await self._acquire(target.key, t0 + self._timeout.connect, fresh=False)
        while True:
            resp = _Response(self, conn, loop, t0, stream)
            try:
                await resp._start(data)
                return resp
            except _Unsent as exc:
                resp.release()
                if not reused:
                    raise UpstreamConnectError(exc.message, backend=self._backend) from None
            except BaseException:
                resp.release()
                raise
            # A reused connection was dead before or while we wrote: the upstream never got the
            # request (the keep-alive race). Once more, on a fresh connection.
            reused = False
            conn, _ = await self._acquire(target.key, loop.time() + self._timeout.connect, fresh=True)

    async def close(self) -> None:
        conns = list(self._conns)
        self._idle.clear()
        for conn in conns:
            conn.transport.abort()
        if conns:
            await asyncio.sleep(0)  # let connection_lost run

    # --- pool -------------------------------------------------------------------------
    def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port = parts.port
        except ValueError:
            port = None
        host = parts.hostname
        if scheme not in ("http", "https") or not host:
            raise UpstreamConnectError(f"unsupported upstream URL {url!r}", backend=self._backend)
        default = 443 if scheme == "https" else 80
        port = port or default
        host_header = f"[{host}]" if ":" in host else host
        if port != default:
            host_header += f":{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if len(self._targets) >= 64:
            self._targets.clear()
        target = self._targets[url] = _Target((scheme, host, port), host_header, path)
        return target

    async def _acquire(self, key: _Key, deadline: float, *, fresh: bool) -> tuple[_Conn, bool]:
        woken = False
        while True:
            idle = self._idle.get(key)
            while idle and not fresh:
                conn = idle.pop()  # LIFO: the warmest connection
                if conn.usable():
                    return conn, True
            if self._count < self._max:
                return await self._connect(key, deadline), False
            for pool in self._idle.values():  # make room from an idle connection we will not use
                if pool:
                    pool.pop(0).transport.close()
                    break
            await self._wait(deadline, front=woken)  # someone barged in: keep our place at the front
            woken = True

    async def _connect(self, key: _Key, deadline: float) -> _Conn:
        scheme, host, port = key
        ctx: ssl.SSLContext | None = None
        if scheme == "https":
            ctx = self._ssl = self._ssl or ssl.create_default_context()
        self._count += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(
                    lambda: _Conn(self, key), host, port, ssl=ctx, server_hostname=host if ctx else None
                )
        except BaseException as exc:
            self._count -= 1
            self._wake_one()
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeoutError("timed out connecting to the upstream", backend=self._backend) from None
            if isinstance(exc, OSError):
                raise UpstreamConnectError(
                    f"cannot reach the upstream ({type(exc).__name__})", backend=self._backend
                ) from None
            raise
        self._conns.add(conn)
        if conn.lost:  # hung up before we got here: connection_lost found it unregistered
            self._forget(conn)
        return conn

    async def _wait(self, deadline: float, *, front: bool) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        if front:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
        timer = loop.call_at(deadline, _expire, fut)
        try:
            ok = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self._wake_one()  # pass on the wake-up we were given
            raise
        finally:
            timer.cancel()
        if not ok:
            raise UpstreamTimeoutError(
                "no upstream connection became free within the connect timeout", backend=self._backend
            )

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)
                return

    def _put(self, conn: _Conn) -> None:
        self._idle.setdefault(conn.key, []).append(conn)
        if self._waiters:
            self._wake_one()

    def _forget(self, conn: _Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            self._count -= 1
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake_one()

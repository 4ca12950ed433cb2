"""A lean HTTP/1.1 upstream client: raw asyncio protocols plus httptools (llhttp) framing.

This module is the pool and the sender; one exchange on a connection (the protocol,
the parser callbacks, the response) is ``backends.transport.httptools_exchange``.

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
- Timeouts: ``connect`` for getting a connection (pool wait and connect together).
- Errors here: no connection, or a fresh one dead before the write -> UpstreamConnectError;
  TLS refused -> UpstreamTLSError; no connection within ``connect`` -> UpstreamTimeoutError.
- Egress (``backends.transport.egress``): the TLS context, ``server_name`` and proxy routing of
  the backend. Only opening a connection (``backends.transport.httptools_connect``) and the
  per-URL target (absolute-form and ``Proxy-Authorization`` for a plain-http upstream behind a
  proxy) differ; a request on a pooled connection costs the same. A 407 from the proxy of a
  plain-http upstream is its refusal (:class:`UpstreamProxyError`), not the upstream's answer.
- Size caps, read timeouts, back-pressure and the errors of one exchange:
  ``backends.transport.httptools_exchange`` (its docstring).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

from backends.errors import UpstreamConnectError, UpstreamError, UpstreamTimeoutError
from backends.transport.base import UpstreamResponse
from backends.transport.egress import Egress, default_context, proxy_refused, tls_error
from backends.transport.httptools_connect import open_connection
from backends.transport.httptools_exchange import Conn, Exchange, Origin, Unsent
from schemas.config import TimeoutConfig

__all__ = ["FastHTTPTransport"]


class _Target(NamedTuple):
    key: Origin
    host: str  # the Host header's value (behind a proxy, a Proxy-Authorization line may follow it)
    path: str  # the request target (absolute-form for a plain-http upstream behind a proxy)
    proxied: bool  # sent to a forward proxy as it stands: its 407 is the proxy's refusal


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class FastHTTPTransport:
    """HTTP/1.1 over raw asyncio protocols with a per-origin keep-alive pool (see the module docstring)."""

    def __init__(
        self,
        backend: str,
        timeout: TimeoutConfig,
        max_connections: int,
        *,
        max_body: int = 64 * 1024 * 1024,
        egress: Egress | None = None,
    ) -> None:
        self._backend = backend
        # None: the plain path (direct, the system's trust store), as without any egress keys.
        self._egress = egress if egress is not None and not egress.direct else None
        self._timeout = timeout
        self._max_body = max_body
        self._max = max(1, max_connections)
        self._targets: dict[str, _Target] = {}
        self._idle: dict[Origin, list[Conn]] = {}
        self._conns: set[Conn] = set()  # connected ones, idle or in use
        self._count = 0  # connected plus connecting
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._ssl: ssl.SSLContext | None = egress.ssl if egress is not None else None

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
            resp = Exchange(self, conn, loop, t0, stream)
            try:
                await resp._start(data)
                if resp.status == 407 and target.proxied:
                    resp.release()
                    raise proxy_refused(407, self._backend)
                return resp
            except Unsent as exc:
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
        proxy = self._egress.proxy_for(scheme, host, port) if self._egress is not None else None
        proxied = proxy is not None and scheme == "http"
        if proxied:  # the proxy forwards it: the absolute URL, and its credentials on every request
            assert proxy is not None
            path = f"http://{host_header}{path}"
            if proxy.authorization:
                host_header += f"\r\nProxy-Authorization: {proxy.authorization}"
        if len(self._targets) >= 64:
            self._targets.clear()
        target = self._targets[url] = _Target((scheme, host, port), host_header, path, proxied)
        return target

    async def _acquire(self, key: Origin, deadline: float, *, fresh: bool) -> tuple[Conn, bool]:
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

    async def _connect(self, key: Origin, deadline: float) -> Conn:
        scheme, host, port = key
        self._count += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                if self._egress is not None:
                    conn = await open_connection(loop, lambda: Conn(self, key), self._egress, scheme, host, port)
                else:
                    ctx: ssl.SSLContext | None = None
                    if scheme == "https":
                        ctx = self._ssl = self._ssl or default_context()
                    _, conn = await loop.create_connection(
                        lambda: Conn(self, key), host, port, ssl=ctx, server_hostname=host if ctx else None
                    )
        except BaseException as exc:
            self._count -= 1
            self._wake_one()
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeoutError("timed out connecting to the upstream", backend=self._backend) from None
            if isinstance(exc, UpstreamError):
                raise
            if isinstance(exc, ssl.SSLError):
                raise tls_error(exc, self._backend) from None
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

    def _put(self, conn: Conn) -> None:
        self._idle.setdefault(conn.key, []).append(conn)
        if self._waiters:
            self._wake_one()

    def _forget(self, conn: Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            self._count -= 1
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._wake_one()

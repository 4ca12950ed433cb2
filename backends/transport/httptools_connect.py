"""How the httptools client opens a connection when its backend has an egress to honour.

:func:`open_connection` gives a connected protocol for one origin: direct (TLS with the
backend's context and ``server_name``), to a forward proxy that will take absolute-form
requests (a plain-http upstream), or through a ``CONNECT`` tunnel upgraded to TLS with
``loop.start_tls`` (an https upstream; TLS in TLS when the proxy is itself ``https://``).
The caller bounds the whole of it with its connect deadline.

Failures are ``backends.errors`` types (``backends.transport.egress``): the proxy unreachable
or refusing (407, another status to CONNECT), TLS refused on either leg. Any other ``OSError``
is left to the caller, which reports it as the upstream unreachable.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TypeVar

from backends.errors import UpstreamProtocolError, UpstreamProxyError
from backends.transport.egress import Egress, Proxy, proxy_refused, proxy_unreachable, tls_error

__all__ = ["open_connection"]

_MAX_REPLY = 16 * 1024  # a CONNECT reply's head; a proxy has no reason to send more
P = TypeVar("P", bound=asyncio.Protocol)


class _ConnectReply(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT: its head, nothing after it."""

    def __init__(self) -> None:
        self.head = asyncio.get_running_loop().create_future()
        self.data = b""

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.head.done():
            return
        end = self.data.find(b"\r\n\r\n")
        if end >= 0:
            self.head.set_result(self.data[: end + 4])
        elif len(self.data) > _MAX_REPLY:
            self.head.set_exception(ConnectionError("the proxy's CONNECT reply is too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(exc or ConnectionResetError("the proxy closed the connection"))


def _status(head: bytes, backend: str) -> int:
    line = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(line) < 2 or not line[0].startswith(b"HTTP/1.") or not line[1].isdigit():
        raise UpstreamProtocolError(
            f"backend {backend!r}: its proxy answered CONNECT with no HTTP status line", backend=backend
        )
    return int(line[1])


async def _to_proxy(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], P], proxy: Proxy, egress: Egress
) -> tuple[asyncio.Transport, P]:
    tls = egress.ssl if proxy.scheme == "https" else None
    try:
        transport, protocol = await loop.create_connection(
            factory, proxy.host, proxy.port, ssl=tls, server_hostname=proxy.host if tls else None
        )
    except ssl.SSLError as exc:
        raise tls_error(exc, egress.backend, proxy=True) from None
    except OSError as exc:
        raise proxy_unreachable(exc, egress.backend) from None
    return transport, protocol


async def open_connection(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], P], egress: Egress, scheme: str, host: str, port: int
) -> P:
    """``factory()``'s protocol, connected to ``scheme://host:port`` the way ``egress`` says."""
    https = scheme == "https"
    name = (egress.server_name or host) if https else None
    proxy = egress.proxy_for(scheme, host, port)
    if proxy is None:
        try:
            _, conn = await loop.create_connection(
                factory, host, port, ssl=egress.ssl if https else None, server_hostname=name
            )
        except ssl.SSLError as exc:
            raise tls_error(exc, egress.backend) from None
        return conn
    if not https:  # absolute-form requests to the proxy on this connection (the client writes them)
        _, conn = await _to_proxy(loop, factory, proxy, egress)
        return conn
    transport, reply = await _to_proxy(loop, _ConnectReply, proxy, egress)
    try:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        auth = f"Proxy-Authorization: {proxy.authorization}\r\n" if proxy.authorization else ""
        transport.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode())
        try:
            head = await reply.head
        except OSError as exc:
            raise UpstreamProxyError(
                f"backend {egress.backend!r}: its proxy failed during CONNECT ({type(exc).__name__})",
                backend=egress.backend,
            ) from None
        status = _status(head, egress.backend)
        if not 200 <= status < 300:
            raise proxy_refused(status, egress.backend)
        if len(reply.data) > len(head):  # the upstream spoke before our ClientHello: not TLS
            raise UpstreamProtocolError(
                f"backend {egress.backend!r}: bytes after the proxy's CONNECT reply", backend=egress.backend
            )
        conn = factory()
        try:
            tunnel = await loop.start_tls(transport, conn, egress.ssl, server_hostname=name)
        except ssl.SSLError as exc:
            raise tls_error(exc, egress.backend) from None
        assert tunnel is not None  # start_tls gives None only when the transport closed mid-way
    except BaseException:
        transport.close()
        raise
    conn.connection_made(tunnel)  # start_tls does not call it
    return conn

"""The upstream seam over aiohttp's client (``transport: aiohttp``); see ``backends.transport.base``.

Egress (``backends.transport.egress``): the backend's TLS context on the connector; its proxy
and ``server_name`` as per-request arguments, worked out once per URL and passed only when
there is one (aiohttp keys its pool by proxy and TLS context, so each keeps its own connections).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from backends.errors import UpstreamConnectError, UpstreamError, UpstreamProtocolError, UpstreamTimeoutError
from backends.transport.base import UpstreamResponse, refuse_encoding, too_large
from backends.transport.egress import (
    Egress,
    default_context,
    find_ssl_error,
    proxy_refused,
    proxy_unreachable,
    tls_error,
)
from schemas.config import TimeoutConfig

__all__ = ["AiohttpTransport"]


class _AiohttpResponse:
    __slots__ = ("_backend", "_max_body", "_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse, backend: str, max_body: int) -> None:
        self._resp = resp
        self._backend = backend
        self._max_body = max_body
        self.status = resp.status

    def header(self, name: str) -> str | None:
        return self._resp.headers.get(name)

    async def read(self) -> bytes:
        parts: list[bytes] = []
        left = self._max_body
        try:
            while chunk := await self._resp.content.readany():
                left -= len(chunk)
                if left < 0:
                    raise too_large(self._max_body, self._backend)
                parts.append(chunk)
            return b"".join(parts)
        except TimeoutError:
            raise UpstreamTimeoutError("timed out reading the upstream response", backend=self._backend) from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(
                f"upstream response cut short ({type(exc).__name__})", backend=self._backend
            ) from None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        content = self._resp.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                yield chunk
        except TimeoutError:
            raise UpstreamTimeoutError(
                "the upstream stream went idle", backend=self._backend, reason="stream_idle"
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(
                f"the upstream stream was cut ({type(exc).__name__})", backend=self._backend, reason="stream_cut"
            ) from None

    def release(self) -> None:
        resp = self._resp
        if resp.content.is_eof():
            resp.release()
        else:
            resp.close()


class _Route:
    """How one URL is requested: aiohttp's proxy / server_hostname arguments, headers for the proxy."""

    __slots__ = ("headers", "options", "proxied")

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self.headers: dict[str, str] = {}
        self.proxied = False


class AiohttpTransport:
    """aiohttp ``ClientSession`` with one keep-alive pool per backend."""

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
        self._max_body = max_body
        self._ssl = egress.ssl if egress is not None else default_context()
        self._egress = egress if egress is not None and not egress.direct else None
        self._routes: dict[str, _Route] = {}
        self._timeout = timeout
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        # Non-streaming: the whole exchange is bounded; streams: only the gaps between reads.
        self._plain_timeout = aiohttp.ClientTimeout(
            total=timeout.total, connect=timeout.connect, sock_read=timeout.first_byte
        )
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout.connect, sock_read=max(timeout.first_byte, timeout.stream_idle)
        )

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                ttl_dns_cache=60,
                enable_cleanup_closed=True,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                skip_auto_headers=("User-Agent",),
                trust_env=False,
                auto_decompress=False,  # an encoding we did not ask for is refused, never inflated
            )
        return self._session

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], stream: bool
    ) -> UpstreamResponse:
        route = self._route(url) if self._egress is not None else None
        try:
            resp = await self._client().request(
                method,
                url,
                data=body,
                headers={"Accept-Encoding": "identity", **headers, **route.headers}
                if route is not None
                else {"Accept-Encoding": "identity", **headers},
                timeout=self._stream_timeout if stream else self._plain_timeout,
                allow_redirects=False,
                **(route.options if route is not None else {}),
            )
        except TimeoutError:
            raise UpstreamTimeoutError("timed out waiting for the upstream", backend=self._backend) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self._failure(exc, route) from None
        if resp.status == 407 and route is not None and route.proxied:  # a plain-http upstream's proxy
            resp.close()
            raise proxy_refused(407, self._backend)
        encoding = resp.headers.get("Content-Encoding")
        if encoding and encoding.strip().lower() != "identity":
            resp.close()
            raise refuse_encoding(encoding, self._backend)
        return _AiohttpResponse(resp, self._backend, self._max_body)

    def _route(self, url: str) -> _Route:
        route = self._routes.get(url)
        if route is None:
            assert self._egress is not None
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            port = parts.port or (443 if scheme == "https" else 80)
            route = _Route()
            proxy = self._egress.proxy_for(scheme, parts.hostname or "", port)
            if proxy is not None:
                route.proxied = True
                route.options["proxy"] = proxy.url
                if proxy.authorization is not None:
                    if scheme == "https":  # on the CONNECT
                        route.options["proxy_headers"] = {"Proxy-Authorization": proxy.authorization}
                    else:  # on each request the proxy forwards (aiohttp puts proxy_headers on CONNECTs only)
                        route.headers["Proxy-Authorization"] = proxy.authorization
            if scheme == "https" and self._egress.server_name is not None:
                route.options["server_hostname"] = self._egress.server_name
            if len(self._routes) >= 64:
                self._routes.clear()
            self._routes[url] = route
        return route

    def _failure(self, exc: BaseException, route: _Route | None) -> UpstreamError:
        backend = self._backend
        proxied = route is not None and route.proxied
        if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy answered CONNECT with a refusal
            return proxy_refused(exc.status, backend)
        if isinstance(exc, aiohttp.ClientProxyConnectionError):
            return proxy_unreachable(exc, backend)
        cause = find_ssl_error(exc)
        if cause is not None:
            return tls_error(cause, backend)
        if isinstance(exc, aiohttp.ClientConnectionError | OSError):
            where = " through its proxy" if proxied else ""
            return UpstreamConnectError(f"cannot reach the upstream{where} ({type(exc).__name__})", backend=backend)
        return UpstreamProtocolError(f"bad upstream response ({type(exc).__name__})", backend=backend)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

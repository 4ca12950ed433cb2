"""The upstream seam over httpx (``transport: httpx``: any httpx transport, so respx can mock upstreams in tests).

Egress (``backends.transport.egress``): the backend's TLS context as ``verify``; with a proxy or a
``server_name``, :class:`_EgressRouter` sends each origin through the pool of its route (direct,
or one per proxy) and sets httpcore's ``sni_hostname``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from backends.errors import UpstreamConnectError, UpstreamError, UpstreamProtocolError, UpstreamTimeoutError
from backends.transport.base import UpstreamResponse, refuse_encoding, too_large
from backends.transport.egress import (
    Egress,
    Proxy,
    default_context,
    find_ssl_error,
    proxy_refused,
    proxy_unreachable,
    tls_error,
)
from schemas.config import TimeoutConfig

__all__ = ["HttpxTransport"]


_closing: set[asyncio.Future[None]] = set()


class _HttpxResponse:
    __slots__ = ("_backend", "_max_body", "_resp", "status")

    def __init__(self, resp: httpx.Response, backend: str, max_body: int) -> None:
        self._resp = resp
        self._backend = backend
        self._max_body = max_body
        self.status = resp.status_code

    def header(self, name: str) -> str | None:
        value: str | None = self._resp.headers.get(name)
        return value

    async def read(self) -> bytes:
        parts: list[bytes] = []
        left = self._max_body
        try:
            async for chunk in self._resp.aiter_raw():
                left -= len(chunk)
                if left < 0:
                    raise too_large(self._max_body, self._backend)
                parts.append(chunk)
            return b"".join(parts)
        except httpx.TimeoutException:
            raise UpstreamTimeoutError("timed out reading the upstream response", backend=self._backend) from None
        except (httpx.HTTPError, OSError) as exc:  # OSError: anyio lets a TLS error through unwrapped
            raise UpstreamProtocolError(
                f"upstream response cut short ({type(exc).__name__})", backend=self._backend
            ) from None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                if chunk:
                    yield chunk
        except httpx.TimeoutException:
            raise UpstreamTimeoutError(
                "the upstream stream went idle", backend=self._backend, reason="stream_idle"
            ) from None
        except (httpx.HTTPError, OSError) as exc:
            raise UpstreamProtocolError(
                f"the upstream stream was cut ({type(exc).__name__})", backend=self._backend, reason="stream_cut"
            ) from None

    def release(self) -> None:
        # aclose() is a coroutine; schedule it so release() stays synchronous like aiohttp's,
        # and keep a reference until it is done so it cannot be garbage-collected mid-way.
        if not self._resp.is_closed:
            task = asyncio.ensure_future(self._resp.aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80)


class _EgressRouter(httpx.AsyncBaseTransport):
    """Each origin to its route's pool: direct, or the pool of its proxy (CONNECT or absolute-form)."""

    def __init__(self, egress: Egress, limits: httpx.Limits) -> None:
        self._egress = egress
        self._limits = limits
        self._direct = httpx.AsyncHTTPTransport(verify=egress.ssl, limits=limits)
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}  # by proxy URL

    def proxy_for(self, url: httpx.URL) -> Proxy | None:
        return self._egress.proxy_for(*_origin(url))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme == "https" and self._egress.server_name is not None:
            request.extensions["sni_hostname"] = self._egress.server_name
        proxy = self.proxy_for(request.url)
        if proxy is None:
            return await self._direct.handle_async_request(request)
        pool = self._pools.get(proxy.url)
        if pool is None:
            auth = (proxy.username, proxy.password or "") if proxy.username is not None else None
            pool = self._pools[proxy.url] = httpx.AsyncHTTPTransport(
                verify=self._egress.ssl,
                limits=self._limits,
                proxy=httpx.Proxy(
                    proxy.url, auth=auth, ssl_context=self._egress.ssl if proxy.scheme == "https" else None
                ),
            )
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        await self._direct.aclose()
        for pool in self._pools.values():
            await pool.aclose()


class HttpxTransport:
    """``httpx.AsyncClient``; pass ``transport=`` (e.g. respx's or httpx-aiohttp's) to swap the I/O layer."""

    def __init__(
        self,
        backend: str,
        timeout: TimeoutConfig,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        max_body: int = 64 * 1024 * 1024,
        egress: Egress | None = None,
    ) -> None:
        self._backend = backend
        self._max_body = max_body
        self._timeout = timeout
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._router: _EgressRouter | None = None
        if transport is None and egress is not None and not egress.direct:
            transport = self._router = _EgressRouter(egress, limits)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout.total, connect=timeout.connect, read=timeout.first_byte),
            limits=limits,
            transport=transport,
            verify=egress.ssl if egress is not None else default_context(),
            trust_env=False,  # the backend's egress decides (trust_env there), never httpx's own reading
            follow_redirects=False,
        )
        self._stream_timeout = httpx.Timeout(
            None, connect=timeout.connect, read=max(timeout.first_byte, timeout.stream_idle)
        )

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], stream: bool
    ) -> UpstreamResponse:
        request = self._client.build_request(
            method,
            url,
            content=body,
            headers={"Accept-Encoding": "identity", **headers},
            timeout=self._stream_timeout if stream else httpx.USE_CLIENT_DEFAULT,
        )
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.TimeoutException:
            raise UpstreamTimeoutError("timed out waiting for the upstream", backend=self._backend) from None
        except (httpx.HTTPError, OSError) as exc:  # OSError: anyio lets a TLS error through unwrapped
            raise self._failure(exc, request) from None
        if resp.status_code == 407 and self._router is not None and self._router.proxy_for(request.url) is not None:
            await resp.aclose()  # a plain-http upstream's proxy refused us, not the upstream
            raise proxy_refused(407, self._backend)
        encoding = resp.headers.get("Content-Encoding")
        if encoding and encoding.strip().lower() != "identity":
            await resp.aclose()
            raise refuse_encoding(encoding, self._backend)
        return _HttpxResponse(resp, self._backend, self._max_body)

    def _failure(self, exc: httpx.HTTPError | OSError, request: httpx.Request) -> UpstreamError:
        backend = self._backend
        if isinstance(exc, httpx.ProxyError):  # httpcore: "407 Proxy Authentication Required"
            code = str(exc).split(" ", 1)[0]
            return proxy_refused(int(code) if code.isdigit() else 502, backend)
        cause = find_ssl_error(exc)
        if cause is not None:
            return tls_error(cause, backend)
        if isinstance(exc, httpx.ConnectError) and self._router is not None and self._router.proxy_for(request.url):
            return proxy_unreachable(exc, backend)  # through a proxy, the only connection made is to it
        if isinstance(
            exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError | OSError
        ):
            return UpstreamConnectError(f"cannot reach the upstream ({type(exc).__name__})", backend=backend)
        return UpstreamProtocolError(f"bad upstream response ({type(exc).__name__})", backend=backend)

    async def close(self) -> None:
        await self._client.aclose()

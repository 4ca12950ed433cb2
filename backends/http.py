"""The upstream HTTP seam: one small contract, two implementations.

Contract (:class:`HTTPTransport`):
- ``await transport.send(method, url, body=..., headers=..., stream=...)`` returns
  once the status line and headers have arrived, as an :class:`UpstreamResponse`.
- The caller owns the response and must call ``release()`` exactly once (in a
  ``finally``); releasing a fully read response returns its connection to the
  keep-alive pool, releasing a half-read one closes the connection, which is how
  an abandoned stream stops the upstream's work.
- Every failure is raised as a ``backends.errors`` type; aiohttp/httpx/asyncio
  exceptions never escape this module.

Implementations: ``backends.fasthttp.FastHTTPTransport`` (the default: httptools
parsing on raw asyncio connections, about a third of aiohttp's client CPU per
request), :class:`AiohttpTransport`, and :class:`HttpxTransport` (any ``httpx``
transport, so respx can mock the upstream in tests). One transport per backend,
created at start-up, pooled and kept alive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
import httpx

from backends.errors import UpstreamConnectError, UpstreamError, UpstreamProtocolError, UpstreamTimeoutError
from schemas.config import TimeoutConfig

__all__ = ["AiohttpTransport", "HTTPTransport", "HttpxTransport", "UpstreamResponse", "get_ok"]


class UpstreamResponse(Protocol):
    status: int

    def header(self, name: str) -> str | None: ...

    async def read(self) -> bytes: ...

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    def release(self) -> None: ...


class HTTPTransport(Protocol):
    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], stream: bool
    ) -> UpstreamResponse: ...

    async def close(self) -> None: ...


async def get_ok(transport: HTTPTransport, url: str, headers: Mapping[str, str] | None = None) -> bytes | None:
    """``GET url`` for probes and scrapes: the body on 200, ``None`` on any other answer or failure."""
    try:
        resp = await transport.send("GET", url, body=None, headers=headers or {}, stream=False)
        try:
            data = await resp.read()
        finally:
            resp.release()
    except UpstreamError:
        return None
    return data if resp.status == 200 else None


# --- aiohttp ----------------------------------------------------------------------


class _AiohttpResponse:
    __slots__ = ("_backend", "_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse, backend: str) -> None:
        self._resp = resp
        self._backend = backend
        self.status = resp.status

    def header(self, name: str) -> str | None:
        return self._resp.headers.get(name)

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
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


class AiohttpTransport:
    """aiohttp ``ClientSession`` with one keep-alive pool per backend."""

    def __init__(self, backend: str, timeout: TimeoutConfig, max_connections: int) -> None:
        self._backend = backend
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
                limit=self._max_connections, limit_per_host=0, ttl_dns_cache=60, enable_cleanup_closed=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector, skip_auto_headers=("User-Agent",), trust_env=False
            )
        return self._session

    async def send(
        self, method: str, url: str, *, body: bytes | None, headers: Mapping[str, str], stream: bool
    ) -> UpstreamResponse:
        try:
            resp = await self._client().request(
                method,
                url,
                data=body,
                headers=headers,
                timeout=self._stream_timeout if stream else self._plain_timeout,
                allow_redirects=False,
            )
        except TimeoutError:
            raise UpstreamTimeoutError("timed out waiting for the upstream", backend=self._backend) from None
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise UpstreamConnectError(
                f"cannot reach the upstream ({type(exc).__name__})", backend=self._backend
            ) from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(
                f"bad upstream response ({type(exc).__name__})", backend=self._backend
            ) from None
        return _AiohttpResponse(resp, self._backend)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# --- httpx ------------------------------------------------------------------------


_closing: set[asyncio.Future[None]] = set()


class _HttpxResponse:
    __slots__ = ("_backend", "_resp", "status")

    def __init__(self, resp: httpx.Response, backend: str) -> None:
        self._resp = resp
        self._backend = backend
        self.status = resp.status_code

    def header(self, name: str) -> str | None:
        value: str | None = self._resp.headers.get(name)
        return value

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.TimeoutException:
            raise UpstreamTimeoutError("timed out reading the upstream response", backend=self._backend) from None
        except httpx.HTTPError as exc:
            raise UpstreamProtocolError(
                f"upstream response cut short ({type(exc).__name__})", backend=self._backend
            ) from None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_bytes():
                if chunk:
                    yield chunk
        except httpx.TimeoutException:
            raise UpstreamTimeoutError(
                "the upstream stream went idle", backend=self._backend, reason="stream_idle"
            ) from None
        except httpx.HTTPError as exc:
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


class HttpxTransport:
    """``httpx.AsyncClient``; pass ``transport=`` (e.g. respx's or httpx-aiohttp's) to swap the I/O layer."""

    def __init__(
        self,
        backend: str,
        timeout: TimeoutConfig,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._backend = backend
        self._timeout = timeout
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout.total, connect=timeout.connect, read=timeout.first_byte),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            trust_env=False,
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
            headers=headers,
            timeout=self._stream_timeout if stream else httpx.USE_CLIENT_DEFAULT,
        )
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.TimeoutException:
            raise UpstreamTimeoutError("timed out waiting for the upstream", backend=self._backend) from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise UpstreamConnectError(
                f"cannot reach the upstream ({type(exc).__name__})", backend=self._backend
            ) from None
        except httpx.HTTPError as exc:
            raise UpstreamProtocolError(
                f"bad upstream response ({type(exc).__name__})", backend=self._backend
            ) from None
        return _HttpxResponse(resp, self._backend)

    async def close(self) -> None:
        await self._client.aclose()

"""The upstream seam over httpx (``transport: httpx``: any httpx transport, so respx can mock upstreams in tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from backends.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeoutError
from backends.transport.base import UpstreamResponse, refuse_encoding, too_large
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
        except httpx.HTTPError as exc:
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
        *,
        max_body: int = 64 * 1024 * 1024,
    ) -> None:
        self._backend = backend
        self._max_body = max_body
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
            headers={"Accept-Encoding": "identity", **headers},
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
        encoding = resp.headers.get("Content-Encoding")
        if encoding and encoding.strip().lower() != "identity":
            await resp.aclose()
            raise refuse_encoding(encoding, self._backend)
        return _HttpxResponse(resp, self._backend, self._max_body)

    async def close(self) -> None:
        await self._client.aclose()

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

Implementations: ``backends.transport.httptools_client.FastHTTPTransport`` (the default: httptools
parsing on raw asyncio connections, about a third of aiohttp's client CPU per
request), :class:`AiohttpTransport`, and :class:`HttpxTransport` (any ``httpx``
transport, so respx can mock the upstream in tests). One transport per backend,
created at start-up, pooled and kept alive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from backends.errors import UpstreamError

__all__ = ["HTTPTransport", "UpstreamResponse", "get_ok"]


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

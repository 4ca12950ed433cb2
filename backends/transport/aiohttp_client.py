"""The upstream seam over aiohttp's client (``transport: aiohttp``); see ``backends.transport.base``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import aiohttp

from backends.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeoutError
from backends.transport.base import UpstreamResponse, refuse_encoding, too_large
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


class AiohttpTransport:
    """aiohttp ``ClientSession`` with one keep-alive pool per backend."""

    def __init__(
        self, backend: str, timeout: TimeoutConfig, max_connections: int, *, max_body: int = 64 * 1024 * 1024
    ) -> None:
        self._backend = backend
        self._max_body = max_body
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
                connector=connector,
                skip_auto_headers=("User-Agent",),
                trust_env=False,
                auto_decompress=False,  # an encoding we did not ask for is refused, never inflated
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
                headers={"Accept-Encoding": "identity", **headers},
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
        encoding = resp.headers.get("Content-Encoding")
        if encoding and encoding.strip().lower() != "identity":
            resp.close()
            raise refuse_encoding(encoding, self._backend)
        return _AiohttpResponse(resp, self._backend, self._max_body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

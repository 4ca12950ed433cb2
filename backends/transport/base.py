"""The upstream HTTP seam: one small contract, two implementations.

Contract (:class:`HTTPTransport`):
- ``await transport.send(method, url, body=..., headers=..., stream=...)`` returns
  once the status line and headers have arrived, as an :class:`UpstreamResponse`.
- The caller owns the response and must call ``release()`` exactly once (in a
  ``finally``); releasing a fully read response returns its connection to the
  keep-alive pool, releasing a half-read one closes the connection, which is how
  an abandoned stream stops the upstream's work.
- Every failure is raised as a ``backends.errors`` type; aiohttp/httpx/asyncio
  exceptions never escape the clients.
- Bounded: every client asks for ``Accept-Encoding: identity`` and refuses any other
  ``Content-Encoding`` (:func:`refuse_encoding`); ``read()`` fails once a body passes the
  client's ``max_body`` (:func:`too_large`; ``limits.max_response_bytes``).

:func:`send_ok` is the one place a non-2xx answer becomes an error: it reads at most
the first 64 KiB of the error body, releases the response, and lets the backend family
turn status and body into its :class:`~backends.errors.UpstreamStatusError`.

Implementations: ``backends.transport.httptools_client.FastHTTPTransport`` (the default: httptools
parsing on raw asyncio connections, about a third of aiohttp's client CPU per
request), :class:`AiohttpTransport`, and :class:`HttpxTransport` (any ``httpx``
transport, so respx can mock the upstream in tests). One transport per backend,
created at start-up, pooled and kept alive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import NoReturn, Protocol

from backends.errors import UpstreamError, UpstreamTooLargeError, name_the_path

__all__ = [
    "HTTPTransport",
    "StatusError",
    "UpstreamResponse",
    "get_ok",
    "refuse_encoding",
    "refuse_status",
    "send_ok",
    "too_large",
]

_ERROR_BODY = 64 * 1024  # an error's message is at its start; the rest is not read

# (status, body, Retry-After) -> the family's error for a non-2xx answer
StatusError = Callable[[int, bytes, str | None], UpstreamError]


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


async def send_ok(
    transport: HTTPTransport,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    stream: bool,
    status_error: StatusError,
) -> UpstreamResponse:
    """``POST url``; the 200 response (the caller releases it), or ``status_error``'s error for another status."""
    resp = await transport.send("POST", url, body=body, headers=headers, stream=stream)
    if resp.status == 200:
        return resp
    await refuse_status(resp, status_error, url)


async def refuse_status(resp: UpstreamResponse, status_error: StatusError, url: str = "") -> NoReturn:
    """The one non-200 path: release ``resp`` after reading at most 64 KiB of its body, raise ``status_error``'s error
    (a 404 for the path said with ``url``'s path: ``backends.errors.name_the_path``).

    :func:`send_ok` ends here; an adapter on the hot path may call ``transport.send`` itself
    (one coroutine less per request) and come here for any status but 200.
    """
    data = b""
    try:
        async for chunk in resp.iter_chunks():
            data += chunk
            if len(data) >= _ERROR_BODY:
                data = data[:_ERROR_BODY]
                break
    except UpstreamError:
        pass  # the status says enough
    finally:
        resp.release()
    error = status_error(resp.status, data, resp.header("Retry-After"))
    raise name_the_path(error, "POST", url) if url else error


def too_large(limit: int, backend: str) -> UpstreamTooLargeError:
    return UpstreamTooLargeError(
        f"the upstream body is larger than {limit} bytes (limits.max_response_bytes)", backend=backend
    )


def refuse_encoding(encoding: str, backend: str) -> UpstreamTooLargeError:
    return UpstreamTooLargeError(
        f"the upstream answered in Content-Encoding {encoding[:32]!r}, which the gateway did not ask for",
        backend=backend,
        reason="encoded",
    )

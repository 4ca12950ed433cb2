"""Server-side limits against hostile or broken clients, from ``server:`` in the config.

- Header size and count (``max_header_bytes``, ``max_headers``) and the slow-header timeout
  (``client_header_timeout``) are enforced by aiohttp's HTTP protocol itself:
  :func:`handler_args` turns them into the ``handler_args`` of the application, so every
  runner that serves the app (``gateway serve``, the tests) applies them. aiohttp answers a
  header over the limits with a plain-text 400 and closes the connection (our middleware
  never sees such a request: it could not be parsed). Its keep-alive timer doubles as the
  header timeout: a connection that has not delivered a complete request head that long
  after it opened or after its previous answer is closed, however slowly it trickles bytes.
- The body timeout (``client_body_timeout``) is :func:`read_body`: a body still arriving
  that long after the headers is answered 408 and the connection closed (after at most as
  long again, aiohttp's lingering read). The common case, a body that came with its
  headers, takes no timer at all.
- The body size (``max_body_bytes``, 413) is aiohttp's ``client_max_size``, counted after
  aiohttp has inflated a ``gzip``/``deflate`` body, so a decompression bomb stops at the same
  limit; the prompt-array bound is :class:`gateway.security.caps.Caps`.
- A body that does not decode per its ``Content-Encoding`` is a 400
  (``invalid_content_encoding``), a coding other than identity, gzip and deflate a 415
  (``unsupported_content_encoding``): aiohttp passes unknown codings through undecoded, which
  would otherwise reach the JSON parser as garbage, or as JSON the client did not mean.
- Secrets never leave in an error body: every secret of a loaded config (each ``SecretStr``
  in it, and the password of a Redis or proxy URL) is registered by :func:`register_secrets`, and
  :func:`redact` replaces them in an error body before it is sent (an upstream may echo our
  credentials in an error message we pass on). Only error bodies pay for it. The registry and
  ``redact`` live in ``backends.errors``, which must redact an upstream message *before* it
  cuts it (a secret straddling the cut would otherwise leak minus its tail).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote, urlsplit

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, SecretStr

from backends.errors import redact, register_secret
from gateway.http.protocol import UNSUPPORTED_ENCODING, malformed_message
from schemas.config import ServerConfig
from schemas.errors import BodyEncodingError, RequestTimeoutError

__all__ = ["BodyEncodingError", "RequestTimeoutError", "handler_args", "read_body", "redact", "register_secrets"]

_LINGERING = 10.0  # aiohttp's default


# What aiohttp inflates itself (br and zstd only with optional libraries: it refuses them at
# the header otherwise, see gateway.http.protocol); "identity" is no coding at all.
_DECODED = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})


def handler_args(server: ServerConfig) -> dict[str, Any]:
    """aiohttp ``RequestHandler`` settings for ``web.Application(handler_args=...)``."""
    return {
        "max_line_size": server.max_header_bytes,
        "max_field_size": server.max_header_bytes,
        "max_headers": server.max_headers,
        "keepalive_timeout": server.client_header_timeout,
        # After an answer sent before the body was read (413, 408), aiohttp keeps reading the
        # rest so the client sees the answer: no longer than a body may take anyway.
        "lingering_time": min(_LINGERING, server.client_body_timeout),
    }


async def read_body(request: web.Request, seconds: float) -> bytes:
    """The whole body (inflated), 408 when it takes longer than ``seconds`` to arrive, 400/415
    when its ``Content-Encoding`` is unknown or wrong (the parser's message, which may quote the
    body, is never passed on)."""
    coding = request.headers.get(hdrs.CONTENT_ENCODING)  # most requests send none: no str calls then
    if coding is not None and coding.strip().lower() not in _DECODED:
        raise BodyEncodingError(UNSUPPORTED_ENCODING, status=415, code="unsupported_content_encoding")
    try:
        if request.content.is_eof():  # all of it is buffered already: no timer needed
            return await request.read()
        async with asyncio.timeout(seconds):
            return await request.read()
    except (HttpProcessingError, web.RequestPayloadError) as exc:
        status, message, code = malformed_message(exc, 400)
        raise BodyEncodingError(message, status=status, code=code) from None
    except TimeoutError:
        # The connection is mid-body: answer, then close it rather than keep it alive.
        request.protocol.close()
        raise RequestTimeoutError(f"The request body did not arrive within {seconds:g} seconds.") from None


def _secret_values(node: Any) -> list[str]:
    if isinstance(node, SecretStr):
        value = node.get_secret_value()
        if value.startswith(("redis://", "rediss://", "unix://", "http://", "https://")):  # a URL: its password too
            password = urlsplit(value).password
            return [value] + ([password, unquote(password)] if password else [])
        return [] if value == "memory" else [value]
    if isinstance(node, BaseModel):
        return [v for name in type(node).model_fields for v in _secret_values(getattr(node, name))]
    if isinstance(node, dict):
        return [v for item in node.values() for v in _secret_values(item)]
    if isinstance(node, list | tuple):
        return [v for item in node for v in _secret_values(item)]
    return []


def register_secrets(config: BaseModel) -> None:
    """Remember every secret in ``config`` for :func:`redact` (process-wide; never cleared)."""
    for value in _secret_values(config):
        register_secret(value)

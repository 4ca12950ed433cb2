"""Upstream failures, typed at the adapter boundary.

Tree (all :class:`schemas.errors.GatewayError`)::

    UpstreamError                 502, base; ``retryable`` says whether another try may help
    ├── UpstreamConnectError      502, retryable: no connection (refused, reset before any byte, DNS)
    ├── UpstreamTimeoutError      504, retryable before the first byte
    ├── UpstreamStatusError       the upstream answered non-2xx; status and retryability from the code
    └── UpstreamProtocolError     502: garbage JSON, a stream cut before [DONE], an error event mid-stream

Foreign exceptions (aiohttp, httpx, asyncio) are translated into these in
``backends.transport.base``; nothing above the adapters sees them.
"""

from __future__ import annotations

from typing import Any

import orjson

from schemas.errors import GatewayError

__all__ = [
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamStatusError",
    "UpstreamTimeoutError",
    "error_from_upstream_body",
    "parse_retry_after",
]


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = False

    def __init__(self, message: str, *, backend: str = "", reason: str = "error", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.backend = backend
        # A short fixed word for metrics labels: connect, timeout, status_5xx, protocol ...
        self.reason = reason


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"
    retryable = True

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("reason", "connect")
        super().__init__(message, **kwargs)


class UpstreamTimeoutError(UpstreamError):
    status = 504
    code = "upstream_timeout"
    retryable = True

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("reason", "timeout")
        super().__init__(message, **kwargs)


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("reason", "protocol")
        super().__init__(message, **kwargs)


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status.

    How its status reaches the client:
    - 400/413/422 (about the request itself): 400 (413 kept), the upstream's message passed on;
    - 429: 429 ``rate_limit_error``, ``Retry-After`` kept, retryable elsewhere;
    - 401/403: 502 (the gateway's own credentials were refused; the client's key is not the issue);
    - 404: 502 (the route names a model the upstream does not serve: a config problem);
    - 408 and 504: 504; 500/502/503: 502/502/503, retryable; other codes: 502.
    """

    def __init__(
        self, upstream_status: int, upstream_message: str, *, retry_after: float | None = None, **kwargs: Any
    ) -> None:
        self.upstream_status = upstream_status
        status, type_, code, retryable, message = _classify(upstream_status, upstream_message)
        kwargs.setdefault("reason", f"status_{upstream_status}")
        super().__init__(message, status=status, type=type_, code=code, retry_after=retry_after, **kwargs)
        self.retryable = retryable


def _classify(status: int, message: str) -> tuple[int, str, str | None, bool, str]:
    if status in (400, 422):
        return 400, "invalid_request_error", None, False, message
    if status == 413:
        return 413, "invalid_request_error", "request_too_large", False, message
    if status == 429:
        return 429, "rate_limit_error", "upstream_rate_limited", True, f"the upstream is rate limiting: {message}"
    if status in (401, 403):
        return (
            502,
            "upstream_error",
            "upstream_auth_failed",
            False,
            f"the upstream refused the gateway's credentials ({status})",
        )
    if status == 404:
        return (
            502,
            "upstream_error",
            "upstream_model_not_found",
            False,
            f"the upstream does not serve the routed model: {message}",
        )
    if status in (408, 504):
        return 504, "upstream_error", "upstream_timeout", True, f"the upstream timed out ({status})"
    if status == 503:
        return 503, "upstream_error", "upstream_unavailable", True, "the upstream is unavailable (503)"
    if status in (500, 502):
        return 502, "upstream_error", "upstream_error", True, f"the upstream failed ({status})"
    if 400 <= status < 500:
        return status, "invalid_request_error", None, False, message
    return 502, "upstream_error", "upstream_error", False, f"the upstream answered {status}"


def _message_of(body: bytes) -> str:
    """The human message of an upstream error body, whatever its shape.

    Shapes: OpenAI/vLLM>=0.10.1 ``{"error": {"message": ...}}``; vLLM<0.10.1 flat
    ``{"object": "error", "message": ...}``; TGI/Ollama ``{"error": "..."}``;
    vLLM's 401 ``{"error": "Unauthorized"}``; anything else: the text itself, trimmed.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return text[:500] if text else "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return str(data)[:500]


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_upstream_body(status: int, body: bytes, retry_after: str | None, backend: str) -> UpstreamStatusError:
    return UpstreamStatusError(status, _message_of(body), retry_after=parse_retry_after(retry_after), backend=backend)

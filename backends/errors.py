"""Upstream failures, typed at the adapter boundary.

Tree (all :class:`schemas.errors.GatewayError`)::

    UpstreamError                 502, base; ``retryable`` says whether another try may help
    ├── UpstreamConnectError      502, retryable: no connection (refused, DNS, dead before the request was sent)
    │   ├── Unsent                502, retryable: a pooled connection dead before the request was written
    │   │                         (backends.transport.httptools_exchange: sent again at once on a new one)
    │   ├── UpstreamClosedError   502, retryable: the request was sent, the connection closed unanswered
    │   ├── UpstreamTLSError      502, failed over, not retried here: a certificate refused (either side)
    │   └── UpstreamProxyError    502, failed over: the forward proxy unreachable, 407, a refused CONNECT
    ├── UpstreamTimeoutError      504, retryable before the first byte
    ├── UpstreamStatusError       the upstream answered non-2xx; status and retryability from the code
    ├── NoReadyWorkerError        503, retryable elsewhere: no worker of a pool / server of a vllm backend ready in time
    └── UpstreamProtocolError     502: garbage JSON, a stream cut before [DONE], an error event mid-stream
        ├── UpstreamTooLargeError 502: a body or one stream event over the backend's ``limits``, or encoded
        └── UpstreamGenerationError 502: vLLM ended a generation with ``finish_reason`` abort or error

Also here: the one rule of what is worth another try (:func:`retryable`), shared by the
service's retry policy and the pool's move to another worker. Upstream error bodies are read
(redacted, bounded, as words) by :mod:`backends.error_bodies`, re-exported here.

Foreign exceptions (aiohttp, httpx, asyncio) are translated into these in
the ``backends.transport`` clients; nothing above the adapters sees them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit, urlunsplit

from backends.error_bodies import ErrorFields, error_fields, redact, register_secret
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.embeddings import EmbeddingRequest
from schemas.errors import GatewayError
from schemas.rerank import RerankRequest
from schemas.responses import ResponsesRequest

log = logging.getLogger("backends")
E = TypeVar("E", bound=BaseException)

__all__ = [
    "RETRYABLE_BEFORE_FIRST_BYTE",
    "ErrorFields",
    "NoReadyWorkerError",
    "UpstreamClosedError",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamGenerationError",
    "UpstreamProtocolError",
    "UpstreamProxyError",
    "UpstreamStatusError",
    "UpstreamTLSError",
    "UpstreamTimeoutError",
    "UpstreamTooLargeError",
    "error_fields",
    "error_from_upstream_body",
    "parse_retry_after",
    "redact",
    "register_secret",
    "retryable",
]


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = False
    # With ``retryable``: False when another route may succeed but another try of the same
    # backend will not (the same certificate, the same refused proxy credentials).
    retry_here = True
    # A subclass names its kind of failure here instead of an ``__init__`` of its own.
    default_reason: ClassVar[str] = "error"

    def __init__(self, message: str, *, backend: str = "", reason: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.backend = backend
        # A short fixed word for metrics labels: connect, timeout, status_5xx, protocol ...
        self.reason = reason if reason is not None else self.default_reason


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"
    retryable = True
    default_reason = "connect"


class UpstreamClosedError(UpstreamConnectError):
    """The request was written, then the connection closed without a response byte.

    The upstream may have read and run it, so the transport never sends it again; whether
    another try is worth a possible duplicate is the retry policy's call (``retryable``).
    """

    code = "upstream_closed"
    default_reason = "closed"


class UpstreamTLSError(UpstreamConnectError):
    """TLS with the upstream (or an https proxy) failed: a certificate not trusted, expired or for
    another name, or the gateway's client certificate refused. The message carries OpenSSL's reason.

    Failed over to a model's other routes, never retried on this backend: its next handshake
    meets the same certificate.
    """

    code = "upstream_tls_error"
    default_reason = "tls"
    retry_here = False


class UpstreamProxyError(UpstreamConnectError):
    """The backend's forward proxy: unreachable (``proxy``), refusing the gateway's credentials
    (407: ``proxy_auth``, code ``upstream_proxy_auth_failed``), or answering CONNECT with another
    status (``proxy``). Failed over like any connect failure; retried on this backend only when
    another try may pass (unreachable, or 502/503/504: the proxy's word that the upstream is away)."""

    code = "upstream_proxy_error"
    default_reason = "proxy"

    def __init__(self, message: str, *, retry_here: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_here = retry_here


class UpstreamTimeoutError(UpstreamError):
    status = 504
    code = "upstream_timeout"
    retryable = True
    default_reason = "timeout"


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"
    default_reason = "protocol"


class UpstreamTooLargeError(UpstreamProtocolError):
    """Over a ``limits`` cap of the backend, or in a ``Content-Encoding`` the gateway did not ask for."""

    code = "upstream_response_too_large"
    default_reason = "too_large"


class UpstreamGenerationError(UpstreamProtocolError):
    """vLLM ended a generation with ``finish_reason`` ``abort`` or ``error``: no usable answer."""

    code = "upstream_generation_failed"


class NoReadyWorkerError(UpstreamError):
    """No endpoint of the backend could take the call in time (503, retryable elsewhere)."""

    status = 503
    code = "upstream_unavailable"
    retryable = True
    default_reason = "no_ready_worker"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status.

    How its status reaches the client:
    - 400/413/422 (about the request itself): 400 (413 kept), the upstream's message passed on;
    - 429: 429 ``rate_limit_error``, ``Retry-After`` kept, retryable elsewhere;
    - 401/403: 502 (the gateway's own credentials were refused; the client's key is not the issue);
    - 404 whose error names a field of the request (``about_request``: OpenAI's "Item with id ...
      not found", ``param: input``): 404, the upstream's message passed on, as a 400 is;
    - any other 404: 502 ``upstream_model_not_found`` (the route names a model the upstream does not
      serve), or ``upstream_misconfigured`` when the upstream's error names no model (no such path:
      a ``base_url`` without ``/v1``); both config problems;
    - 408 and 504: 504; 500/502/503: 502/502/503, retryable; other codes: 502.
    """

    def __init__(
        self,
        upstream_status: int,
        upstream_message: str,
        *,
        retry_after: float | None = None,
        about_request: bool = False,
        **kwargs: Any,
    ) -> None:
        self.upstream_status = upstream_status
        if upstream_status == 404 and about_request:
            status, type_, code, retryable, message = 404, "invalid_request_error", None, False, upstream_message
        else:
            status, type_, code, retryable, message = _classify(upstream_status, upstream_message)
        kwargs.setdefault("reason", f"status_{upstream_status}")
        super().__init__(message, status=status, type=type_, code=code, retry_after=retry_after, **kwargs)
        self.retryable = retryable


MISCONFIGURED = "upstream_misconfigured"
_told_misconfigured: set[tuple[str, str]] = set()  # (backend, URL) pairs already logged


def name_the_path(error: E, method: str, url: str) -> E:
    """``error`` as is, unless it is a 404 for the path (``upstream_misconfigured``): then said with
    the path asked for (``POST /completions``: whether ``/v1`` is in it shows at a glance) and the
    backend, and logged once per backend and URL with the URL the operator configured.

    The client's message names no host (as no other upstream error does); the log line does.
    """
    if not isinstance(error, UpstreamError) or error.code != MISCONFIGURED:
        return error
    parts = urlsplit(url)
    error.message = (
        f"backend {error.backend!r} answered 404 for {method} {parts.path} (the path, not the model): "
        "its base_url is likely wrong (vLLM and OpenAI-compatible servers serve under /v1; "
        "gateway check-config --probe checks it)"
    )
    error.args = (error.message,)
    shown = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    if (error.backend, shown) not in _told_misconfigured and len(_told_misconfigured) < 1024:
        _told_misconfigured.add((error.backend, shown))
        log.warning("backend %s: %s %s answered 404 for the path: check its base_url", error.backend, method, shown)
    return error


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
        if "model" not in message.lower():
            # A 404 whose error names no model is about the path: a base_url without /v1 (or with
            # one too many). refuse_status names the path asked for (name_the_path).
            return 502, "upstream_error", MISCONFIGURED, False, "the upstream has no such path (404): check base_url"
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


# --- what is worth another try ----------------------------------------------------------

# Stream failures that are safe to retry while nothing has reached the client: the upstream
# accepted the request but cut or went silent before its first event.
RETRYABLE_BEFORE_FIRST_BYTE = frozenset({"stream_cut", "stream_idle"})


def retryable(exc: BaseException) -> bool:
    """Whether another try (this backend, another worker or another route) may succeed where ``exc`` failed."""
    return isinstance(exc, UpstreamError) and (exc.retryable or exc.reason in RETRYABLE_BEFORE_FIRST_BYTE)


# Every endpoint's fields: an upstream's param is kept when it names one of them.
_REQUEST_FIELDS = frozenset(CompletionRequest.model_fields).union(
    ChatCompletionRequest.model_fields,
    EmbeddingRequest.model_fields,
    RerankRequest.model_fields,
    ResponsesRequest.model_fields,
)
# A path inside a field as OpenAI writes it (``input[2].content[0].type``, ``tools[0].name``):
# indexes and key names only (``messages.0.content``, a validator's location, is no client path).
_PATH = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[\d+\]|\.[A-Za-z_][A-Za-z0-9_]*)+")


def _ours(param: str, fields: Container[str]) -> bool:
    """Whether an upstream's ``param`` names one of our ``fields``, or a path inside one."""
    if param in fields:
        return True
    path = _PATH.fullmatch(param)
    return path is not None and path.group(1) in fields


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_upstream_body(
    status: int,
    body: bytes,
    retry_after: str | None,
    backend: str,
    *,
    rename: Callable[[str], str] | None = None,
    fields: Container[str] = _REQUEST_FIELDS,
) -> UpstreamStatusError:
    """Our error for an upstream's non-2xx answer (the one place that turns a status and body into it).

    On a client error (``invalid_request_error``) the upstream's ``param`` is kept when it
    names one of our request ``fields`` or a path inside one, as OpenAI writes them
    (``input[2].content[0].type``) (after ``rename``, the family's own spelling; by default
    any endpoint's, a caller that knows the request's endpoint passes that one's), and its
    ``code`` when it is a string (``context_length_exceeded``); otherwise both are null,
    never a server-sounding code.
    """
    parsed = error_fields(body)
    param = parsed.param
    if param is not None and rename is not None:
        param = rename(param)
    ours = param if param is not None and _ours(param, fields) else None
    # A 404 naming a field (not the model: a route's) is about the request, not the configuration
    about = ours is not None and ours != "model"
    error = UpstreamStatusError(
        status, parsed.message, retry_after=parse_retry_after(retry_after), about_request=about, backend=backend
    )
    if error.type == "invalid_request_error":
        error.param = ours
        if parsed.code is not None:
            error.code = parsed.code
        elif error.code == UpstreamStatusError.code:
            error.code = None  # type: ignore[assignment]  # OpenAI's code on a client error: a string or null
    return error

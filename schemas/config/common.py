"""Pieces every part of the config shares: strictness, names, timeouts, limits, retries,
breakers, probes, and the base of every backend entry."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from schemas.completions import CompletionRequest
from schemas.config.egress import TLSConfig, check_env_proxies, check_proxy_url
from schemas.config.references import did_you_mean

CapabilityLevelName = Literal["native", "translated", "emulated", "unsupported"]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeoutConfig(_Strict):
    """Upstream timeouts, in seconds."""

    connect: Annotated[float, Field(gt=0)] = 5.0
    # Until the upstream's response headers (and, for streams, the first event) arrive.
    first_byte: Annotated[float, Field(gt=0)] = 120.0
    # A whole non-streaming request; streams are bounded by ``stream_idle`` instead.
    total: Annotated[float, Field(gt=0)] = 600.0
    # Longest silence allowed between two stream chunks.
    stream_idle: Annotated[float, Field(gt=0)] = 120.0


class UpstreamLimitsConfig(_Strict):
    """Caps on what an upstream may send back, in bytes (over them: 502, or an error event mid-stream)."""

    # A whole non-streamed body (and an error body's first 64 KiB is all that is read).
    max_response_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    # One stream event (SSE or NDJSON): what the gateway holds waiting for its end.
    max_event_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024


class RetryConfig(_Strict):
    """Retries of one backend within one request (failover to a model's other routes is separate).

    Off by default (``attempts: 1``): OpenAI clients already retry 429/5xx themselves, and
    retrying here as well multiplies the load on an upstream that is already failing.
    """

    # Tries of this backend per request, the first included.
    attempts: Annotated[int, Field(ge=1, le=10)] = 1
    # Exponential backoff between tries: backoff_base * 2**(n-1) + up to ``jitter``, at most backoff_max.
    backoff_base: Annotated[float, Field(ge=0, le=60)] = 0.25
    backoff_max: Annotated[float, Field(ge=0, le=300)] = 5.0
    jitter: Annotated[float, Field(ge=0, le=60)] = 0.25
    # An upstream's Retry-After is waited for up to this; a longer one means no retry of this
    # backend (the request fails over, or the 429 goes to the client with its Retry-After).
    max_retry_after: Annotated[float, Field(ge=0, le=600)] = 10.0
    # No retry of this backend (its backoff included) may start later than this many seconds
    # after the request's first attempt.
    deadline: Annotated[float, Field(gt=0, le=3600)] = 30.0


class CircuitBreakerConfig(_Strict):
    """Passive health: eject a failing backend for a cooldown, then let one trial request through."""

    enabled: bool = True
    # Open after this many failures in a row.
    consecutive_failures: Annotated[int, Field(ge=1, le=10_000)] = 5
    # ... or when at least this share of the last ``window`` outcomes failed (once
    # ``min_requests`` outcomes are known); null turns the rate rule off.
    failure_rate: Annotated[float, Field(gt=0, le=1)] | None = 0.5
    window: Annotated[int, Field(ge=1, le=10_000)] = 20
    min_requests: Annotated[int, Field(ge=1, le=10_000)] = 10
    # Seconds an open circuit refuses requests before its half-open trial.
    cooldown: Annotated[float, Field(gt=0, le=3600)] = 10.0

    @model_validator(mode="after")
    def _min_requests_fit_window(self) -> CircuitBreakerConfig:
        if self.min_requests > self.window:
            raise ValueError(f"min_requests ({self.min_requests}) cannot exceed window ({self.window})")
        return self


class HealthCheckConfig(_Strict):
    """Active probes (``GET /health`` on vLLM, ``GET /models`` on OpenAI-compatible APIs)."""

    interval: Annotated[float, Field(gt=0, le=3600)] = 10.0
    timeout: Annotated[float, Field(gt=0, le=600)] = 2.0


class _BackendBase(_Strict):
    name: Name
    # Per-field override of the type's capability table, e.g. ``{top_k: native}``
    # for an OpenAI-compatible provider that accepts ``top_k``.
    capabilities: dict[str, CapabilityLevelName] = Field(default_factory=dict)
    # A bulkhead: requests in flight to this backend at once (null = no cap). Beyond it a
    # request fails over to another route with room, or waits in the backend's queue.
    max_concurrency: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    retry: RetryConfig = Field(default_factory=RetryConfig)
    circuit_breaker: CircuitBreakerConfig = Field(default_factory=CircuitBreakerConfig)
    # Periodic probes feeding the circuit breaker; off unless set.
    health_check: HealthCheckConfig | None = None

    @field_validator("capabilities")
    @classmethod
    def _known_fields(cls, value: dict[str, CapabilityLevelName]) -> dict[str, CapabilityLevelName]:
        fields = CompletionRequest.model_fields
        unknown = [
            f"unknown request field {name!r}{did_you_mean(name, fields)}" for name in value if name not in fields
        ]
        if unknown:
            raise ValueError("; ".join(unknown))
        return value


# A header name is an RFC 9110 token; a value may hold visible characters, spaces and tabs only
# (CR/LF would split the request, NUL is refused by every HTTP stack at send time).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEADER_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Set by the HTTP client or by the gateway on every upstream request: a configured copy would be
# sent as a duplicate (or contradict the framing).
_MANAGED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "content-type",
        "x-request-id",
    }
)


def unique_name(seen: dict[str, int], name: str, index: int, path: str, what: str) -> None:
    """Record ``name`` as the one at ``path[index]``; a name given twice is an error naming both places."""
    if name in seen:
        raise ValueError(f"{path}[{index}].name: duplicate {what} name {name!r} (first at {path}[{seen[name]}])")
    seen[name] = index


def _check_headers(headers: dict[str, SecretStr]) -> dict[str, SecretStr]:
    """Refuse header names that could not be sent once and as written; values are never echoed."""
    seen: dict[str, str] = {}
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP token (no spaces, colons or controls)")
        lower = name.lower()
        if lower in _MANAGED_HEADERS:
            raise ValueError(f"header {name!r} is set by the gateway or its HTTP client and cannot be configured")
        if lower in seen:
            raise ValueError(f"header {name!r} is given twice (also as {seen[lower]!r}); names are case-insensitive")
        seen[lower] = name
        if _HEADER_VALUE_BAD.search(value.get_secret_value()):
            raise ValueError(f"the value of header {name!r} contains a control character (CR, LF, NUL...)")
    return headers


class HTTPUpstreamConfig(_BackendBase):
    """What every backend reached over HTTP shares: where, credentials, timeouts, pool, client."""

    base_url: AnyHttpUrl
    api_key: SecretStr | None = None
    # Extra headers sent upstream (e.g. an organisation id). Values are treated as secrets.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    # Keep-alive pool size towards this upstream.
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # The upstream HTTP client, all behind the seam in ``backends.transport.base``: httptools (our lean
    # keep-alive client, the default: about half aiohttp's CPU per request in the benchmark),
    # aiohttp, or httpx (any httpx transport, e.g. respx in tests).
    transport: Literal["httptools", "aiohttp", "httpx"] = "httptools"
    limits: UpstreamLimitsConfig = Field(default_factory=UpstreamLimitsConfig)
    # Egress (``schemas.config.egress``): a forward proxy (``http://[user:pass@]host:port`` or
    # ``https://``; CONNECT for https upstreams), TLS towards the upstream, and whether the
    # standard HTTPS_PROXY / HTTP_PROXY / NO_PROXY / SSL_CERT_FILE variables count (off: they do not).
    proxy: SecretStr | None = None
    tls: TLSConfig | None = None
    trust_env: bool = False

    @field_validator("base_url")
    @classmethod
    def _no_query(cls, value: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if value is not None and (value.query or value.fragment):
            raise ValueError("base_url must not carry a query string or fragment")
        return value

    @field_validator("proxy")
    @classmethod
    def _proxy_url(cls, value: SecretStr | None) -> SecretStr | None:
        return check_proxy_url(value)

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        return _check_headers(value)

    @model_validator(mode="after")
    def _one_authorization(self) -> HTTPUpstreamConfig:
        if self.api_key is not None and any(name.lower() == "authorization" for name in self.headers):
            raise ValueError("give the upstream credential once, as api_key or as an Authorization header")
        if self.trust_env and self.proxy is None:
            check_env_proxies()
        return self


class _HTTPBackendBase(HTTPUpstreamConfig):
    """An OpenAI-shaped upstream."""

    # Ask the upstream for a usage chunk on every stream so token metrics are exact;
    # the chunk is dropped again when the client did not ask for it.
    stream_usage: bool = True

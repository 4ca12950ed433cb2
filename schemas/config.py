"""The gateway's YAML config as pydantic models.

Validated once at start-up: unknown keys, unknown backend types, duplicate names
and routes to undefined backends are errors here, never at request time. Backend
entries are a discriminated union on ``type``; secrets are ``SecretStr`` so they
never show in ``repr``, logs or a config dump.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from schemas.completions import CompletionRequest

__all__ = [
    "BACKEND_TYPES",
    "PRIORITIES",
    "AdmissionConfig",
    "ApiKeyConfig",
    "AuthConfig",
    "BackendConfig",
    "CapabilityLevelName",
    "CircuitBreakerConfig",
    "CostCaps",
    "DNSDiscoveryConfig",
    "GatewayConfig",
    "HTTPUpstreamConfig",
    "HealthCheckConfig",
    "LlamaCppBackendConfig",
    "MockBackendConfig",
    "ModelConfig",
    "OllamaBackendConfig",
    "OpenAIBackendConfig",
    "PoolProbeConfig",
    "PoolRestartConfig",
    "PoolRoutingConfig",
    "RetryConfig",
    "RouteConfig",
    "ServerConfig",
    "TGIBackendConfig",
    "TimeoutConfig",
    "UpstreamLimitsConfig",
    "VLLMBackendConfig",
    "VLLMPoolBackendConfig",
]

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
        unknown = sorted(set(value) - set(CompletionRequest.model_fields))
        if unknown:
            raise ValueError(f"unknown request field(s) {', '.join(unknown)}")
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

    @field_validator("base_url")
    @classmethod
    def _no_query(cls, value: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if value is not None and (value.query or value.fragment):
            raise ValueError("base_url must not carry a query string or fragment")
        return value

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        return _check_headers(value)

    @model_validator(mode="after")
    def _one_authorization(self) -> HTTPUpstreamConfig:
        if self.api_key is not None and any(name.lower() == "authorization" for name in self.headers):
            raise ValueError("give the upstream credential once, as api_key or as an Authorization header")
        return self


class _HTTPBackendBase(HTTPUpstreamConfig):
    """An OpenAI-shaped upstream."""

    # Ask the upstream for a usage chunk on every stream so token metrics are exact;
    # the chunk is dropped again when the client did not ask for it.
    stream_usage: bool = True


class OpenAIBackendConfig(_HTTPBackendBase):
    """An OpenAI-compatible HTTP API (OpenAI, Together, Fireworks, ...)."""

    type: Literal["openai"]


class PoolRoutingConfig(_Strict):
    """How requests are spread over a pool's workers (``vllm-pool``, or ``vllm`` with several URLs).

    ``prefix-affinity`` (the default): requests whose prompts share leading blocks go to the
    worker that served that prefix last (it likely holds it in its KV cache), unless that
    worker is overloaded; everything else goes to the least loaded worker. It learns from
    this process's own traffic, so other gateway workers and replicas learn apart.
    ``prefix-hash``: a stable hash of the prompt's first block (``block_chars`` characters or
    ``block_tokens`` ids: about the shared part's length) picks the worker by rendezvous
    hashing with bounded load (at most 1.25x the average), the same worker in every gateway
    process and replica without shared state; pick it when several gateway workers or
    replicas front the same servers. ``least-load``: load only. ``round-robin``: neither (a
    baseline).
    """

    strategy: Literal["prefix-affinity", "prefix-hash", "least-load", "round-robin"] = "prefix-affinity"
    # Prompt blocks hashed for affinity: characters per block of a text prompt, token ids per
    # block of a token prompt; only whole blocks count (as in vLLM's prefix cache).
    block_chars: Annotated[int, Field(ge=16, le=1_000_000)] = 256
    block_tokens: Annotated[int, Field(ge=1, le=100_000)] = 64
    max_blocks: Annotated[int, Field(ge=1, le=1024)] = 16
    # Bound of each worker's LRU of prefix-block hashes.
    affinity_entries: Annotated[int, Field(ge=1, le=10_000_000)] = 8192
    # The affine worker is skipped when its load exceeds the least loaded worker's by more
    # than this (load = requests in flight from us + requests waiting in its own queue) ...
    overload_margin: Annotated[float, Field(ge=0)] = 4.0
    # ... or when its KV cache is at least this full.
    kv_cache_high: Annotated[float, Field(gt=0, le=1)] = 0.95
    # Seconds between scrapes of each worker's ``/metrics`` (queue length, KV cache usage).
    metrics_interval: Annotated[float, Field(gt=0, le=3600)] = 1.0
    # Tries of one request across workers (a crashed worker's request goes to another).
    max_attempts: Annotated[int, Field(ge=1, le=16)] = 3
    # Seconds a request waits for a ready worker before its 503 (with Retry-After).
    wait_for_ready: Annotated[float, Field(ge=0, le=3600)] = 30.0


class PoolProbeConfig(_Strict):
    """Each worker's ``GET /health``: a worker failing ``failures`` probes in a row is replaced."""

    interval: Annotated[float, Field(gt=0, le=3600)] = 2.0
    timeout: Annotated[float, Field(gt=0, le=600)] = 2.0
    failures: Annotated[int, Field(ge=1, le=1000)] = 3


class DNSDiscoveryConfig(_Strict):
    """Endpoints from a DNS name's A/AAAA records (e.g. a Kubernetes headless Service)."""

    dns: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")]
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    scheme: Literal["http", "https"] = "http"
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~/-]*$")] = "/v1"
    # Seconds between re-resolutions.
    interval: Annotated[float, Field(gt=0, le=86400)] = 10.0


class VLLMBackendConfig(_HTTPBackendBase):
    """A remote vLLM OpenAI-compatible server, or a set of them.

    Exactly one of ``base_url`` (one server), ``base_urls`` (several, spread by ``routing``)
    or ``discovery`` (a DNS name re-resolved periodically) is given.
    """

    type: Literal["vllm"]
    base_url: AnyHttpUrl | None = None  # type: ignore[assignment]  # optional here: see base_urls
    # Pin the server's version when ``GET /version`` is unavailable.
    version: Annotated[str, Field(pattern=r"^\d+\.\d+(\.\d+)?")] | None = None
    base_urls: list[AnyHttpUrl] = Field(default_factory=list)
    discovery: DNSDiscoveryConfig | None = None
    # With base_urls/discovery only: spreading and probing the servers.
    routing: PoolRoutingConfig = Field(default_factory=PoolRoutingConfig)
    probe: PoolProbeConfig = Field(default_factory=PoolProbeConfig)

    @field_validator("base_urls")
    @classmethod
    def _urls_plain(cls, value: list[AnyHttpUrl]) -> list[AnyHttpUrl]:
        for i, url in enumerate(value):
            if url.query or url.fragment:
                raise ValueError(f"base_urls[{i}] must not carry a query string or fragment")
        if len({str(url) for url in value}) != len(value):
            raise ValueError("base_urls lists a URL twice")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> VLLMBackendConfig:
        given = [key for key in ("base_url", "base_urls", "discovery") if getattr(self, key)]
        if len(given) != 1:
            got = f" (got {', '.join(given)})" if given else ""
            raise ValueError(f"give exactly one of base_url, base_urls, discovery{got}")
        if self.base_url is not None and {"routing", "probe"} & self.model_fields_set:
            raise ValueError("routing and probe apply only with base_urls or discovery")
        return self


class PoolRestartConfig(_Strict):
    """Restarts of a crashed or hung worker: exponential backoff, then give up."""

    backoff_initial: Annotated[float, Field(ge=0, le=3600)] = 1.0
    backoff_max: Annotated[float, Field(ge=0, le=3600)] = 60.0
    # Failures in a row (crash, failed start, health lost) after which the worker is marked
    # failed and left stopped; a worker that stayed ready ``reset_after`` seconds starts over.
    max_failures: Annotated[int, Field(ge=1, le=1000)] = 5
    reset_after: Annotated[float, Field(ge=0)] = 300.0


# Flags of ``vllm serve`` the pool sets itself, per worker.
_POOL_OWNED_FLAGS = ("--host", "--port", "--tensor-parallel-size", "-tp", "--served-model-name", "--model")


class VLLMPoolBackendConfig(_BackendBase):
    """vLLM workers the gateway starts, supervises and routes across (``backends.vllm.pool``)."""

    type: Literal["vllm-pool"]
    # Path or model id, passed to ``vllm serve``.
    model: Annotated[str, Field(min_length=1)]
    # The id workers list in /v1/models and routes must name (default: ``model``).
    served_model_name: Annotated[str, Field(min_length=1)] | None = None
    # GPU ids, ``all`` (what nvidia-smi lists) or a count (GPUs 0..n-1); [] = CPU workers.
    gpus: list[int] | Literal["all"] | int = Field(default_factory=list)
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    # Number of workers; default: GPUs // tensor_parallel_size (1 without GPUs).
    workers: Annotated[int, Field(ge=1, le=1024)] | None = None
    host: str = "127.0.0.1"
    port_range: tuple[Annotated[int, Field(ge=1, le=65535)], Annotated[int, Field(ge=1, le=65535)]] = (8100, 8199)
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)
    # The worker program; the pool appends ``MODEL --host H --port P --tensor-parallel-size N``
    # (and ``--served-model-name``), then ``vllm_args``.
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["vllm", "serve"]
    )
    # Seconds from spawn to ready (/health answers and /v1/models lists the model).
    startup_timeout: Annotated[float, Field(gt=0)] = 900.0
    # Seconds between SIGTERM and SIGKILL when a worker is stopped.
    stop_timeout: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # Per-worker log files and the pool's status.json (``gateway pool status`` reads it);
    # default: <tmp>/completions-gateway-<uid>/<backend name>.
    log_dir: str | None = None
    probe: PoolProbeConfig = Field(default_factory=PoolProbeConfig)
    restart: PoolRestartConfig = Field(default_factory=PoolRestartConfig)
    routing: PoolRoutingConfig = Field(default_factory=PoolRoutingConfig)
    # Towards each worker, as for a ``vllm`` backend.
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    transport: Literal["httptools", "aiohttp", "httpx"] = "httptools"
    limits: UpstreamLimitsConfig = Field(default_factory=UpstreamLimitsConfig)
    stream_usage: bool = True

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_shape(cls, value: object) -> object:
        # Checked here, whole, for one clear message instead of one per member of the union.
        if value == "all" or (type(value) is int and 1 <= value <= 1024):
            return value
        if isinstance(value, list) and all(type(g) is int and 0 <= g <= 1023 for g in value):
            return value
        raise ValueError(f"gpus must be a list of GPU ids (0-1023), 'all', or a count (1-1024); got {value!r}")

    @field_validator("vllm_args")
    @classmethod
    def _no_pool_owned_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in _POOL_OWNED_FLAGS:
                raise ValueError(f"{flag} is set by the pool per worker; use the pool's own keys")
        return value

    @model_validator(mode="after")
    def _worker_plan(self) -> VLLMPoolBackendConfig:
        lo, hi = self.port_range
        if lo > hi:
            raise ValueError(f"port_range [{lo}, {hi}] is empty")
        tp = self.tensor_parallel_size
        gpus = self.gpus
        if isinstance(gpus, list):
            if len(set(gpus)) != len(gpus):
                raise ValueError("gpus lists a GPU twice")
            if gpus and len(gpus) % tp:
                raise ValueError(f"{len(gpus)} GPUs in gpus cannot be split into workers of tensor_parallel_size {tp}")
        count = gpus if isinstance(gpus, int) else len(gpus) if isinstance(gpus, list) else None
        if count is not None and count and self.workers is not None and self.workers * tp > count:
            raise ValueError(f"{self.workers} workers of {tp} GPUs need more than the {count} GPUs in gpus")
        if gpus and "CUDA_VISIBLE_DEVICES" in self.env:
            raise ValueError("CUDA_VISIBLE_DEVICES in env is set by the pool per worker (from gpus)")
        planned = self.workers or (count // tp if count else 1 if count is not None else 0)
        if planned > hi - lo + 1:
            raise ValueError(f"port_range holds {hi - lo + 1} port(s) for {planned} workers")
        return self


class MockBackendConfig(_BackendBase):
    """The built-in simulator: deterministic text, no model."""

    type: Literal["mock"]
    # Simulated generation speed (0 = as fast as possible).
    token_delay_ms: Annotated[float, Field(ge=0, le=10_000)] = 0.0
    first_token_delay_ms: Annotated[float, Field(ge=0, le=60_000)] = 0.0


class _NativeBackendBase(HTTPUpstreamConfig):
    """A server reached over its own (non-OpenAI) HTTP API; ``base_url`` is the server root.

    ``api_key`` is sent as ``Authorization: Bearer``.
    """


class TGIBackendConfig(_NativeBackendBase):
    """Hugging Face text-generation-inference, native ``/generate`` and ``/generate_stream``."""

    type: Literal["tgi"]


class OllamaBackendConfig(_NativeBackendBase):
    """Ollama, native ``/api/generate``."""

    type: Literal["ollama"]


class LlamaCppBackendConfig(_NativeBackendBase):
    """llama.cpp's ``llama-server``, native ``/completion``."""

    type: Literal["llamacpp"]


BackendConfig = Annotated[
    OpenAIBackendConfig
    | VLLMBackendConfig
    | VLLMPoolBackendConfig
    | MockBackendConfig
    | TGIBackendConfig
    | OllamaBackendConfig
    | LlamaCppBackendConfig,
    Field(discriminator="type"),
]
BACKEND_TYPES = ("openai", "vllm", "vllm-pool", "mock", "tgi", "ollama", "llamacpp")


class RouteConfig(_Strict):
    backend: Name
    # The upstream's own model id.
    model: Annotated[str, Field(min_length=1)]
    weight: Annotated[float, Field(gt=0)] = 1.0


class ModelConfig(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    strategy: Literal["failover", "round_robin", "weighted", "least_outstanding"] = "failover"


PRIORITIES = ("interactive", "batch")


class AdmissionConfig(_Strict):
    """Gateway-wide backpressure: a cap on completions in flight and a bounded wait queue."""

    max_in_flight: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    # Requests allowed to wait for a slot (gateway-wide, and per backend with max_concurrency);
    # beyond it, 429 at once.
    queue_size: Annotated[int, Field(ge=0, le=1_000_000)] = 1024
    # Seconds a request may wait in a queue before its 429.
    queue_timeout: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # Request header carrying the priority (``interactive`` or ``batch``); waiting
    # interactive requests are admitted before batch ones.
    priority_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] = "x-priority"
    default_priority: Literal["interactive", "batch"] = "interactive"


# --- security and tenancy (gateway.security: auth, ratelimit, caps) ------------------------------
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]
_STORE_SCHEMES = ("redis://", "rediss://", "unix://")
_MIN_SECRET = 16


class CostCaps(_Strict):
    """The largest request a caller may send (null = no cap); a refusal names the field and the cap.

    Deployment-wide as ``caps:``, per key as ``auth.keys[].caps``; the lower of the two wins.
    """

    n: Annotated[int, Field(ge=1)] | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    # Checked against 16 (OpenAI's default) when a request leaves max_tokens unset.
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    # Prompts in one request (a batch of N prompts counts N).
    prompts: Annotated[int, Field(ge=1)] | None = None
    # Prompt (estimated) + max_tokens x max(n, best_of) x prompts.
    total_tokens: Annotated[int, Field(ge=1)] | None = None


def _sha256_of(secret: SecretStr | None, digest: str | None) -> str:
    if secret is not None:
        return hashlib.sha256(secret.get_secret_value().encode()).hexdigest()
    return (digest or "").lower()


def _strong(value: SecretStr | None) -> SecretStr | None:
    if value is not None and len(value.get_secret_value()) < _MIN_SECRET:
        raise ValueError(f"must be at least {_MIN_SECRET} characters (a guessable key is no key)")
    return value


class ApiKeyConfig(_Strict):
    """One caller. The secret is given as ``key`` (normally ``${ENV}``) or as its SHA-256 hex digest."""

    name: Name
    key: SecretStr | None = None
    key_sha256: Sha256Hex | None = None
    # Model names or globs (``gpt-*``, ``*``) this key may use; others answer 403 and are
    # not listed in its GET /v1/models.
    models: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["*"]
    )
    # Token buckets (null = unlimited): requests and tokens per minute, and requests in flight.
    rpm: Annotated[int, Field(ge=1)] | None = None
    tpm: Annotated[int, Field(ge=1)] | None = None
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    caps: CostCaps = Field(default_factory=CostCaps)

    @field_validator("key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return _strong(value)

    @model_validator(mode="after")
    def _one_secret(self) -> ApiKeyConfig:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key, key_sha256")
        return self

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the secret (lowercase)."""
        return _sha256_of(self.key, self.key_sha256)


class AuthConfig(_Strict):
    """API keys, per-key limits, and where the limits' counters live. Absent = auth off."""

    keys: Annotated[list[ApiKeyConfig], Field(min_length=1)]
    # A key for GET /metrics alone (null = /metrics stays open, e.g. on a private port).
    metrics_key: SecretStr | None = None
    metrics_key_sha256: Sha256Hex | None = None
    # ``memory`` (per replica) or a Redis URL (``redis://[:password@]host:port/db``, ``rediss://``,
    # ``unix://``) shared by replicas. A secret: it may carry a password.
    store: SecretStr = SecretStr("memory")
    # Prefix of the Redis keys (deployments sharing one Redis keep their counters apart).
    store_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = "gateway"
    # Seconds a Redis call may take before it counts as an outage (limits then hold per replica).
    redis_timeout: Annotated[float, Field(gt=0, le=60)] = 0.25
    # Seconds between attempts to get back to Redis during an outage.
    redis_retry_interval: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # Seconds a concurrency slot held in Redis lives if its replica dies before releasing it; the
    # replica renews its slots every third of this while their requests run.
    concurrency_lease: Annotated[float, Field(gt=0, le=86400)] = 30.0

    @field_validator("metrics_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return _strong(value)

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: SecretStr) -> SecretStr:
        text = value.get_secret_value()
        if text != "memory" and not text.startswith(_STORE_SCHEMES):
            # The value itself is never echoed: it may hold a password.
            raise ValueError("must be 'memory' or a redis://, rediss:// or unix:// URL")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> AuthConfig:
        if self.metrics_key is not None and self.metrics_key_sha256 is not None:
            raise ValueError("give at most one of metrics_key, metrics_key_sha256")
        names: dict[str, int] = {}
        digests: dict[str, int] = {}
        for i, key in enumerate(self.keys):
            if key.name in names:
                raise ValueError(
                    f"auth.keys[{i}].name: duplicate key name {key.name!r} (first at auth.keys[{names[key.name]}])"
                )
            names[key.name] = i
            if key.sha256 in digests:
                raise ValueError(f"auth.keys[{i}]: the same secret as auth.keys[{digests[key.sha256]}]")
            digests[key.sha256] = i
        metrics = self.metrics_sha256
        if metrics is not None and metrics in digests:
            raise ValueError(f"auth.metrics_key: the same secret as auth.keys[{digests[metrics]}]")
        return self

    @property
    def metrics_sha256(self) -> str | None:
        if self.metrics_key is None and self.metrics_key_sha256 is None:
            return None
        return _sha256_of(self.metrics_key, self.metrics_key_sha256)

    @property
    def store_url(self) -> str | None:
        """The Redis URL, or None for the in-memory store."""
        text = self.store.get_secret_value()
        return None if text == "memory" else text


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # Largest request body accepted (413 beyond it).
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    # Seconds a SIGTERM waits for in-flight requests and streams.
    drain_timeout: Annotated[float, Field(ge=0)] = 30.0
    # Seconds a SIGTERM keeps accepting (while /health says draining) before it stops
    # listening, so load balancers notice first.
    drain_delay: Annotated[float, Field(ge=0, le=600)] = 0.0
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    access_log: bool = False
    # --- hardening against hostile or broken clients (README "Security") ---
    # Longest request line and longest header field (bytes), and most header fields; beyond: 400.
    max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 8190
    max_headers: Annotated[int, Field(ge=16, le=10_000)] = 100
    # Longest array in ``prompt`` (a batch's prompts, one prompt's token ids); beyond: 400.
    max_prompt_array: Annotated[int, Field(ge=1, le=16 * 1024 * 1024)] = 131_072
    # Seconds a connection may take to deliver a request's headers, counted from its opening or
    # its previous answer (so also how long an idle keep-alive connection is kept): slowloris.
    client_header_timeout: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # Seconds a request's body may take to arrive once its headers are in; beyond: 408.
    client_body_timeout: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # One JSON line per completion request on the ``gateway.security.audit`` logger (key, model, backend,
    # status, tokens, latency).
    audit_log: bool = False


class GatewayConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    backends: Annotated[list[BackendConfig], Field(min_length=1)]
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    # API keys and per-key limits; absent = no authentication (the quickstart).
    auth: AuthConfig | None = None
    # Deployment-wide cost caps (every caller, with or without a key).
    caps: CostCaps = Field(default_factory=CostCaps)

    @model_validator(mode="after")
    def _names_and_references(self) -> GatewayConfig:
        seen: dict[str, int] = {}
        for i, backend in enumerate(self.backends):
            if backend.name in seen:
                first = seen[backend.name]
                raise ValueError(f"backends[{i}].name: duplicate backend name {backend.name!r} "
                    f"(first at backends[{first}])")
            seen[backend.name] = i
        model_seen: dict[str, int] = {}
        for i, model in enumerate(self.models):
            if model.name in model_seen:
                raise ValueError(
                    f"models[{i}].name: duplicate model name {model.name!r} (first at models[{model_seen[model.name]}])"
                )
            model_seen[model.name] = i
            for j, route in enumerate(model.routes):
                if route.backend not in seen:
                    raise ValueError(
                        f"models[{i}].routes[{j}].backend: no backend named {route.backend!r} "
                        f"(defined: {', '.join(sorted(seen))})"
                    )
        return self

    @model_validator(mode="after")
    def _pools_consistent(self) -> GatewayConfig:
        """Routes to a ``vllm-pool`` name what its workers serve; pools share no port or GPU."""
        pools = {b.name: (i, b) for i, b in enumerate(self.backends) if isinstance(b, VLLMPoolBackendConfig)}
        for i, model in enumerate(self.models):
            for j, route in enumerate(model.routes):
                pool = pools.get(route.backend)
                if pool is not None and route.model != pool[1].served_name:
                    raise ValueError(
                        f"models[{i}].routes[{j}].model: backend {route.backend!r} serves {pool[1].served_name!r}"
                    )
        placed = sorted(pools.values(), key=lambda item: item[0])
        for n, (i, a) in enumerate(placed):
            for k, b in placed[n + 1 :]:
                if a.port_range[0] <= b.port_range[1] and b.port_range[0] <= a.port_range[1]:
                    raise ValueError(f"backends[{k}].port_range: overlaps backends[{i}].port_range")
                if (a.gpus == "all" and b.gpus) or (b.gpus == "all" and a.gpus):
                    raise ValueError(f"backends[{k}].gpus: overlaps backends[{i}].gpus")
                ids = [set(range(g)) if isinstance(g, int) else set(g) for g in (a.gpus, b.gpus) if g != "all"]
                if len(ids) == 2 and ids[0] & ids[1]:
                    raise ValueError(f"backends[{k}].gpus: GPU(s) {sorted(ids[0] & ids[1])} also in backends[{i}].gpus")
        return self

    @model_validator(mode="after")
    def _key_models_exist(self) -> GatewayConfig:
        """Every name or glob in a key's ``models`` matches a configured model (catches typos)."""
        if self.auth is None:
            return self
        names = [model.name for model in self.models]
        for i, key in enumerate(self.auth.keys):
            for j, pattern in enumerate(key.models):
                if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                    raise ValueError(f"auth.keys[{i}].models[{j}]: {pattern!r} matches no configured model")
        return self

    def backend(self, name: str) -> BackendConfig:
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)

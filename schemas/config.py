"""The gateway's YAML config as pydantic models.

Validated once at start-up: unknown keys, unknown backend types, duplicate names
and routes to undefined backends are errors here, never at request time. Backend
entries are a discriminated union on ``type``; secrets are ``SecretStr`` so they
never show in ``repr``, logs or a config dump.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from schemas.completions import CompletionRequest

__all__ = [
    "BACKEND_TYPES",
    "BackendConfig",
    "CapabilityLevelName",
    "GatewayConfig",
    "MockBackendConfig",
    "ModelConfig",
    "OpenAIBackendConfig",
    "RouteConfig",
    "ServerConfig",
    "TimeoutConfig",
    "VLLMBackendConfig",
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


class _BackendBase(_Strict):
    name: Name
    # Per-field override of the type's capability table, e.g. ``{top_k: native}``
    # for an OpenAI-compatible provider that accepts ``top_k``.
    capabilities: dict[str, CapabilityLevelName] = Field(default_factory=dict)

    @field_validator("capabilities")
    @classmethod
    def _known_fields(cls, value: dict[str, CapabilityLevelName]) -> dict[str, CapabilityLevelName]:
        unknown = sorted(set(value) - set(CompletionRequest.model_fields))
        if unknown:
            raise ValueError(f"unknown request field(s) {', '.join(unknown)}")
        return value


class _HTTPBackendBase(_BackendBase):
    base_url: AnyHttpUrl
    api_key: SecretStr | None = None
    # Extra headers sent upstream (e.g. an organisation id). Values are treated as secrets.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    # Keep-alive pool size towards this upstream.
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # The upstream HTTP client, all behind the seam in ``backends.http``: httptools (our lean
    # keep-alive client, the default: about half aiohttp's CPU per request in the benchmark),
    # aiohttp, or httpx (any httpx transport, e.g. respx in tests).
    transport: Literal["httptools", "aiohttp", "httpx"] = "httptools"
    # Ask the upstream for a usage chunk on every stream so token metrics are exact;
    # the chunk is dropped again when the client did not ask for it.
    stream_usage: bool = True

    @field_validator("base_url")
    @classmethod
    def _no_query(cls, value: AnyHttpUrl) -> AnyHttpUrl:
        if value.query or value.fragment:
            raise ValueError("base_url must not carry a query string or fragment")
        return value


class OpenAIBackendConfig(_HTTPBackendBase):
    """An OpenAI-compatible HTTP API (OpenAI, Together, Fireworks, ...)."""

    type: Literal["openai"]


class VLLMBackendConfig(_HTTPBackendBase):
    """A remote vLLM OpenAI-compatible server."""

    type: Literal["vllm"]
    # Pin the server's version when ``GET /version`` is unavailable.
    version: Annotated[str, Field(pattern=r"^\d+\.\d+(\.\d+)?")] | None = None


class MockBackendConfig(_BackendBase):
    """The built-in simulator: deterministic text, no model."""

    type: Literal["mock"]
    # Simulated generation speed (0 = as fast as possible).
    token_delay_ms: Annotated[float, Field(ge=0, le=10_000)] = 0.0
    first_token_delay_ms: Annotated[float, Field(ge=0, le=60_000)] = 0.0


BackendConfig = Annotated[
    OpenAIBackendConfig | VLLMBackendConfig | MockBackendConfig,
    Field(discriminator="type"),
]
BACKEND_TYPES = ("openai", "vllm", "mock")


class RouteConfig(_Strict):
    backend: Name
    # The upstream's own model id.
    model: Annotated[str, Field(min_length=1)]
    weight: Annotated[float, Field(gt=0)] = 1.0


class ModelConfig(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    routes: Annotated[list[RouteConfig], Field(min_length=1)]
    strategy: Literal["failover", "round_robin", "weighted", "least_outstanding"] = "failover"


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # Largest request body accepted (413 beyond it).
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    # Seconds a SIGTERM waits for in-flight requests and streams.
    drain_timeout: Annotated[float, Field(ge=0)] = 30.0
    access_log: bool = False


class GatewayConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    backends: Annotated[list[BackendConfig], Field(min_length=1)]
    models: Annotated[list[ModelConfig], Field(min_length=1)]

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

    def backend(self, name: str) -> BackendConfig:
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)

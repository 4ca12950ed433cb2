"""Backend entries: a discriminated union on ``type``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AnyHttpUrl, Field, field_validator, model_validator

from schemas.config.common import HTTPUpstreamConfig, _BackendBase, _HTTPBackendBase, _Strict
from schemas.config.pool import DNSDiscoveryConfig, PoolProbeConfig, PoolRoutingConfig, VLLMPoolBackendConfig


class OpenAIBackendConfig(_HTTPBackendBase):
    """An OpenAI-compatible HTTP API (OpenAI, Together, Fireworks, ...)."""

    type: Literal["openai"]
    # Which name the upstream's chat endpoint reads the output limit under: OpenAI's current
    # API wants ``max_completion_tokens`` (its reasoning models refuse ``max_tokens``); older
    # OpenAI-compatible servers know only ``max_tokens``. The client's value, under either
    # name, is sent under this one.
    chat_max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    # Whether the upstream keeps its own copy of each Response (OpenAI's ``store``, true there by
    # default). Off (the default): the gateway sends ``store: false`` on every ``/v1/responses``
    # call, so the only copy is the gateway's own (what ``GET``/``DELETE /v1/responses/{id}`` and
    # ``previous_response_id`` use), and a delete removes the turn everywhere; ``background`` and
    # ``conversation`` (state only the upstream keeps) are refused by name. On: the client's
    # ``store`` is forwarded as it set it (unset: the upstream's default keeps a copy too).
    upstream_store: bool = False


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
    # The tool-call parser the server runs (``vllm serve --enable-auto-tool-choice
    # --tool-call-parser NAME``). Without it chat ``tool_choice: auto`` is refused by name, and
    # named/required choices go only to versions that constrain them without a parser (< 0.14).
    tool_parser: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None

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


class EmbedBatchingConfig(_Strict):
    """How an embeddings (or rerank) batch is cut for a server that takes fewer inputs per call."""

    # Inputs per upstream call; a larger batch is split into parts (TEI: its --max-client-batch-size).
    max_inputs_per_call: Annotated[int, Field(ge=1, le=100_000)]
    # Parts of one request sent at once; the answer joins them in input order.
    max_parallel_calls: Annotated[int, Field(ge=1, le=64)] = 4


class TGIBackendConfig(_NativeBackendBase):
    """Hugging Face text-generation-inference, native ``/generate`` and ``/generate_stream``."""

    type: Literal["tgi"]


class OllamaBackendConfig(_NativeBackendBase):
    """Ollama, native ``/api/generate`` (embeddings: ``/api/embed``)."""

    type: Literal["ollama"]
    embeddings: EmbedBatchingConfig = Field(default_factory=lambda: EmbedBatchingConfig(max_inputs_per_call=128))


class LlamaCppBackendConfig(_NativeBackendBase):
    """llama.cpp's ``llama-server``, native ``/completion`` (embeddings: ``/v1/embeddings``, with ``--embedding``)."""

    type: Literal["llamacpp"]
    embeddings: EmbedBatchingConfig = Field(default_factory=lambda: EmbedBatchingConfig(max_inputs_per_call=128))


class TEIBackendConfig(_NativeBackendBase):
    """Hugging Face text-embeddings-inference: ``/v1/embeddings`` and ``/rerank`` (no generation)."""

    type: Literal["tei"]
    # TEI refuses a call with more inputs than its --max-client-batch-size (default 32).
    embeddings: EmbedBatchingConfig = Field(default_factory=lambda: EmbedBatchingConfig(max_inputs_per_call=32))


BackendConfig = Annotated[
    OpenAIBackendConfig
    | VLLMBackendConfig
    | VLLMPoolBackendConfig
    | MockBackendConfig
    | TGIBackendConfig
    | OllamaBackendConfig
    | LlamaCppBackendConfig
    | TEIBackendConfig,
    Field(discriminator="type"),
]
BACKEND_TYPES = ("openai", "vllm", "vllm-pool", "mock", "tgi", "ollama", "llamacpp", "tei")

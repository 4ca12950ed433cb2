"""The gateway's YAML config as pydantic models.

Validated once at start-up: unknown keys, unknown backend types, duplicate names
and routes to undefined backends are errors here, never at request time. Backend
entries are a discriminated union on ``type``; secrets are ``SecretStr`` so they
never show in ``repr``, logs or a config dump.
"""

from __future__ import annotations

# One import path for the whole config; the sections live in their own modules.
from schemas.config.auth import ApiKeyConfig, AuthConfig, RequestCaps
from schemas.config.backends import (
    BACKEND_TYPES,
    BackendConfig,
    EmbedBatchingConfig,
    LlamaCppBackendConfig,
    MockBackendConfig,
    OllamaBackendConfig,
    OpenAIBackendConfig,
    TEIBackendConfig,
    TGIBackendConfig,
    VLLMBackendConfig,
)
from schemas.config.common import (
    CapabilityLevelName,
    CircuitBreakerConfig,
    HealthCheckConfig,
    HTTPUpstreamConfig,
    RetryConfig,
    TimeoutConfig,
    UpstreamLimitsConfig,
)
from schemas.config.egress import TLSConfig
from schemas.config.gateway import GatewayConfig
from schemas.config.models import ModelConfig, ResponsesModelConfig, RouteConfig
from schemas.config.pool import (
    DNSDiscoveryConfig,
    KVEventsConfig,
    PoolProbeConfig,
    PoolRestartConfig,
    PoolRoutingConfig,
    ScoreWeights,
    VLLMPoolBackendConfig,
)
from schemas.config.pricing import BudgetConfig, PricingConfig
from schemas.config.responses import ResponsesConfig
from schemas.config.server import PRIORITIES, AdmissionConfig, ServerConfig
from schemas.config.telemetry import TelemetryConfig
from schemas.config.workers import worker_notes, worker_problems

__all__ = [
    "BACKEND_TYPES",
    "PRIORITIES",
    "AdmissionConfig",
    "ApiKeyConfig",
    "AuthConfig",
    "BackendConfig",
    "BudgetConfig",
    "CapabilityLevelName",
    "CircuitBreakerConfig",
    "DNSDiscoveryConfig",
    "EmbedBatchingConfig",
    "GatewayConfig",
    "HTTPUpstreamConfig",
    "HealthCheckConfig",
    "KVEventsConfig",
    "LlamaCppBackendConfig",
    "MockBackendConfig",
    "ModelConfig",
    "OllamaBackendConfig",
    "OpenAIBackendConfig",
    "PoolProbeConfig",
    "PoolRestartConfig",
    "PoolRoutingConfig",
    "PricingConfig",
    "RequestCaps",
    "ResponsesConfig",
    "ResponsesModelConfig",
    "RetryConfig",
    "RouteConfig",
    "ScoreWeights",
    "ServerConfig",
    "TEIBackendConfig",
    "TGIBackendConfig",
    "TLSConfig",
    "TelemetryConfig",
    "TimeoutConfig",
    "UpstreamLimitsConfig",
    "VLLMBackendConfig",
    "VLLMPoolBackendConfig",
    "worker_notes",
    "worker_problems",
]

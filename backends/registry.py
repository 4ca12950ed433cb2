"""The only module that knows every adapter: config entry -> backend instance.

An explicit ``match`` on the config's type; the config schema already refused
unknown types at load, so the fallthrough is a programming error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client.registry import Collector

from backends.base import Backend
from backends.mock import MockBackend
from backends.native.llamacpp import LlamaCppBackend
from backends.native.ollama import OllamaBackend
from backends.native.tei import TEIBackend
from backends.native.tgi import TGIBackend
from backends.openai.adapter import OpenAIBackend
from backends.vllm.adapter import VLLMBackend
from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.pool.shared import PoolClients, PoolOwnership, shared_configs
from backends.vllm.routing import ReportsPool, VLLMEndpointsBackend
from backends.vllm.routing.metrics import PoolCollector
from schemas.config import (
    BackendConfig,
    LlamaCppBackendConfig,
    MockBackendConfig,
    OllamaBackendConfig,
    OpenAIBackendConfig,
    TEIBackendConfig,
    TGIBackendConfig,
    VLLMBackendConfig,
    VLLMPoolBackendConfig,
)

__all__ = [
    "PoolClients",
    "PoolOwnership",
    "backend_class",
    "backend_status",
    "build_backend",
    "build_backends",
    "build_worker_backends",
    "metric_collectors",
    "shared_configs",
]


def backend_class(config: BackendConfig) -> type[Backend]:
    """The adapter class for a config entry (its class-level facts, e.g. ``endpoints``, need no instance)."""
    match config:
        case VLLMBackendConfig(base_url=None):  # several servers: base_urls or discovery
            return VLLMEndpointsBackend
        case VLLMBackendConfig():
            return VLLMBackend
        case VLLMPoolBackendConfig():
            return VLLMPoolBackend
        case OpenAIBackendConfig():
            return OpenAIBackend
        case MockBackendConfig():
            return MockBackend
        case TGIBackendConfig():
            return TGIBackend
        case OllamaBackendConfig():
            return OllamaBackend
        case LlamaCppBackendConfig():
            return LlamaCppBackend
        case TEIBackendConfig():
            return TEIBackend
    raise AssertionError(f"no adapter for backend type {config.type!r}")


def build_backend(config: BackendConfig) -> Backend:
    # Every adapter takes its own config entry; the match above pairs them.
    factory: Callable[[BackendConfig], Backend] = backend_class(config)
    return factory(config)


def build_backends(configs: list[BackendConfig]) -> dict[str, Backend]:
    return {config.name: build_backend(config) for config in configs}


def build_worker_backends(configs: list[BackendConfig], row: int) -> tuple[dict[str, Backend], PoolClients]:
    """A worker of ``gateway serve --workers N``: its ``vllm-pool`` and multi-server ``vllm`` backends
    route over the ones the control process runs (``PoolOwnership``), fed by the returned
    ``PoolClients``; the rest as usual."""
    pools = PoolClients(shared_configs(configs), row)
    return {c.name: pools.clients.get(c.name) or build_backend(c) for c in configs}, pools


def metric_collectors(backends: Mapping[str, Backend]) -> Sequence[Collector]:
    """The backends' own Prometheus collectors (today: the pools' ``gateway_pool_*`` series),
    read at scrape time; ``gateway.metrics`` registers them without knowing any adapter."""
    pools: list[ReportsPool] = [backend for backend in backends.values() if isinstance(backend, ReportsPool)]
    return [PoolCollector(pools)] if pools else []


# A pool worker's fields an operator's deep health shows (its log tail and paths stay in `gateway pool status`).
_WORKER_FIELDS = ("index", "state", "url", "in_flight", "waiting", "running", "kv_cache_usage", "restarts", "uptime")


def backend_status(backend: Backend) -> dict[str, Any]:
    """What the gateway's deep health (``GET /admin/health``) shows of a backend beyond its own view of it:
    the type, a vLLM's version and where it was learnt (``detected``, ``fingerprint``, ``pinned``,
    ``unknown``), and each worker or server of a pool. JSON-safe, read when asked (nothing per request)."""
    out: dict[str, Any] = {"type": backend.kind}
    if isinstance(backend, VLLMBackend):
        out["version"] = str(backend.version) if backend.version is not None else None
        out["version_source"] = backend.version_source
    if isinstance(backend, ReportsPool):
        status = backend.pool_status()
        out["workers"] = [{name: getattr(w, name) for name in _WORKER_FIELDS} for w in status.workers]
    return out

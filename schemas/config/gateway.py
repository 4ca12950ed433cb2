"""The whole file: cross-references between its sections are checked here."""

from __future__ import annotations

import fnmatch
from typing import Annotated

from pydantic import Field, model_validator

from schemas.config.auth import AuthConfig, CostCaps
from schemas.config.backends import BackendConfig
from schemas.config.common import _Strict, unique_name
from schemas.config.models import ModelConfig
from schemas.config.pool import VLLMPoolBackendConfig
from schemas.config.responses import ResponsesConfig
from schemas.config.server import ServerConfig
from schemas.config.telemetry import TelemetryConfig


class GatewayConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    backends: Annotated[list[BackendConfig], Field(min_length=1)]
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    # API keys and per-key limits; absent = no authentication (the quickstart).
    auth: AuthConfig | None = None
    # Deployment-wide cost caps (every caller, with or without a key).
    caps: CostCaps = Field(default_factory=CostCaps)
    # OpenTelemetry traces; absent = off unless the standard OTEL_* variables turn them on.
    telemetry: TelemetryConfig | None = None
    # Stored responses and conversations (``store: true``, ``previous_response_id``).
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)

    @model_validator(mode="after")
    def _names_and_references(self) -> GatewayConfig:
        seen: dict[str, int] = {}
        for i, backend in enumerate(self.backends):
            unique_name(seen, backend.name, i, "backends", "backend")
        model_seen: dict[str, int] = {}
        for i, model in enumerate(self.models):
            unique_name(model_seen, model.name, i, "models", "model")
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

"""The whole file: cross-references between its sections are checked here."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from schemas.config.auth import AuthConfig, RequestCaps
from schemas.config.backends import BackendConfig
from schemas.config.common import _Strict
from schemas.config.models import ModelConfig
from schemas.config.pool import VLLMPoolBackendConfig
from schemas.config.references import ConfigProblems, reference_problems
from schemas.config.responses import ResponsesConfig
from schemas.config.server import ServerConfig
from schemas.config.telemetry import TelemetryConfig


class GatewayConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    backends: Annotated[list[BackendConfig], Field(min_length=1)]
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    # API keys and per-key limits; absent = no authentication (the quickstart).
    auth: AuthConfig | None = None
    # Deployment-wide request caps (every caller, with or without a key).
    caps: RequestCaps = Field(default_factory=RequestCaps)
    # OpenTelemetry traces; absent = off unless the standard OTEL_* variables turn them on.
    telemetry: TelemetryConfig | None = None
    # Stored responses and conversations (``store: true``, ``previous_response_id``).
    responses: ResponsesConfig = Field(default_factory=ResponsesConfig)

    @model_validator(mode="after")
    def _cross_references(self) -> GatewayConfig:
        """Names, routes, pools and key globs, every problem at once (one ``ConfigProblems``)."""
        problems = reference_problems(
            [b.name for b in self.backends],
            [(m.name, [r.backend for r in m.routes]) for m in self.models],
            [list(k.models) for k in self.auth.keys] if self.auth is not None else None,
        )
        problems += self._pool_problems()
        if problems:
            raise ConfigProblems(problems)
        return self

    def _pool_problems(self) -> list[tuple[str, str]]:
        """Routes to a ``vllm-pool`` name what its workers serve; pools share no port or GPU."""
        problems: list[tuple[str, str]] = []
        pools = {b.name: (i, b) for i, b in enumerate(self.backends) if isinstance(b, VLLMPoolBackendConfig)}
        for i, model in enumerate(self.models):
            for j, route in enumerate(model.routes):
                pool = pools.get(route.backend)
                if pool is not None and route.model != pool[1].served_name:
                    problems.append(
                        (
                            f"models[{i}].routes[{j}].model",
                            f"backend {route.backend!r} serves {pool[1].served_name!r}",
                        )
                    )
        placed = sorted(pools.values(), key=lambda item: item[0])
        for n, (i, a) in enumerate(placed):
            for k, b in placed[n + 1 :]:
                if a.port_range[0] <= b.port_range[1] and b.port_range[0] <= a.port_range[1]:
                    problems.append((f"backends[{k}].port_range", f"overlaps backends[{i}].port_range"))
                if (a.gpus == "all" and b.gpus) or (b.gpus == "all" and a.gpus):
                    problems.append((f"backends[{k}].gpus", f"overlaps backends[{i}].gpus"))
                    continue
                ids = [set(range(g)) if isinstance(g, int) else set(g) for g in (a.gpus, b.gpus) if g != "all"]
                if len(ids) == 2 and ids[0] & ids[1]:
                    problems.append(
                        (f"backends[{k}].gpus", f"GPU(s) {sorted(ids[0] & ids[1])} also in backends[{i}].gpus")
                    )
        return problems

    def backend(self, name: str) -> BackendConfig:
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)

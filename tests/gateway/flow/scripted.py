"""A gateway's request flow wired to scripted in-memory backends, for the flow specification tests.

:func:`build_flow` builds the app with ``create_app`` (the same factory ``gateway serve``
uses) from a YAML text whose backends are ``type: mock`` placeholders, and registers a
:class:`tests.fakes.ScriptedBackend` under each backend name instead; time is a
:class:`FakeClock`. No server is started: :class:`Flow` calls the service the way the
handler does (look the model up, ask the router for the candidates, run the service),
and reads the outcome through public surfaces only: what the service returned or raised,
the calls the fakes recorded, the clock's sleeps and the metrics registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from backends.base import CompletionResult
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.flow.endpoints import OPS
from gateway.flow.opened import OpenedStream
from gateway.state import STATE, GatewayState
from schemas.completions import CompletionRequest
from schemas.endpoints import Endpoint
from tests.fakes import Call, ScriptedBackend
from tests.gateway.endpoint_labels import with_endpoint
from tests.gateway.flow.conftest import FakeClock

__all__ = ["Flow", "backend_yaml", "build_flow", "flow"]


def backend_yaml(name: str, **settings: Any) -> str:
    """One ``backends`` list item: ``backend_yaml("a", retry={"attempts": 3})``."""
    fields = {"name": name, "type": "mock", **settings}
    return "  - " + _flow(fields) + "\n"


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    return str(value)


@dataclass
class Flow:
    app: web.Application
    clock: FakeClock
    backends: dict[str, ScriptedBackend]
    journal: list[Call] = field(default_factory=list)
    _ids: int = 0

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]

    def __getitem__(self, name: str) -> ScriptedBackend:
        return self.backends[name]

    def _prepare(self, model: str, fields: dict[str, Any]) -> tuple[Any, ...]:
        request = CompletionRequest.model_validate({"model": model, "prompt": "hi", "max_tokens": 3, **fields})
        entry = self.state.router.lookup(model)
        ops = OPS[Endpoint.COMPLETIONS]
        routes = self.state.router.candidates(entry, request, ops)
        self._ids += 1
        return ops, entry, routes, request, f"req-{self._ids}"

    async def complete(self, model: str = "m", **fields: Any) -> tuple[CompletionResult, str]:
        """The result and the name of the backend that answered."""
        result, route = await self.state.service.complete(*self._prepare(model, fields))
        return result, route.backend.name

    async def open_stream(self, model: str = "m", **fields: Any) -> OpenedStream:
        return await self.state.service.open_stream(*self._prepare(model, {**fields, "stream": True}))

    def metric(self, name: str, **labels: str) -> float:
        value = self.state.metrics.registry.get_sample_value(name, with_endpoint(name, labels))
        return 0.0 if value is None else value

    def called(self) -> list[str]:
        """The backends called, in order, across the whole flow."""
        return [c.backend for c in self.journal]


def build_flow(backends: str, routes: list[str], *, model: str = "m", server: str = "", extra_models: str = "") -> Flow:
    """A flow over ``backends`` (``backend_yaml`` items) with model ``model`` routed to ``routes`` in order.

    Route ``x`` asks backend ``x`` for upstream model ``up-x``; ``server`` adds settings under
    ``server:`` (``"admission: {queue_size: 0}"``).
    """
    route_list = ", ".join(f"{{backend: {r}, model: up-{r}}}" for r in routes)
    text = (
        f"server: {{host: 127.0.0.1, port: 0{', ' + server if server else ''}}}\n"
        f"backends:\n{backends}"
        f"models:\n  - {{name: {model}, routes: [{route_list}]}}\n{extra_models}"
    )
    config = parse_config(text, "<flow test config>", env={})
    clock = FakeClock()
    journal: list[Call] = []
    fakes = {b.name: ScriptedBackend(b.name, journal=journal, clock=clock) for b in config.backends}
    app = create_app(config, backends=fakes, clock=clock)
    return Flow(app, clock, fakes, journal)


def flow(*names: str, **settings: Mapping[str, Any]) -> Flow:
    """Model ``m`` routed to backends ``names`` in order; ``a={...}`` configures backend ``a``."""
    return build_flow("".join(backend_yaml(n, **settings.get(n, {})) for n in names), list(names))

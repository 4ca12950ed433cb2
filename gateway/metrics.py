"""The gateway's Prometheus metrics behind a small semantic interface.

Label values come only from configured names (models, backends) and fixed sets
(status codes, parameter names of our schema, reason words): a model name a
client invents is counted as ``model="_unknown"``, never as a new series.

Hot-path cost: children are cached per label tuple, so recording a request is a
dict lookup plus a few lock-protected adds.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from backends.capabilities import ALL_FIELDS

__all__ = ["UNKNOWN", "GatewayMetrics"]

UNKNOWN = "_unknown"
NONE = "_none"  # no backend was involved (validation error, unknown model)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """All series of one gateway instance, in their own registry."""

    def __init__(
        self, models: Iterable[str], backends: Iterable[str], registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._models = frozenset(models)
        self._backends = frozenset(backends)
        self._fields = frozenset(ALL_FIELDS)
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Completion requests answered, by model, backend and HTTP status.",
            ("model", "backend", "status"),
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "Time from request received to response complete.",
            ("model", "backend"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: time from request received to the first event sent.",
            ("model", "backend"),
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens reported by upstreams.", ("model", "backend"), registry=r
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens", "Completion tokens reported by upstreams.", ("model", "backend"), registry=r
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Completion requests being served now.", ("model",), registry=r
        )
        self.unsupported = Counter(
            "gateway_unsupported_parameter_rejections",
            "Requests refused because the chosen backend cannot honour a field.",
            ("backend", "param"),
            registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors",
            "Failed upstream attempts, by backend and reason.",
            ("backend", "reason"),
            registry=r,
        )
        self.stream_failures = Counter(
            "gateway_stream_failures",
            "Streams ended by an upstream failure after the first event was sent.",
            ("model", "backend", "reason"),
            registry=r,
        )
        self.client_disconnects = Counter(
            "gateway_client_disconnects",
            "Requests whose client went away before the answer was complete.",
            ("model", "backend"),
            registry=r,
        )
        self._request_children: dict[tuple[str, str, str], Counter] = {}
        self._pair_children: dict[tuple[str, str], tuple[Histogram, Histogram, Counter, Counter]] = {}
        self._in_flight_children: dict[str, Gauge] = {}
        for model in self._models:
            self.in_flight.labels(model)

    # --- label hygiene -------------------------------------------------------------------
    def model_label(self, model: str | None) -> str:
        return model if model in self._models else UNKNOWN  # type: ignore[return-value]

    def backend_label(self, backend: str | None) -> str:
        return backend if backend in self._backends else NONE  # type: ignore[return-value]

    def _pair(self, model: str, backend: str) -> tuple[Histogram, Histogram, Counter, Counter]:
        key = (model, backend)
        children = self._pair_children.get(key)
        if children is None:
            children = (
                self.latency.labels(model, backend),
                self.ttft.labels(model, backend),
                self.prompt_tokens.labels(model, backend),
                self.completion_tokens.labels(model, backend),
            )
            self._pair_children[key] = children
        return children

    # --- recording -----------------------------------------------------------------------
    def request_started(self, model: str) -> None:
        """``model`` must be a configured name (resolved before calling)."""
        child = self._in_flight_children.get(model)
        if child is None:
            child = self._in_flight_children[model] = self.in_flight.labels(model)
        child.inc()

    def request_ended(self, model: str) -> None:
        self._in_flight_children[model].dec()

    def request_finished(self, model: str | None, backend: str | None, status: int, seconds: float | None) -> None:
        model_l = self.model_label(model)
        backend_l = self.backend_label(backend)
        key = (model_l, backend_l, str(status))
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()
        if seconds is not None and backend_l != NONE and model_l != UNKNOWN:
            self._pair(model_l, backend_l)[0].observe(seconds)

    def first_token(self, model: str, backend: str, seconds: float) -> None:
        self._pair(model, backend)[1].observe(seconds)

    def tokens(self, model: str, backend: str, prompt: int, completion: int) -> None:
        children = self._pair(model, backend)
        if prompt > 0:
            children[2].inc(prompt)
        if completion > 0:
            children[3].inc(completion)

    def unsupported_parameter(self, backend: str, param: str) -> None:
        self.unsupported.labels(self.backend_label(backend), param if param in self._fields else UNKNOWN).inc()

    def upstream_error(self, backend: str, reason: str) -> None:
        self.upstream_errors.labels(self.backend_label(backend), reason).inc()

    def stream_failed(self, model: str, backend: str, reason: str) -> None:
        self.stream_failures.labels(self.model_label(model), self.backend_label(backend), reason).inc()

    def client_disconnected(self, model: str, backend: str | None) -> None:
        self.client_disconnects.labels(self.model_label(model), self.backend_label(backend)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Every series the gateway exports: name, help text, labels and buckets, in one registry.

:class:`MetricFamilies` only declares; what a request adds and which label values are allowed
(configured names, fixed sets) is :class:`gateway.metrics.GatewayMetrics`, built on it, so the
catalogue of metric names reads in one place and the recording code stays short.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gateway.version import PYTHON_VERSION, gateway_version

__all__ = ["COST_LABELS", "CostCounter", "MetricFamilies"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Time per output token: a fast GPU streams a token every few ms, a CPU or an overloaded server in 100s of ms.
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)

COST_LABELS = ("model", "backend", "key", "source")

# ``*_created`` samples (one per counter and histogram series, the time it was first written) would
# double the exposition for a value no dashboard reads: the gateway's process turns them off.
disable_created_metrics()  # type: ignore[no-untyped-call]


class CostCounter(Collector):
    """``gateway_cost_total``: spend in integer units (``gateway.spend.prices.UNIT``) per label tuple,
    added exactly and turned into the currency's decimal only when scraped (a float counter
    incremented by 0.0000015 at a time would drift from usage x price)."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str, str, str], int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "gateway_cost",
            "Spend by model, backend and API key name, in the currency of models[].pricing; source is upstream "
            "(its reported usage) or estimate (the gateway's count: no usage reported).",
            labels=COST_LABELS,
        )
        for labels, amount in list(self.totals.items()):
            family.add_metric(labels, amount / 10**12)  # int / int: correctly rounded, whatever the size
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("gateway_cost", "", labels=COST_LABELS)


class MetricFamilies:
    """The gateway's metric families (no children yet), registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.build_info = Gauge(
            "gateway_build_info",
            "Always 1: the gateway's version and the Python it runs on, as labels.",
            ("version", "python"),
            registry=r,
        )
        self.build_info.labels(gateway_version(), PYTHON_VERSION).set(1)
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by model, backend, HTTP status and endpoint (completions, chat).",
            ("model", "backend", "status", "endpoint"),
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds",
            "Time from request received to response complete, every answer (refusals too), by status class.",
            ("model", "backend", "endpoint", "status_class"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "gateway_upstream_duration_seconds",
            "Time the answering upstream attempt took, from sending the request to its last byte read.",
            ("model", "backend", "endpoint"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "gateway_time_per_output_token_seconds",
            "Streams: time from the first event to the last, per output token after the first (per sequence).",
            ("model", "backend", "endpoint"),
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: time from request received to the first event sent.",
            ("model", "backend", "endpoint"),
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens",
            "Prompt tokens reported by upstreams.",
            ("model", "backend", "endpoint"),
            registry=r,
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens reported by upstreams.",
            ("model", "backend", "endpoint"),
            registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being served now.", ("model", "endpoint"), registry=r
        )
        self.unsupported = Counter(
            "gateway_unsupported_parameter_rejections",
            "Requests refused because the chosen backend cannot honour a field.",
            ("backend", "param", "endpoint"),
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
            ("model", "backend", "reason", "endpoint"),
            registry=r,
        )
        self.client_disconnects = Counter(
            "gateway_client_disconnects",
            "Requests whose client went away before the answer was complete.",
            ("model", "backend", "endpoint"),
            registry=r,
        )
        # --- routing and resilience ---------------------------------------------------------
        self.retries = Counter(
            "gateway_retries",
            "Retries of a backend within one request, by backend and the reason of the failure retried.",
            ("backend", "reason"),
            registry=r,
        )
        self.failovers = Counter(
            "gateway_failovers",
            "Moves to a model's next route after a retryable failure, by model and the backend left.",
            ("model", "backend", "reason"),
            registry=r,
        )
        self.circuit = Gauge(
            "gateway_circuit_state",
            "Circuit breaker per backend: 0 closed, 1 half-open (one trial), 2 open (ejected).",
            ("backend",),
            registry=r,
        )
        self.circuit_opened = Counter(
            "gateway_circuit_opened", "Times a backend's circuit opened.", ("backend",), registry=r
        )
        self.no_healthy_route = Counter(
            "gateway_no_healthy_route",
            "Requests answered 503 at once because every route's circuit was open.",
            ("model",),
            registry=r,
        )
        self.queue_depth_gauge = Gauge(
            "gateway_queue_depth",
            "Requests waiting for capacity, gateway-wide (scope=_gateway) or per backend.",
            ("scope",),
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "gateway_queue_wait_seconds",
            "Time spent waiting for capacity by requests that had to wait and got it.",
            ("scope",),
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "gateway_admission_rejections",
            "Requests answered 429 by admission control, by scope and reason (queue_full, queue_timeout).",
            ("scope", "reason"),
            registry=r,
        )
        # --- security and tenancy (auth on): labelled only with configured key names and fixed reasons
        self.key_requests = Counter(
            "gateway_key_requests",
            "Completion requests by API key name and HTTP status (auth on).",
            ("key", "status"),
            registry=r,
        )
        self.key_tokens_total = Counter(
            "gateway_key_tokens",
            "Tokens used by API key name, from upstream usage; kind is prompt or completion.",
            ("key", "kind"),
            registry=r,
        )
        self.cost = CostCounter()
        r.register(self.cost)
        self.key_rejections = Counter(
            "gateway_key_rejections",
            "Requests refused by auth, caps, per-key limits and budgets, by key name (_none: no valid key) and reason.",
            ("key", "reason"),
            registry=r,
        )
        self.spend_store_errors = Counter(
            "gateway_spend_store_errors",
            "Failed calls to the spend store (Redis): budgets are not enforced meanwhile, charges kept and retried.",
            registry=r,
        )
        self.ratelimit_store_errors = Counter(
            "gateway_ratelimit_store_errors",
            "Failed calls to the shared rate-limit store (Redis); each one was decided per replica instead.",
            registry=r,
        )
        self.ratelimit_store_degraded = Gauge(
            "gateway_ratelimit_store_degraded",
            "1 while the shared rate-limit store is unreachable and limits hold per replica, else 0.",
            registry=r,
        )
        # --- state that outlives a request (gateway.store): labelled with fixed store names and reasons
        self.store_items = Gauge(
            "gateway_state_store_items",
            "Values held by an in-memory state store (store=responses: stored responses), this process.",
            ("store",),
            registry=r,
        )
        self.store_bytes = Gauge(
            "gateway_state_store_bytes",
            "Bytes held by an in-memory state store (values, keys and bookkeeping), this process.",
            ("store",),
            registry=r,
        )
        self.store_limit = Gauge(
            "gateway_state_store_limit",
            "The bounds of an in-memory state store: bound=items or bytes.",
            ("store", "bound"),
            registry=r,
        )
        self.store_evictions = Counter(
            "gateway_state_store_evictions",
            "Values dropped by an in-memory state store, by reason: expired (ttl), items or bytes (the bound, "
            "least recently used first), too_large (one value over max_bytes, never kept).",
            ("store", "reason"),
            registry=r,
        )
        self.store_errors = Counter(
            "gateway_state_store_errors",
            "Failed calls to a shared state store (Redis); each one answered 503 or left a response unstored.",
            ("store",),
            registry=r,
        )
        self.stored_requests = Counter(
            "gateway_stored_response_requests",
            "Requests to stored responses by operation (retrieve, delete, input_items) and HTTP status.",
            ("operation", "status"),
            registry=r,
        )

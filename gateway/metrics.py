"""The gateway's Prometheus metrics behind a small semantic interface.

Label values come only from configured names (models, backends) and fixed sets
(status codes, parameter names of our schemas, reason words, ``endpoint``: ``completions`` or
``chat``): a model name a client invents is counted as ``model="_unknown"``, never as a new
series. Request-level series (requests, latency, TTFT, tokens, in flight, unsupported
parameters, stream failures, disconnects) carry the ``endpoint`` the request came in on.
The families themselves (names, help, labels, buckets) are declared in
:mod:`gateway.metrics_families`; this module owns label hygiene and recording.

Hot-path cost: children are cached per label tuple (their value adders, see :func:`_adder`),
so recording a request is a dict lookup plus a few lock-protected adds.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from backends.base import TokenUsage
from backends.capabilities import ALL_FIELDS
from backends.chat_capabilities import CHAT_FIELDS
from backends.responses.capabilities import RESPONSES_PARAMS
from gateway.metrics_families import MetricFamilies
from gateway.store.base import StoreStats
from schemas.endpoints import Endpoint

__all__ = ["GATEWAY_SCOPE", "UNKNOWN", "GatewayMetrics", "status_class"]

_Add = Callable[[float], None]  # adds to one labelled series (negative: a gauge going down)
_Usage = TokenUsage | None

UNKNOWN = "_unknown"
GATEWAY_SCOPE = "_gateway"  # the gateway-wide admission queue (backend names cannot start with "_")
NONE = "_none"  # no backend was involved (validation error, unknown model)

_KEY_REASONS = frozenset(
    {"unauthenticated", "model", "cap", "requests", "tokens", "too_large", "concurrency", "budget"}
)


_EVICTIONS = frozenset({"expired", "items", "bytes", "too_large"})
_STORED_OPS = frozenset({"retrieve", "delete", "input_items"})


def _stat(stats: Callable[[], StoreStats | None], name: str) -> float:
    now = stats()
    return float(getattr(now, name)) if now is not None else 0.0


def _adder(child: Counter | Gauge) -> _Add:
    """What ``child.inc`` ends in, without its checks on every call: one Python call per update, not four.

    The checks cannot fail here: a labelled child is observable, and the amounts the request
    path adds to counters are never negative (a gauge takes -1 as ``dec`` would). Should
    prometheus_client keep its value elsewhere one day, this falls back to ``child.inc``.
    """
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else child.inc


def status_class(status: int) -> str:
    """``2xx``, ``4xx``, ``5xx``: the request-duration histogram's ``status_class``."""
    return _CLASSES.get(status // 100) or f"{status // 100}xx"


_CLASSES = {2: "2xx", 4: "4xx", 5: "5xx"}
_Observe = Callable[[float], None]
_Hist = tuple[list[float], _Observe, list[_Observe]]  # bounds, the sum's adder, each bucket's adder: _histogram
# A (model, backend, endpoint)'s children: TTFT, prompt and completion tokens, upstream duration, time per token.
_Pair = tuple[_Observe, _Add, _Add, _Hist, _Observe]


def _histogram(child: Histogram) -> _Hist:
    """A histogram child as what its ``observe`` touches: the bounds, the sum's adder and each bucket's,
    so an observation is ``total(v); adds[bisect_left(bounds, v)](1)``: three C calls, none of
    prometheus-client's checks and Python loop over the buckets (it keeps one count per bucket and
    makes them cumulative when collected). Should the client keep its values elsewhere one day, the
    sum's adder is ``child.observe`` itself and the one bucket does nothing."""
    bounds = getattr(child, "_upper_bounds", None)
    total = getattr(getattr(child, "_sum", None), "inc", None)
    buckets = getattr(child, "_buckets", None)
    if not isinstance(bounds, list) or not callable(total) or not isinstance(buckets, list):
        return [math.inf], child.observe, [_nothing]
    return bounds, total, [bucket.inc for bucket in buckets]


def _nothing(_: float) -> None:
    return None


def _observer(child: Histogram) -> _Observe:
    """``child.observe`` as one call over :func:`_histogram` (for the observations made one at a time)."""
    bounds, total, adds = _histogram(child)

    def observe(amount: float) -> None:
        total(amount)
        adds[bisect_left(bounds, amount)](1)

    return observe


class _Closing:
    """The series a request's close adds to, for one (model, backend, endpoint), bound once."""

    __slots__ = ("disconnect", "labels", "pair", "requests")

    def __init__(self, m: GatewayMetrics, model: str | None, backend: str | None, endpoint: Endpoint) -> None:
        self.labels = (m.model_label(model), m.backend_label(backend), endpoint.value)
        known = model in m._models and backend in m._backends
        self.pair = m._pair(self.labels[0], self.labels[1], endpoint) if known else None
        self.disconnect: _Add | None = None  # made at the first 499: no zero series before
        self.requests: dict[int, tuple[_Add, _Hist]] = {}  # status -> its count, its class's duration


class GatewayMetrics(MetricFamilies):
    """All series of one gateway instance, in their own registry: the families of
    :class:`MetricFamilies`, recorded through label-checked, cached children."""

    def __init__(
        self,
        models: Iterable[str],
        backends: Iterable[str],
        registry: CollectorRegistry | None = None,
        keys: Iterable[str] = (),
        collectors: Iterable[Collector] = (),
    ) -> None:
        super().__init__(registry if registry is not None else CollectorRegistry(auto_describe=True))
        self._models = frozenset(models)
        self._backends = frozenset(backends)
        self._keys = frozenset(keys)
        # A refusal's param: a field of any endpoint's schema (Responses' nested ones by name: text.format).
        self._fields = frozenset(ALL_FIELDS) | frozenset(CHAT_FIELDS) | RESPONSES_PARAMS
        self._collectors: list[Collector] = []  # the backends' own (watch), replaced on reload
        # Set by a worker of ``gateway serve --workers N``: the whole gateway's exposition, merged by
        # the control process (gateway.workers.merge); None: this process is the gateway.
        self.gateway_view: Callable[[], Awaitable[bytes]] | None = None
        self._request_children: dict[tuple[str, str, int, Endpoint], tuple[_Add, _Hist]] = {}
        self._pair_children: dict[tuple[str, str, Endpoint], _Pair] = {}
        self._closing: dict[tuple[str | None, str | None, Endpoint], _Closing] = {}
        self._in_flight_children: dict[tuple[str, Endpoint], _Add] = {}
        self._eviction_children: dict[tuple[str, str], _Add] = {}
        self._scopes = self._backends | {GATEWAY_SCOPE}
        for scope in self._scopes:
            self.queue_depth_gauge.labels(scope)
        for backend in self._backends:
            self.circuit.labels(backend)
        self.watch(collectors)
        self._key_children: dict[tuple[str, int], Counter] = {}

    # --- label hygiene -------------------------------------------------------------------
    def model_label(self, model: str | None) -> str:
        return model if model in self._models else UNKNOWN

    def backend_label(self, backend: str | None) -> str:
        return backend if backend in self._backends else NONE

    # The caches are keyed by the ``Endpoint`` member itself: a StrEnum hashes and compares as
    # its value, so the key is the same as with ``endpoint.value``, without the Python-level
    # ``value`` property call that each ``.value`` costs on the hot path.
    def _pair(self, model: str, backend: str, endpoint: Endpoint) -> _Pair:
        key = (model, backend, endpoint)
        children = self._pair_children.get(key)
        if children is None:
            labels = (model, backend, endpoint.value)
            children = (
                _observer(self.ttft.labels(*labels)),
                _adder(self.prompt_tokens.labels(*labels)),
                _adder(self.completion_tokens.labels(*labels)),
                _histogram(self.upstream_latency.labels(*labels)),
                _observer(self.tpot.labels(*labels)),
            )
            self._pair_children[key] = children
        return children

    def _finished(self, labels: tuple[str, str, str], status: int) -> tuple[_Add, _Hist]:
        """A status's request count and its class's duration histogram, for ``(model, backend, endpoint)``."""
        model, backend, endpoint = labels
        return (
            _adder(self.requests.labels(model, backend, str(status), endpoint)),
            _histogram(self.latency.labels(model, backend, endpoint, status_class(status))),
        )

    # --- recording -----------------------------------------------------------------------
    # ``endpoint`` is keyword-only and defaults to completions, the endpoint every caller had
    # before chat; the request path always passes its own.
    def request_started(self, model: str, *, endpoint: Endpoint = Endpoint.COMPLETIONS) -> None:
        """``model`` must be a configured name (resolved before calling)."""
        key = (model, endpoint)
        add = self._in_flight_children.get(key)
        if add is None:
            add = self._in_flight_children[key] = _adder(self.in_flight.labels(model, endpoint.value))
        add(1)

    def request_ended(self, model: str, *, endpoint: Endpoint = Endpoint.COMPLETIONS) -> None:
        self._in_flight_children[(model, endpoint)](-1)

    def request_finished(
        self,
        model: str | None,
        backend: str | None,
        status: int,
        seconds: float | None,
        *,
        endpoint: Endpoint = Endpoint.COMPLETIONS,
    ) -> None:
        """A request's answer: counted, and its duration observed under its status class (refusals too)."""
        model_l = model if model in self._models else UNKNOWN  # model_label, inline: once per request
        backend_l = backend if backend in self._backends else NONE  # backend_label
        key = (model_l, backend_l, status, endpoint)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = self._finished((model_l, backend_l, endpoint.value), status)
        children[0](1)
        if seconds is not None:
            bounds, total, adds = children[1]
            total(seconds)
            adds[bisect_left(bounds, seconds)](1)

    def first_token(
        self, model: str, backend: str, seconds: float, *, endpoint: Endpoint = Endpoint.COMPLETIONS
    ) -> None:
        self._pair(model, backend, endpoint)[0](seconds)

    def tokens(
        self, model: str, backend: str, prompt: int, completion: int, *, endpoint: Endpoint = Endpoint.COMPLETIONS
    ) -> None:
        children = self._pair(model, backend, endpoint)
        if prompt > 0:
            children[1](prompt)
        if completion > 0:
            children[2](completion)

    def request_closed(
        self,
        model: str | None,
        backend: str | None,
        status: int,
        seconds: float,
        usage: _Usage,
        endpoint: Endpoint,
        upstream: float | None = None,
        per_token: float | None = None,
    ) -> None:
        """One request's end as ``tokens``, ``client_disconnected`` (499), ``request_finished``, and the
        answering attempt's ``upstream`` duration and a stream's time ``per_token`` when known: one cached
        bundle per (model, backend, endpoint), one lookup, the adds bound once (not kept for unknown names)."""
        try:  # an index, not a get: no call on the path every request takes
            series = self._closing[(model, backend, endpoint)]
        except KeyError:
            series = None
        if series is None:
            if (model is not None and model not in self._models) or (
                backend is not None and backend not in self._backends
            ):
                if usage is not None and model is not None and backend is not None:
                    self.tokens(model, backend, usage.prompt_tokens, usage.completion_tokens, endpoint=endpoint)
                if status == 499:
                    self.client_disconnected(model, backend, endpoint=endpoint)
                self.request_finished(model, backend, status, seconds, endpoint=endpoint)
                return
            series = self._closing[(model, backend, endpoint)] = _Closing(self, model, backend, endpoint)
        pair = series.pair
        if pair is not None:
            if usage is not None:
                if usage.prompt_tokens > 0:
                    pair[1](usage.prompt_tokens)
                if usage.completion_tokens > 0:
                    pair[2](usage.completion_tokens)
            if upstream is not None:  # _histogram's observation, written out: once per request
                bounds, total, adds = pair[3]
                total(upstream)
                adds[bisect_left(bounds, upstream)](1)
            if per_token is not None:
                pair[4](per_token)
        if status == 499:  # nginx's "client closed request"
            if series.disconnect is None:
                series.disconnect = _adder(self.client_disconnects.labels(*series.labels))
            series.disconnect(1)
        try:
            children = series.requests[status]
        except KeyError:
            children = series.requests[status] = self._finished(series.labels, status)
        children[0](1)
        bounds, total, adds = children[1]
        total(seconds)
        adds[bisect_left(bounds, seconds)](1)

    def spent(self, model: str | None, backend: str | None, key: str | None, amount: int, estimate: bool) -> None:
        """``amount`` units (``gateway.spend.prices.UNIT``) spent; ``estimate``: from the gateway's own count."""
        labels = (  # the label checks inline: once per priced request
            model if model in self._models else UNKNOWN,
            backend if backend in self._backends else NONE,
            key if key in self._keys else NONE,
            "estimate" if estimate else "upstream",
        )
        totals = self.cost.totals
        try:
            totals[labels] += amount
        except KeyError:
            totals[labels] = amount

    def unsupported_parameter(self, backend: str, param: str, *, endpoint: Endpoint = Endpoint.COMPLETIONS) -> None:
        if param not in self._fields:  # a path inside a field (``input[2].content[0]``) counts for the field
            param = param.split("[", 1)[0].split(".", 1)[0]
        label = param if param in self._fields else UNKNOWN
        self.unsupported.labels(self.backend_label(backend), label, endpoint.value).inc()

    def upstream_error(self, backend: str, reason: str) -> None:
        self.upstream_errors.labels(self.backend_label(backend), reason).inc()

    def stream_failed(
        self, model: str, backend: str, reason: str, *, endpoint: Endpoint = Endpoint.COMPLETIONS
    ) -> None:
        self.stream_failures.labels(self.model_label(model), self.backend_label(backend), reason, endpoint.value).inc()

    def client_disconnected(
        self, model: str | None, backend: str | None, *, endpoint: Endpoint = Endpoint.COMPLETIONS
    ) -> None:
        self.client_disconnects.labels(self.model_label(model), self.backend_label(backend), endpoint.value).inc()

    # --- routing and resilience -------------------------------------------------------------
    def retried(self, backend: str, reason: str) -> None:
        self.retries.labels(self.backend_label(backend), reason).inc()

    def failed_over(self, model: str, backend: str, reason: str) -> None:
        self.failovers.labels(self.model_label(model), self.backend_label(backend), reason).inc()

    def circuit_changed(self, backend: str, state: int) -> None:
        """``state``: 0 closed, 1 half-open, 2 open."""
        label = self.backend_label(backend)
        self.circuit.labels(label).set(state)
        if state == 2:
            self.circuit_opened.labels(label).inc()

    def unavailable(self, model: str) -> None:
        self.no_healthy_route.labels(self.model_label(model)).inc()

    def _scope(self, scope: str) -> str:
        return scope if scope in self._scopes else NONE

    def queue_depth(self, scope: str, depth: int) -> None:
        self.queue_depth_gauge.labels(self._scope(scope)).set(depth)

    def queue_wait(self, scope: str, seconds: float) -> None:
        self.queue_wait_seconds.labels(self._scope(scope)).observe(seconds)

    def admission_rejected(self, scope: str, reason: str) -> None:
        self.rejections.labels(self._scope(scope), reason).inc()

    # --- worker pools ------------------------------------------------------------------------
    def watch(self, collectors: Iterable[Collector]) -> None:
        """Export the backends' own series (e.g. pool workers: ``backends.registry.metric_collectors``,
        which the app hands over, so this module knows no adapter), read at scrape time; replaces
        the previous ones."""
        for collector in self._collectors:
            self.registry.unregister(collector)
        self._collectors = list(collectors)
        for collector in self._collectors:
            self.registry.register(collector)

    def serve(self, served: Mapping[str, Iterable[Endpoint]]) -> None:
        """The endpoints each model is served on (the router's): their in-flight series exist from
        the start at 0, and only theirs (a request elsewhere is refused before it is in flight)."""
        for model, endpoints in served.items():
            if model in self._models:
                for endpoint in endpoints:
                    self.in_flight.labels(model, endpoint.value)

    def extend(
        self,
        models: Iterable[str],
        backends: Iterable[str],
        keys: Iterable[str] = (),
        collectors: Iterable[Collector] = (),
    ) -> None:
        """A config reload (``gateway.reload``): its new names become label values. Removed
        names stay known, so requests still finishing on the old config count under their own
        names and those series keep their last values; the backends' own series are ``collectors``."""
        self._models |= frozenset(models)
        added = frozenset(backends) - self._backends
        self._backends |= added
        self._scopes |= added
        for backend in added:
            self.queue_depth_gauge.labels(backend)
            self.circuit.labels(backend)
        self._keys |= frozenset(keys)
        self.watch(collectors)

    # --- security and tenancy (gateway.security.guard) ------------------------------------------------
    def key_label(self, key: str | None) -> str:
        return key if key in self._keys else NONE

    def key_request(self, key: str, status: int) -> None:
        child = self._key_children.get((key, status))
        if child is None:
            child = self._key_children[(key, status)] = self.key_requests.labels(self.key_label(key), str(status))
        child.inc()

    def key_tokens(self, key: str, prompt: int, completion: int) -> None:
        label = self.key_label(key)
        if prompt > 0:
            self.key_tokens_total.labels(label, "prompt").inc(prompt)
        if completion > 0:
            self.key_tokens_total.labels(label, "completion").inc(completion)

    def key_rejected(self, key: str | None, reason: str) -> None:
        """``reason``: unauthenticated, model, cap, requests, tokens, too_large, concurrency, budget."""
        self.key_rejections.labels(self.key_label(key), reason if reason in _KEY_REASONS else UNKNOWN).inc()

    def spend_store_error(self) -> None:
        self.spend_store_errors.inc()

    def ratelimit_store_error(self) -> None:
        self.ratelimit_store_errors.inc()

    def ratelimit_degraded(self, degraded: bool) -> None:
        self.ratelimit_store_degraded.set(1 if degraded else 0)

    # --- state stores (gateway.store) ----------------------------------------------------------------
    def watch_store(self, store: str, stats: Callable[[], StoreStats | None]) -> None:
        """Export an in-memory store's size and bounds, read from ``stats()`` at each scrape."""
        if stats() is None:
            return
        self.store_items.labels(store).set_function(lambda: _stat(stats, "items"))
        self.store_bytes.labels(store).set_function(lambda: _stat(stats, "bytes"))
        self.store_limit.labels(store, "items").set_function(lambda: _stat(stats, "max_items"))
        self.store_limit.labels(store, "bytes").set_function(lambda: _stat(stats, "max_bytes"))

    def store_evicted(self, store: str, reason: str, count: int) -> None:
        # A full memory store evicts on every save: its labelled child is looked up once, not per save.
        add = self._eviction_children.get((store, reason))
        if add is None:
            label = reason if reason in _EVICTIONS else UNKNOWN
            add = self._eviction_children[(store, reason)] = _adder(self.store_evictions.labels(store, label))
        add(count)

    def store_error(self, store: str) -> None:
        self.store_errors.labels(store).inc()

    def stored_request(self, operation: str, status: int) -> None:
        """``operation``: retrieve, delete or input_items (``gateway.http.stored_responses``)."""
        self.stored_requests.labels(operation if operation in _STORED_OPS else UNKNOWN, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

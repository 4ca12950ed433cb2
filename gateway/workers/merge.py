"""One ``/metrics`` for N workers: snapshots of each worker's registry, merged in the control process.

Each worker keeps its own prometheus-client registry (nothing changes on the hot path: a request
still costs a few dict lookups and adds) and sends a :data:`Snapshot` of it to the control process
about once a second, at every scrape and when it stops. The control process keeps the latest
snapshot of every live worker plus the folded totals of the workers that are gone, so a counter
never goes down when a worker is replaced (prometheus-client's multiprocess mode gives the same
guarantee with a file per process and ~2.5x the cost of every metric update; see the spec).

Merge rules, by family type: counters, histograms and summaries are summed (spend as decimals,
so it stays exact; ``*_created`` samples, if a backend's collector has any, take the earliest);
gauges are summed (requests in flight, queue depth: the gateway's total) except the families in
:data:`MAX_GAUGES`, which take the largest worker's value: state gauges (the worst worker's), and
the ``vllm-pool`` figures the control process publishes to every worker alike (state, restarts,
scraped queue and KV cache: summing would count them N times; the pool's calls in flight and
routing decisions are each worker's own, so they are summed); a gone worker's gauges are dropped,
its counters kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

__all__ = ["MAX_GAUGES", "MetricsMerger", "Snapshot", "snapshot"]

# [family name, type, help, [[sample name, {label: value}, value], ...]], JSON-friendly.
Snapshot = list[list[Any]]
_Key = tuple[str, tuple[tuple[str, str], ...]]

# Gauges saying a state (0 closed .. 2 open; degraded 0/1): the gateway's state is the worst worker's.
# The pool series every worker copies from the control process's view: one value, not N.
MAX_GAUGES = frozenset(
    {
        "gateway_build_info",
        "gateway_circuit_state",
        "gateway_ratelimit_store_degraded",
        "gateway_pool_worker_state",
        "gateway_pool_worker_restarts",
        "gateway_pool_worker_queue",
        "gateway_pool_worker_kv_cache_usage",
        "gateway_pool_worker_running",
        "gateway_pool_worker_metrics_stale",
        "gateway_pool_worker_score_queue",
        "gateway_pool_worker_prefix_blocks",
    }
)
_KEPT = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
# Sums of decimal amounts (spend: gateway.spend): each worker's value is the float nearest its exact
# total, whose shortest repr is that total; summed as decimals, so the merged view is exact too.
_DECIMAL_SUMS = frozenset({"gateway_cost"})


def snapshot(registry: CollectorRegistry) -> Snapshot:
    """The registry's families now, in a form that survives a JSON round trip."""
    return [
        [m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]] for m in registry.collect()
    ]


class _Family:
    __slots__ = ("documentation", "samples", "type")

    def __init__(self, typ: str, documentation: str) -> None:
        self.type = typ
        self.documentation = documentation
        self.samples: dict[_Key, float] = {}

    def add(self, sample: str, labels: dict[str, str], value: float, *, family: str) -> None:
        key = (sample, tuple(sorted(labels.items())))
        old = self.samples.get(key)
        if old is None:
            self.samples[key] = value
        elif sample.endswith("_created"):
            self.samples[key] = min(old, value)
        elif family in MAX_GAUGES:
            self.samples[key] = max(old, value)
        elif family in _DECIMAL_SUMS:
            self.samples[key] = float(Decimal(repr(old)) + Decimal(repr(value)))
        elif self.type in _KEPT or self.type == "gauge":
            self.samples[key] = old + value
        else:  # info, stateset, unknown: the last worker's word
            self.samples[key] = value


class MetricsMerger:
    """Latest snapshot per live worker plus the totals of gone ones; not thread-safe (one event loop)."""

    def __init__(self) -> None:
        self._live: dict[int, Snapshot] = {}
        self._gone: dict[str, _Family] = {}

    def update(self, worker: int, snap: Snapshot) -> None:
        """``worker``: an id unique to one worker process (a replacement gets a new one)."""
        self._live[worker] = snap

    def retire(self, worker: int) -> None:
        """The worker is gone: keep what it counted, forget its gauges."""
        snap = self._live.pop(worker, None)
        if snap is not None:
            self._fold(self._gone, [f for f in snap if f[1] in _KEPT])

    @staticmethod
    def _fold(into: dict[str, _Family], snap: Iterable[list[Any]]) -> None:
        for name, typ, doc, samples in snap:
            family = into.get(name)
            if family is None:
                family = into[name] = _Family(typ, doc)
            for sample, labels, value in samples:
                family.add(sample, labels, float(value), family=name)

    def merged(self) -> dict[str, _Family]:
        out: dict[str, _Family] = {}
        for snap in self._live.values():
            self._fold(out, snap)
        for name, gone in self._gone.items():
            family = out.get(name)
            if family is None:
                family = out[name] = _Family(gone.type, gone.documentation)
            for (sample, labels), value in gone.samples.items():
                family.add(sample, dict(labels), value, family=name)
        return out

    def render(self) -> bytes:
        """The merged view in Prometheus' text format."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Frozen(self.merged()))
        return generate_latest(registry)


class _Frozen:
    """A collector yielding merged families (registered in a throwaway registry to render them)."""

    def __init__(self, families: dict[str, _Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for name, family in self._families.items():
            metric = Metric(name, family.documentation, family.type)
            for (sample, labels), value in family.samples.items():
                metric.add_sample(sample, dict(labels), value)
            yield metric

"""The pools' Prometheus series (``gateway_pool_*``), read from each pool's status at scrape time.

Lives next to the pool because it reads nothing but :meth:`ReportsPool.pool_status`;
``gateway.metrics`` registers it for the configured pools. Labels: the configured backend
name and the worker index, plus the fixed state and decision words.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.vllm.routing.status import STATES, ReportsPool

__all__ = ["PoolCollector"]


class PoolCollector(Collector):
    """``gateway_pool_*`` series, labelled by configured backend name and worker index."""

    def __init__(self, pools: list[ReportsPool]) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        labels = ("backend", "worker")
        state = GaugeMetricFamily(
            "gateway_pool_worker_state", "1 for the state each pool worker is in.", labels=(*labels, "state")
        )
        restarts = CounterMetricFamily("gateway_pool_worker_restarts", "Restarts of each pool worker.", labels=labels)
        in_flight = GaugeMetricFamily(
            "gateway_pool_worker_in_flight", "Requests in flight from this gateway to each worker.", labels=labels
        )
        queue = GaugeMetricFamily(
            "gateway_pool_worker_queue", "Requests waiting in each worker's own queue (scraped).", labels=labels
        )
        kv = GaugeMetricFamily(
            "gateway_pool_worker_kv_cache_usage", "KV-cache usage of each worker, 0..1 (scraped).", labels=labels
        )
        running = GaugeMetricFamily(
            "gateway_pool_worker_running", "Requests running on each worker (scraped).", labels=labels
        )
        stale = GaugeMetricFamily(
            "gateway_pool_worker_metrics_stale",
            "1 while a worker's last metrics scrape failed (routing then counts only the gateway's calls).",
            labels=labels,
        )
        score_queue = GaugeMetricFamily(
            "gateway_pool_worker_score_queue",
            "strategy score: the queue the score reads for each worker (scraped, plus calls sent since).",
            labels=labels,
        )
        blocks = GaugeMetricFamily(
            "gateway_pool_worker_prefix_blocks",
            "strategy score: KV-cache blocks each worker holds, as its KV events say.",
            labels=labels,
        )
        decided = CounterMetricFamily(
            "gateway_pool_worker_score_decisions",
            "strategy score: requests sent to each worker, by the term that decided "
            "(score_queue, score_kv_cache, score_prefix, score_tie, score_session).",
            labels=(*labels, "decision"),
        )
        decisions = CounterMetricFamily(
            "gateway_pool_routing_decisions",
            "Worker choices by why (affinity_hit, affinity_miss, affinity_overloaded, least_load, round_robin, "
            "hash_preferred, hash_overloaded, score_queue, score_kv_cache, score_prefix, score_tie, score_session).",
            labels=("backend", "decision"),
        )
        rollouts = CounterMetricFamily(
            "gateway_pool_rollouts",
            "Reconfigurations of a pool by a reload, by outcome (in_place, rolled, failed).",
            labels=("backend", "outcome"),
        )
        for pool in self._pools:
            status = pool.pool_status()
            for w in status.workers:
                worker = (pool.name, str(w.index))
                for name in STATES:
                    state.add_metric((*worker, name), 1.0 if w.state == name else 0.0)
                restarts.add_metric(worker, w.restarts)
                in_flight.add_metric(worker, w.in_flight)
                queue.add_metric(worker, w.waiting)
                kv.add_metric(worker, w.kv_cache_usage)
                running.add_metric(worker, w.running)
                if status.scoring:
                    stale.add_metric(worker, 1.0 if w.stale else 0.0)
                    score_queue.add_metric(worker, w.queue)
                    blocks.add_metric(worker, w.prefix_blocks)
                    for decision, count in w.decided.items():
                        decided.add_metric((*worker, decision), count)
            for decision, count in status.decisions.items():
                decisions.add_metric((pool.name, decision), count)
            for outcome, count in status.rollouts.items():
                rollouts.add_metric((pool.name, outcome), count)
        yield from (state, restarts, in_flight, queue, kv, running, stale, score_queue, blocks, decided)
        yield from (decisions, rollouts)

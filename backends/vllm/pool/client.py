"""A ``vllm-pool`` or multi-server ``vllm`` backend as one gateway worker of ``--workers N`` sees it: routing only.

The control process owns the backend (:class:`backends.vllm.pool.pool.VLLMPoolBackend`: GPU plan,
vLLM processes, restarts, readiness probes, metrics scrapes, version detection, ``status.json``;
:class:`backends.vllm.routing.remote.VLLMEndpointsBackend`: DNS discovery, probes, scrapes, version
detection), so the vLLM processes live as long as the gateway, not as long as one worker, and
each server is probed once, not N times. It publishes a *view* (``view()``, see
:func:`backends.vllm.routing.status.endpoints_view`) whenever something changes; each worker applies
it here (:meth:`SharedEndpointsClient.apply`) and routes with the same balancer and dispatcher as
a single-process gateway, over the same endpoints:

- an endpoint is routable when the control process says it is ready; a new ``generation`` (a
  restarted vLLM) gets a new adapter and a cold prefix LRU, exactly as in the pool;
- the adapter is built with the version the control process detected and knows what the server's
  ``/v1/models`` told it (``max_model_len``, ``root``; no ``GET /version`` nor ``/v1/models`` per worker);
- load: the scraped queue and KV-cache figures from the view, plus the whole gateway's calls in
  flight from the shared table (:mod:`backends.vllm.routing.inflight`: this worker writes its row);
- a call that cannot connect takes the endpoint out of this worker's routing at once and asks
  the control process (``report_suspect``) to probe it now; the next view says what it found;
- an endpoint the view no longer lists (a discovered server gone) is not routable; its object is
  kept for its index, so its calls in flight and its cell of the table stay one count.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from backends.capabilities import Capabilities
from backends.errors import UpstreamError
from backends.transport import make_transport
from backends.transport.base import HTTPTransport
from backends.vllm.adapter import VLLMBackend
from backends.vllm.capabilities import VLLM_CAPABILITIES
from backends.vllm.pool.pool import endpoint_config, pool_endpoints, pool_signals, worker_count
from backends.vllm.pool.rollout import apply_routing, restart_keys, split_changes
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.dispatch import DispatchedBackend, Dispatcher
from backends.vllm.routing.inflight import InFlightTable, SharedEndpoint
from backends.vllm.routing.remote import remote_signals, server_config
from backends.vllm.routing.signals import EngineSignals
from backends.vllm.routing.status import PoolStatus, worker_load
from schemas.config import VLLMBackendConfig, VLLMPoolBackendConfig

__all__ = ["ClientReport", "SharedEndpointsClient", "VLLMEndpointsClient", "VLLMPoolClient"]

log = logging.getLogger("gateway.pool")


class SharedEndpointsClient(DispatchedBackend):
    """What both clients share; subclasses say how a server's adapter and the transport are configured."""

    default_capabilities: ClassVar[Capabilities] = VLLM_CAPABILITIES
    stop_timeout = 0.0  # seconds close() waits for calls in flight (the gateway drained its clients before)

    def __init__(self, config: VLLMPoolBackendConfig | VLLMBackendConfig, *, row: int) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        self.unknown_tables(config.tool_parser)
        self.routing = config.routing
        self.row = row  # this gateway worker's row in the in-flight table (its index K)
        self.dispatcher = Dispatcher(
            config.name,
            config.routing,
            on_failure=self._failed,
            hopeless=lambda: self._hopeless,
            describe=lambda: self._describe,
        )
        self.signals = self._signals(config)
        # Set by the worker's channel: tell the control process an endpoint could not be reached.
        self.report_suspect: Callable[[int, int], None] = lambda index, generation: None
        self.table: InFlightTable | None = None
        self._transport: HTTPTransport | None = None
        self._view: dict[str, Any] | None = None
        self._status: PoolStatus | None = None
        self._hopeless = False
        self._describe = "no word from the control process yet"

    # --- the control process's word ---------------------------------------------------------
    def attach(self, path: str, rows: int, cols: int) -> None:
        """Map the pool's in-flight table; this worker's row starts at zero (its predecessor's calls died with it)."""
        if self.table is not None:
            return
        self.table = InFlightTable(Path(path), rows, cols)
        if self.row < rows:
            self.table.clear_row(self.row)

    def apply(self, view: dict[str, Any]) -> None:
        """A new view of the pool (:meth:`VLLMPoolBackend.view`); applied now if started, else at start."""
        self._view = view
        self._hopeless = bool(view.get("hopeless"))
        self._describe = str(view.get("describe", ""))
        status = view.get("status")
        self._status = PoolStatus.from_json(status) if isinstance(status, dict) else None
        if self._transport is not None:
            self._sync(view)

    def _sync(self, view: dict[str, Any]) -> None:
        eps = self.dispatcher.endpoints
        known = {ep.index: ep for ep in eps}
        loads = {w.index: w for w in self._status.workers} if self._status is not None else {}
        became_available = False
        listed: set[int] = set()
        for item in view.get("endpoints", []):
            index = int(item["index"])
            listed.add(index)
            ep = known.get(index)
            if ep is None:
                ep = known[index] = SharedEndpoint(
                    index, self.routing.affinity_entries, self.table, self.row, self.routing.kv_index_blocks
                )
                eps.append(ep)
                eps.sort(key=lambda e: e.index)
            url, generation = str(item["url"]), int(item["generation"])
            if ep.url != url or ep.generation != generation:
                # A new vLLM process behind the slot: cold cache, a fresh adapter.
                ep.url, ep.generation, ep.adapter = url, generation, None
                ep.prefixes.clear()
                ep.decided.clear()
                if generation > 0 and url:
                    ep.adapter = self._adapter(url, item.get("version"))
            if isinstance(ep.adapter, VLLMBackend):  # max_model_len and root: what the control process read
                ep.adapter.learn_models(item.get("models"))
            was = ep.available
            ep.available = bool(item["available"]) and ep.adapter is not None
            became_available = became_available or (ep.available and not was)
            events = item.get("events")
            ep.events = events if isinstance(events, str) else None
            w = loads.get(index)
            if w is not None:
                ep.load = worker_load(w)
        for ep in eps:
            if ep.index not in listed:  # gone (a discovered server that left)
                ep.available = False
        self.signals.sync()
        if became_available or self._hopeless:
            self.dispatcher.notify()

    def _server_config(self, url: str, version: str | None) -> VLLMBackendConfig:
        raise NotImplementedError

    def _signals(self, config: Any) -> EngineSignals:
        raise NotImplementedError

    def _make_transport(self) -> HTTPTransport:
        raise NotImplementedError

    def _adapter(self, url: str, version: object) -> VLLMBackend:
        assert self._transport is not None
        known = version if isinstance(version, str) and version else None
        adapter = VLLMBackend(self._server_config(url, known), self._transport)
        # All workers run the same vLLM: the pool's tables are the adapter's (as in the pool).
        self.take_tables(adapter)
        return adapter

    def _failed(self, ep: Endpoint, exc: UpstreamError) -> None:
        if exc.reason not in ("connect", "closed") or not ep.available:
            return
        ep.available = False  # until the control process's next view says otherwise
        self.report_suspect(ep.index, ep.generation)

    # --- Backend ------------------------------------------------------------------------
    async def start(self) -> None:
        self._transport = self._make_transport()
        if self._view is not None:
            self._sync(self._view)

    async def close(self) -> None:
        self.dispatcher.close()
        await self.dispatcher.drained(self.stop_timeout)
        await self.signals.close()
        if self._transport is not None:
            await self._transport.close()
        if self.table is not None and self.row < self.table.rows:
            # Calls past the drain (if any) still write their cell; the mapping goes with the process.
            self.table.clear_row(self.row)

    def pool_status(self) -> PoolStatus:
        """The control process's status, with this worker's own calls in flight and routing decisions."""
        mine = {ep.index: ep for ep in self.dispatcher.endpoints}
        status = self._status or PoolStatus(backend=self.name, kind=self.kind, workers=[])
        for w in status.workers:
            ep = mine.get(w.index)
            w.in_flight_by = []
            if ep is None:
                w.in_flight = 0
                continue
            # This worker's own view: its calls, its reading of the queue, its KV index, its decisions.
            w.in_flight, w.queue, w.decided = ep.in_flight, ep.queue(), dict(ep.decided)
            w.prefix_blocks, w.kv_events, w.kv_event_gaps = len(ep.blocks), ep.blocks.events, ep.blocks.gaps
        return PoolStatus(
            backend=self.name,
            kind=self.kind,
            workers=status.workers,
            decisions=dict(self.dispatcher.balancer.decisions),
            gateway_pid=status.gateway_pid,
            updated_at=status.updated_at,
            scoring=self.signals.describe(),
        )


@dataclass
class ClientReport:
    """What a gateway worker's client applied of a changed pool section (``backends.base.ReconfigureReport``)."""

    backend: str
    in_place: list[str]
    rolled: list[str]
    ok: bool = True

    def describe(self) -> str:
        return (
            f"pool {self.backend!r}: applied here: {', '.join(self.in_place) or '-'}; "
            f"new vLLM workers from the control process for: {', '.join(self.rolled) or '-'}"
        )


class VLLMPoolClient(SharedEndpointsClient):
    """A ``vllm-pool`` whose vLLM processes the control process runs.

    Reconfigurable (``backends.base``) on a worker's reload: the keys that matter here (routing,
    and the guards ``gateway.reload`` rebuilds) are taken in place; the vLLM processes of a
    changed section are the control process's to roll, and this client follows its views.
    """

    kind: ClassVar[str] = "vllm-pool"

    def __init__(self, config: VLLMPoolBackendConfig, *, row: int) -> None:
        super().__init__(config, row=row)
        self.endpoints = pool_endpoints(config)  # as the pool's (a pooling model: embeddings, rerank)
        self.config = config
        self.stop_timeout = config.stop_timeout

    def runs(self, config: object) -> bool:
        return config == self.config

    def restart_keys(self, config: object) -> list[tuple[str, str]] | None:
        if not isinstance(config, VLLMPoolBackendConfig) or config.name != self.name:
            return None
        return restart_keys(self.config, config)

    async def reconfigure(self, config: object) -> ClientReport:
        if not isinstance(config, VLLMPoolBackendConfig) or config.name != self.name:
            raise TypeError(f"pool {self.name!r} cannot take {config!r}")
        in_place, rolled = split_changes(self.config, config)
        apply_routing(self.dispatcher, config)
        if config.routing != self.routing:
            await self.signals.close()
            self.signals = pool_signals(config, self.dispatcher)
        self.routing = config.routing
        # Adapters built from now on (the control process's new vLLM workers) take the new section.
        self.config, self.stop_timeout = config, config.stop_timeout
        return ClientReport(self.name, in_place, rolled)

    def _signals(self, config: Any) -> EngineSignals:
        return pool_signals(config, self.dispatcher)

    def _server_config(self, url: str, version: str | None) -> VLLMBackendConfig:
        return endpoint_config(self.config, url, version)

    def _make_transport(self) -> HTTPTransport:
        c = self.config
        # One keep-alive transport for all workers (pooled per host:port), as in the pool.
        template = endpoint_config(c, "http://127.0.0.1/v1")
        return make_transport(
            template.model_copy(update={"max_connections": c.max_connections * max(1, worker_count(c))})
        )


class VLLMEndpointsClient(SharedEndpointsClient):
    """A ``vllm`` backend over ``base_urls`` or ``discovery``, whose servers the control process finds and probes."""

    kind: ClassVar[str] = "vllm"

    def __init__(self, config: VLLMBackendConfig, *, row: int) -> None:
        super().__init__(config, row=row)
        self.config = config

    def _signals(self, config: Any) -> EngineSignals:
        return remote_signals(config, self.dispatcher)

    def _server_config(self, url: str, version: str | None) -> VLLMBackendConfig:
        return server_config(self.config, url, version)

    def _make_transport(self) -> HTTPTransport:
        return make_transport(self.config)

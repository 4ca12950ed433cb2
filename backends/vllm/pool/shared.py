"""Backends shared by the N worker processes of ``gateway serve --workers N``: both ends.

Shared: every ``vllm-pool`` (its vLLM processes must exist once) and every ``vllm`` backend over
``base_urls`` or ``discovery`` (its DNS discovery, probes, scrapes and version detection need to
run once, not once per worker).

- :class:`PoolOwnership` (the control process): each is a full
  :class:`~backends.vllm.pool.pool.VLLMPoolBackend` (supervisor, launcher, probes, scrapes,
  version detection, ``status.json``) or :class:`~backends.vllm.routing.remote.VLLMEndpointsBackend`,
  plus its in-flight table (:mod:`backends.vllm.routing.inflight`); :meth:`PoolOwnership.frame` is
  what the workers are told after every change.
- :class:`PoolClients` (a gateway worker): one client (:mod:`backends.vllm.pool.client`) per
  shared backend, fed those frames.

The frames travel over the control channel (``gateway.workers.pools``); this module knows
nothing of it. Frame: ``{"pools": {name: VLLMPoolBackend.view()}, "tables": {name: {"path",
"rows", "cols"}}}``, JSON-friendly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from backends.errors import UpstreamConnectError
from backends.vllm.pool.client import SharedEndpointsClient, VLLMEndpointsClient, VLLMPoolClient
from backends.vllm.pool.pool import VLLMPoolBackend
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.inflight import InFlightTable
from backends.vllm.routing.remote import VLLMEndpointsBackend
from schemas.config import BackendConfig, VLLMBackendConfig, VLLMPoolBackendConfig

__all__ = ["PoolClients", "PoolOwnership", "SharedConfig", "shared_configs"]

SharedConfig = VLLMPoolBackendConfig | VLLMBackendConfig


def shared_configs(configs: list[BackendConfig]) -> list[SharedConfig]:
    """The backends the control process of ``--workers N`` runs once: pools and multi-server ``vllm``."""
    return [
        c
        for c in configs
        if isinstance(c, VLLMPoolBackendConfig) or (isinstance(c, VLLMBackendConfig) and c.base_url is None)
    ]


log = logging.getLogger("gateway.pool")


class PoolOwnership:
    """The shared backends the control process runs, each with a table of rows = gateway workers."""

    def __init__(self, configs: list[SharedConfig], workers: int, workdir: Path) -> None:
        self._configs = configs
        self._workers = workers
        self._workdir = workdir
        self.pools: dict[str, VLLMPoolBackend | VLLMEndpointsBackend] = {}
        self._tables: dict[str, InFlightTable] = {}

    def __bool__(self) -> bool:
        return bool(self._configs)

    async def start(self, on_change: Callable[[], None], synced: Callable[[], Awaitable[None]] | None = None) -> None:
        """Spawn the pools' vLLM processes, find the servers (readiness comes later); ``on_change``: each change.

        ``synced``: returns once every gateway worker has applied the current frame. A pool worker
        that a rollout retires stops only after that and once its column of the table reads zero
        (the gateway workers' calls, not this process's, are the ones to wait for).
        """
        for i, config in enumerate(self._configs):
            pool = (
                VLLMPoolBackend(config) if isinstance(config, VLLMPoolBackendConfig) else VLLMEndpointsBackend(config)
            )
            self.pools[config.name] = pool
            await pool.start()
            path = self._workdir / f"inflight-{i}"
            table = InFlightTable(path, self._workers, pool.table_columns(), create=True)
            self._tables[config.name] = pool.in_flight_table = table
            pool.listeners.append(on_change)
            if isinstance(pool, VLLMPoolBackend):
                pool.supervisor.in_flight_of = functools.partial(_gateway_in_flight, table)
                pool.supervisor.drain_barrier = synced
            else:
                pool.in_flight_of = functools.partial(_gateway_in_flight, table)

    async def close(self) -> None:
        """Stop every vLLM process; returns when none is left."""
        results = await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)
        for name, result in zip(self.pools, results, strict=True):
            if isinstance(result, BaseException):
                log.error("pool %s: closing failed: %r", name, result)

    def frame(self) -> dict[str, Any]:
        tables = {n: {"path": str(t.path), "rows": t.rows, "cols": t.cols} for n, t in self._tables.items()}
        return {"pools": {n: p.view() for n, p in self.pools.items()}, "tables": tables}

    def suspect(self, pool_name: object, index: object, generation: object) -> None:
        """A gateway worker could not connect to endpoint ``index``: probe it now (if it is still that process)."""
        pool = self.pools.get(str(pool_name))
        if pool is None:
            return
        endpoint = next((ep for ep in pool.dispatcher.endpoints if ep.index == index), None)
        if endpoint is not None and endpoint.generation == generation:
            pool.suspect(endpoint, UpstreamConnectError("a gateway worker could not connect"))


def _gateway_in_flight(table: InFlightTable, endpoint: Endpoint) -> int:
    """Every gateway worker's calls in flight to ``endpoint``; an endpoint past the table's
    columns (the pool grew in a rollout) is not counted there: taken as busy, so its retirement
    waits its full ``stop_timeout`` rather than stopping a server that may still answer."""
    return table.column(endpoint.index) if endpoint.index < table.cols else 1


class PoolClients:
    """A gateway worker's shared backends, fed the control process's frames."""

    def __init__(self, configs: list[SharedConfig], row: int) -> None:
        self.clients: dict[str, SharedEndpointsClient] = {
            c.name: VLLMPoolClient(c, row=row)
            if isinstance(c, VLLMPoolBackendConfig)
            else VLLMEndpointsClient(c, row=row)
            for c in configs
        }

    def __bool__(self) -> bool:
        return bool(self.clients)

    def on_suspect(self, report: Callable[[str, int, int], None]) -> None:
        """``report(pool, index, generation)`` when a call could not connect to an endpoint."""
        for name, client in self.clients.items():
            client.report_suspect = functools.partial(report, name)

    def apply(self, frame: dict[str, Any]) -> None:
        tables = frame.get("tables", {})
        for name, view in frame.get("pools", {}).items():
            client = self.clients.get(name)
            if client is None:
                continue
            table = tables.get(name)
            if isinstance(table, dict):
                client.attach(str(table["path"]), int(table["rows"]), int(table["cols"]))
            client.apply(view)

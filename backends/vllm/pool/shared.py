"""A ``vllm-pool`` shared by the N worker processes of ``gateway serve --workers N``: both ends.

- :class:`PoolOwnership` (the control process): each pool is a full
  :class:`~backends.vllm.pool.pool.VLLMPoolBackend` (supervisor, launcher, probes, scrapes,
  version detection, ``status.json``) plus its in-flight table (:mod:`backends.vllm.pool.inflight`);
  :meth:`PoolOwnership.frame` is what the workers are told after every change.
- :class:`PoolClients` (a gateway worker): one :class:`~backends.vllm.pool.client.VLLMPoolClient`
  per pool, fed those frames.

The frames travel over the control channel (``gateway.workers.pools``); this module knows
nothing of it. Frame: ``{"pools": {name: VLLMPoolBackend.view()}, "tables": {name: {"path",
"rows", "cols"}}}``, JSON-friendly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.errors import UpstreamConnectError
from backends.vllm.pool.client import VLLMPoolClient
from backends.vllm.pool.inflight import InFlightTable
from backends.vllm.pool.pool import VLLMPoolBackend
from schemas.config import VLLMPoolBackendConfig

__all__ = ["PoolClients", "PoolOwnership"]

log = logging.getLogger("gateway.pool")


class PoolOwnership:
    """The pools the control process runs, with a table of rows = gateway workers."""

    def __init__(self, configs: list[VLLMPoolBackendConfig], workers: int, workdir: Path) -> None:
        self._configs = configs
        self._workers = workers
        self._workdir = workdir
        self.pools: dict[str, VLLMPoolBackend] = {}
        self._tables: dict[str, InFlightTable] = {}

    def __bool__(self) -> bool:
        return bool(self._configs)

    async def start(self, on_change: Callable[[], None]) -> None:
        """Plan and spawn every pool's vLLM processes (readiness comes later); ``on_change`` after each change."""
        for i, config in enumerate(self._configs):
            pool = VLLMPoolBackend(config)
            self.pools[config.name] = pool
            await pool.start()
            path = self._workdir / f"inflight-{i}"
            table = InFlightTable(path, self._workers, len(pool.supervisor.workers), create=True)
            self._tables[config.name] = pool.in_flight_table = table
            pool.listeners.append(on_change)

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
        if pool is None or not isinstance(index, int) or not 0 <= index < len(pool.dispatcher.endpoints):
            return
        endpoint = pool.dispatcher.endpoints[index]
        if endpoint.generation == generation:
            pool.supervisor.suspect(endpoint, UpstreamConnectError("a gateway worker could not connect"))


class PoolClients:
    """A gateway worker's pool backends, fed the control process's frames."""

    def __init__(self, configs: list[VLLMPoolBackendConfig], row: int) -> None:
        self.clients = {c.name: VLLMPoolClient(c, row=row) for c in configs}

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

"""The ``vllm-pool`` backend: vLLM workers this gateway starts, supervises and routes across.

Lifecycle: ``start()`` plans the workers (GPU sets from ``gpus`` and
``tensor_parallel_size``), spawns them and returns without waiting for readiness
(a real vLLM takes minutes); requests wait for a ready worker up to
``routing.wait_for_ready`` seconds, then get 503 with ``Retry-After``. ``reconfigure(config)``
applies a changed section while the pool serves (``backends.vllm.pool.rollout``). ``close()``
stops routing, waits up to ``stop_timeout`` for calls in flight (the gateway drained
its clients before), then stops every worker (SIGTERM, SIGKILL) and returns once
none of their processes is alive.

Each worker is a vLLM OpenAI server, so requests reuse the ``vllm`` adapter
(:class:`backends.vllm.adapter.VLLMBackend`) per worker over one shared transport; the pool
adds only the choice of worker (``backends.vllm.routing.balancer``) and retries across
workers (``backends.vllm.routing.dispatch``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from backends.base import Backend
from backends.capabilities import Capabilities
from backends.errors import UpstreamError
from backends.transport import make_transport
from backends.transport.base import HTTPTransport
from backends.vllm.adapter import VLLMBackend
from backends.vllm.capabilities import VLLM_CAPABILITIES
from backends.vllm.pool.rollout import RolloutReport, apply_routing, restart_keys, roll, split_changes
from backends.vllm.pool.supervisor import Supervisor
from backends.vllm.pool.worker import KV_TOPIC, hash_seed
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.dispatch import DispatchedBackend, Dispatcher
from backends.vllm.routing.inflight import InFlightTable
from backends.vllm.routing.signals import EngineSignals
from backends.vllm.routing.status import PoolStatus, default_log_dir, endpoints_view, fill_in_flight, write_status
from schemas.config import VLLMBackendConfig, VLLMPoolBackendConfig
from schemas.endpoints import POOLING_ENDPOINTS, TOKENIZER_ENDPOINTS
from schemas.endpoints import Endpoint as EndpointKind

__all__ = ["VLLMPoolBackend", "endpoint_config", "pool_endpoints", "pool_log_dir", "pool_signals", "worker_count"]

log = logging.getLogger("gateway.pool")

_STATUS_EVERY = 1.0  # seconds: the status file is rewritten at most this often (plus on state changes)


def pool_log_dir(config: VLLMPoolBackendConfig) -> Path:
    return Path(config.log_dir) if config.log_dir else default_log_dir(config.name)


class VLLMPoolBackend(DispatchedBackend):
    kind: ClassVar[str] = "vllm-pool"
    default_capabilities: ClassVar[Capabilities] = VLLM_CAPABILITIES

    def __init__(self, config: VLLMPoolBackendConfig) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        # Until a worker has told its version: the table that cannot fail open.
        self.unknown_tables(config.tool_parser)
        self.endpoints = pool_endpoints(config)
        self.config = config
        self.log_dir = pool_log_dir(config)
        self.status_path = self.log_dir / "status.json"
        self.dispatcher = Dispatcher(
            config.name,
            config.routing,
            on_failure=lambda ep, exc: self.supervisor.suspect(ep, exc),
            hopeless=lambda: self.supervisor.hopeless(),
            describe=lambda: self.supervisor.describe(),
        )
        self.supervisor = Supervisor(
            config,
            self.log_dir,
            self.dispatcher.endpoints,
            self._make_adapter,
            on_change=self._status_changed,
            on_available=self.dispatcher.notify,
        )
        self.signals = pool_signals(config, self.dispatcher)
        self._transport: HTTPTransport | None = None
        self._status_written = 0.0
        self._last_states: tuple[str, ...] = ()
        # With ``--workers N`` the control process owns the pool: it is told of every change
        # (to publish the endpoints to the gateway workers) and reads their calls in flight here.
        self.listeners: list[Callable[[], None]] = []
        self.in_flight_table: InFlightTable | None = None
        self._rollout_lock = asyncio.Lock()
        self.last_rollout: RolloutReport | None = None
        self.rollouts = dict.fromkeys(("in_place", "rolled", "failed"), 0)  # by outcome
        # The last rollout stopped part way: workers may run two configs until one is rolled out.
        self._incomplete = False

    async def _make_adapter(self, url: str, config: VLLMPoolBackendConfig) -> Backend:
        """The ``vllm`` adapter of a worker (running ``config``) that just became ready, started
        (it reads the version).

        All workers run the same vLLM (a rollout: the newest), so the pool takes the
        capabilities the adapter found.
        """
        assert self._transport is not None, "start() first"
        adapter = VLLMBackend(endpoint_config(config, url), self._transport)
        try:
            await adapter.start()
        except Exception:  # the adapter falls back to its safe defaults; routing must go on
            log.exception("pool %s: starting the adapter for %s failed", self.name, url)
        self.take_tables(adapter)
        return adapter

    # --- Backend -------------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        # One keep-alive transport for all workers (pooled per host:port).
        limit = c.max_connections * max(1, worker_count(c))
        template = endpoint_config(c, "http://127.0.0.1/v1")
        self._transport = make_transport(template.model_copy(update={"max_connections": limit}))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await self.supervisor.start()
        log.info(
            "pool %s: %d worker(s) of %r starting; logs and status in %s",
            c.name,
            len(self.supervisor.workers),
            c.model,
            self.log_dir,
        )
        self._write_status()

    async def close(self) -> None:
        self.dispatcher.close()
        await self.dispatcher.drained(self.config.stop_timeout)
        await self.signals.close()
        await self.supervisor.close()
        if self._transport is not None:
            await self._transport.close()
        self._write_status()

    # --- Reconfigurable (backends.base) --------------------------------------------------
    def runs(self, config: object) -> bool:
        return config == self.config and not self._incomplete

    def restart_keys(self, config: object) -> list[tuple[str, str]] | None:
        if not isinstance(config, VLLMPoolBackendConfig) or config.name != self.name:
            return None
        return restart_keys(self.config, config)

    async def reconfigure(self, config: object) -> RolloutReport:
        """Apply ``config`` (same name) while serving: in place where no process must change,
        else by replacing the workers one at a time (``backends.vllm.pool.rollout``).

        Refused (nothing applied) when a key only a restart applies changed. A failed rollout
        leaves ``self.config`` as it was and the next call rolls whatever it is given over
        every worker not on it yet: the same config resumes, the old one goes back.
        Safe to call from the gateway's reload and from a control process; one at a time.
        """
        if not isinstance(config, VLLMPoolBackendConfig) or config.name != self.name:
            raise TypeError(f"pool {self.name!r} cannot take {config!r}")
        async with self._rollout_lock:
            old = self.config
            report = RolloutReport(self.name, "unchanged")
            refused = restart_keys(old, config)
            if refused:
                report.outcome = "refused"
                report.error = "; ".join(f"{key} changed: {why}; restart the gateway" for key, why in refused)
                return report
            report.in_place, report.rolled = split_changes(old, config)
            roll_all = bool(report.rolled) or self._incomplete
            if report.in_place or roll_all:
                self.log_dir = pool_log_dir(config)
                self.log_dir.mkdir(parents=True, exist_ok=True)
                self.status_path = self.log_dir / "status.json"
                self.supervisor.set_config(config, self.log_dir)
                apply_routing(self.dispatcher, config)
                if "routing" in report.in_place:  # a new tokenizer, events on or off (for workers started from now on)
                    await self.signals.close()
                    self.signals = pool_signals(config, self.dispatcher)
                report.outcome = "in_place"
            if roll_all:
                report.outcome = "rolled"
                what = ", ".join(report.rolled) or "the workers an earlier rollout did not reach"
                log.info("pool %s: rolling out %s, one worker at a time", self.name, what)
                report.started, report.retired, report.error = await roll(self.supervisor, config)
                if report.error is not None:
                    report.outcome = "failed"
                    log.error("pool %s: rollout stopped: %s; the other workers keep serving", self.name, report.error)
            if report.outcome != "failed":
                self.config = config
            self._incomplete = report.outcome == "failed"
            if report.outcome != "unchanged":
                self.rollouts[report.outcome] += 1
                self.last_rollout = report
            report.finished_at = time.time()
            self._write_status()
            return report

    # --- status ---------------------------------------------------------------------------
    def pool_status(self) -> PoolStatus:
        workers = [w.status() for w in self.supervisor.workers]
        table = self.in_flight_table
        if table is not None:  # the gateway workers route; this process only supervises
            fill_in_flight(workers, table.cells, table.rows, table.cols)
        return PoolStatus(
            backend=self.name,
            kind=self.kind,
            workers=workers,
            decisions=dict(self.dispatcher.balancer.decisions),
            rollouts=dict(self.rollouts),
            rollout=self.last_rollout.to_json() if self.last_rollout is not None else None,
            scoring=self.signals.describe(),
        )

    # --- shared by the gateway workers of --workers N (backends.vllm.pool.shared) ---------------
    def view(self) -> dict[str, Any]:
        s = self.supervisor
        eps = self.dispatcher.endpoints
        return endpoints_view(self.pool_status(), eps, hopeless=s.hopeless(), describe=s.describe())

    def table_columns(self) -> int:
        # One more than the workers: a rollout runs a new worker next to the one it replaces.
        return len(self.supervisor.workers) + 1

    def suspect(self, endpoint: Endpoint, exc: UpstreamError) -> None:
        self.supervisor.suspect(endpoint, exc)

    def _status_changed(self) -> None:
        self.signals.sync()
        for listener in self.listeners:
            listener()
        states = tuple(w.state for w in self.supervisor.workers)
        if states != self._last_states or time.monotonic() - self._status_written >= _STATUS_EVERY:
            self._last_states = states
            self._write_status()

    def _write_status(self) -> None:
        self._status_written = time.monotonic()
        try:
            write_status(self.status_path, self.pool_status())
        except OSError as exc:  # a full disk must not take the pool down
            log.warning("pool %s: cannot write %s: %s", self.name, self.status_path, exc)


def pool_signals(config: VLLMPoolBackendConfig, dispatcher: Dispatcher) -> EngineSignals:
    """The pool's tokenizer (``routing.tokenizer``, else the workers' ``--tokenizer``, else the model
    they serve) and its workers' KV events."""
    return EngineSignals(
        config.name,
        dispatcher,
        tokenizer=config.routing.tokenizer or config.vllm_arg("--tokenizer") or config.model,
        seed=hash_seed(config),
        topic=KV_TOPIC,
        address=lambda ep: ep.events,
    )


def pool_endpoints(config: VLLMPoolBackendConfig) -> frozenset[EndpointKind]:
    """What a pool serves: workers running a pooling model (``config.pooling``) serve embeddings,
    rerank and the tokenizer only; the others everything a vLLM server serves."""
    if config.pooling:
        return POOLING_ENDPOINTS | TOKENIZER_ENDPOINTS
    return DispatchedBackend.endpoints


def endpoint_config(c: VLLMPoolBackendConfig, url: str, version: str | None = None) -> VLLMBackendConfig:
    """The ``vllm`` adapter config of one pool worker at ``url`` (``version``: known already, not read again)."""
    return VLLMBackendConfig(
        name=c.name,
        type="vllm",
        base_url=url,
        capabilities=c.capabilities,
        timeout=c.timeout,
        max_connections=c.max_connections,
        transport=c.transport,
        stream_usage=c.stream_usage,
        tool_parser=c.tool_parser,
        version=version,
    )


def worker_count(config: VLLMPoolBackendConfig) -> int:
    if config.workers:
        return config.workers
    if isinstance(config.gpus, list):
        return max(1, len(config.gpus) // config.tensor_parallel_size)
    if isinstance(config.gpus, int):
        return config.gpus // config.tensor_parallel_size
    return 8  # gpus: all: not known before start

"""Supervising a pool's worker processes: spawn, readiness, health, restart, stop.

One :class:`Worker` per slot, each with a fixed GPU set and one asyncio task that runs
its life cycle::

    starting --(/health 200 and /v1/models lists the model)--> ready
    starting --(exit, or no readiness within startup_timeout)--> [stop] --> backoff | failed
    ready <--(probe fails / passes)--> unhealthy --(probe.failures in a row)--> [stop] --> backoff | failed
    ready | unhealthy --(process exited)--> [stop leftovers] --> backoff | failed
    backoff --(backoff_initial * 2**(failures-1), at most backoff_max)--> starting
    any --(close)--> stopping --> stopped
    any --(retire)--> stopping --(calls in flight done, stop_timeout at most)--> [stop] --> stopped

``[stop]`` is :func:`backends.vllm.pool.process.stop`: SIGTERM to the worker's process
group, SIGKILL after ``stop_timeout``, and it returns only once no process of the group
is alive. Only then are the worker's port and GPUs released (:class:`GpuLedger`), so a
GPU is never handed to a new process while an old one may still hold its memory.
``restart.max_failures`` failures in a row mark the worker ``failed``: it stays stopped
and is reported (state, last exit, the last lines of its log), never restarted forever.

Routing sees a worker through its :class:`~backends.vllm.routing.balancer.Endpoint`:
``available`` only while ``ready``; every new ready spell bumps its ``generation`` and
clears its prefix LRU (a restarted worker has a cold cache). ``poke`` asks for a probe
now (a request could not connect). :meth:`Supervisor.add_worker` and
:meth:`Supervisor.retire` let a rollout (``backends.vllm.pool.rollout``) change the set of
workers while the others serve. Everything runs on one event loop; not thread-safe.
The HTTP calls to a worker (readiness, health, ``/metrics``) are :mod:`backends.vllm.pool.probe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.base import Backend
from backends.errors import UpstreamError
from backends.transport.base import HTTPTransport
from backends.vllm.pool.probe import control_transport, ready, worker_get
from backends.vllm.pool.process import WorkerProcess, foreign_listener, spawn, stop, tail
from backends.vllm.pool.resources import GpuLedger, PortAllocator, detect_gpus, plan_gpus
from backends.vllm.pool.worker import Worker, client_host, describe_outcome, events_address
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.scrape import WorkerLoad, parse_vllm_metrics
from schemas.config import VLLMPoolBackendConfig

__all__ = ["Supervisor", "Worker"]

log = logging.getLogger("gateway.pool")

# A worker's base URL (.../v1) and the config it runs -> its started HTTP adapter (the vllm
# adapter reads the version).
AdapterFactory = Callable[[str, VLLMPoolBackendConfig], Awaitable[Backend]]

# Seconds between looks at a retiring worker's calls in flight while they finish.
_DRAIN_POLL = 0.02


class Supervisor:
    def __init__(
        self,
        config: VLLMPoolBackendConfig,
        log_dir: Path,
        endpoints: list[Endpoint],
        make_adapter: AdapterFactory,
        *,
        on_change: Callable[[], None],
        on_available: Callable[[], None],
    ) -> None:
        self.config = config
        self.log_dir = log_dir
        self._endpoints = endpoints
        self._make_adapter = make_adapter
        self._on_change = on_change
        self._on_available = on_available
        self.workers: list[Worker] = []
        self.gpus = GpuLedger()
        lo, hi = config.port_range
        self.ports = PortAllocator(lo, hi, config.host)
        self._control: HTTPTransport = control_transport(config)
        self._old_controls: list[HTTPTransport] = []  # replaced by a reload; closed with the pool
        self._closing = False
        self._scraper: asyncio.Task[None] | None = None
        self._generations = 0  # ready spells of all workers: (index, generation) names one process
        self._changed = asyncio.Event()  # replaced on each state change (see wait_change)
        # Where a retiring worker's calls in flight are counted. With ``--workers N`` the gateway
        # workers make the calls, not this process: the control process sets both hooks
        # (backends.vllm.pool.shared) so that a worker stops only once every gateway worker has
        # seen it leave routing (``drain_barrier``) and its column of the shared table is zero.
        self.in_flight_of: Callable[[Endpoint], int] = lambda ep: ep.in_flight
        self.drain_barrier: Callable[[], Awaitable[None]] | None = None

    # --- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        available = await detect_gpus() if self.config.gpus == "all" else None
        plan = plan_gpus(self.config, available)
        self._endpoints.clear()
        for gpus in plan:
            self.add_worker(gpus, self.config)
        self._scraper = asyncio.create_task(self._scrape_loop(), name=f"pool {self.config.name} metrics")

    async def close(self) -> None:
        """Stop every worker (SIGTERM, SIGKILL after stop_timeout); returns when all exited."""
        self._closing = True
        for worker in self.workers:
            worker.poke.set()
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
        tasks = [w.task for w in self.workers if w.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for control in (*self._old_controls, self._control):
            await control.close()

    def set_config(self, config: VLLMPoolBackendConfig, log_dir: Path) -> None:
        """Timings, probes, ports and log directory from ``config`` from now on (a reload); running
        workers keep the config their processes were started with until a rollout replaces them."""
        old, self.config, self.log_dir = self.config, config, log_dir
        if config.probe.timeout != old.probe.timeout:
            # Probes in flight keep the old transport; it is closed with the pool.
            self._old_controls.append(self._control)
            self._control = control_transport(config)
        if (config.port_range, config.host) != (old.port_range, old.host):
            lo, hi = config.port_range
            ports = PortAllocator(lo, hi, config.host)
            ports.hold(w.port for w in self.workers if w.port is not None)
            self.ports = ports

    def add_worker(self, gpus: list[int], config: VLLMPoolBackendConfig) -> Worker:
        """A new worker on ``gpus`` running ``config``, its task started; routed to once ready."""
        # The smallest index no live worker has: a rollout's new worker gets one of its own while
        # the old one drains, and indexes stay below the most workers ever alive at once (the
        # --workers N in-flight table has a column per index).
        used = {w.index for w in self.workers}
        index = next(i for i in range(len(used) + 1) if i not in used)
        endpoint = Endpoint(index, config.routing.affinity_entries, index_blocks=config.routing.kv_index_blocks)
        worker = Worker(index, gpus, endpoint, self.log_dir / f"worker-{index}.log", config)
        self.workers.append(worker)
        self._endpoints.append(endpoint)
        worker.task = asyncio.create_task(self._run(worker), name=f"pool {config.name} worker {index}")
        return worker

    async def retire(self, worker: Worker) -> None:
        """Stop routing new calls to ``worker``, let its calls in flight finish (``stop_timeout`` at
        most), stop its processes and forget it. Returns once none of its processes is alive."""
        worker.retiring = True
        worker.endpoint.available = False  # from the next pick on; its task drains what it has
        worker.poke.set()
        if worker.task is not None:
            # wait(), not gather(): a cancelled caller must not cancel the task mid-stop (close() awaits it).
            await asyncio.wait({worker.task})
        if worker in self.workers:
            self.workers.remove(worker)
        if worker.endpoint in self._endpoints:
            self._endpoints.remove(worker.endpoint)
        self._on_change()

    async def wait_change(self, within: float) -> None:
        """Return at the next worker state change, or after ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), within)

    @property
    def closing(self) -> bool:
        return self._closing

    def hopeless(self) -> bool:
        """No worker is or can become ready."""
        return self._closing or all(w.state == "failed" for w in self.workers)

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for w in self.workers:
            counts[w.state] = counts.get(w.state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in counts.items()) or "no workers"

    def suspect(self, endpoint: Endpoint, exc: UpstreamError) -> None:
        """A request could not reach this worker: stop routing to it and probe it now."""
        if exc.reason not in ("connect", "closed"):
            return
        worker = next((w for w in self.workers if w.endpoint is endpoint), None)
        if worker is not None and worker.state == "ready" and not worker.retiring:
            self._set_state(worker, "unhealthy")
            worker.poke.set()

    # --- one worker ---------------------------------------------------------------------
    def _set_state(self, worker: Worker, state: str) -> None:
        if worker.state == state:
            return
        worker.state = state
        worker.transitions.append((time.monotonic(), state))
        self._changed.set()
        self._changed = asyncio.Event()
        ep = worker.endpoint
        was = ep.available
        ep.available = state == "ready" and not worker.retiring
        if state == "ready":
            worker.ready_at = worker.ready_at or time.time()
        elif state != "unhealthy":
            worker.ready_at = None
        if ep.available and not was:
            self._on_available()
        self._on_change()

    async def _run(self, worker: Worker) -> None:
        try:
            await self._life(worker)
        except Exception as exc:  # a bug or an exhausted port range: report it, leave nothing running
            log.exception("pool %s worker %d: supervision failed", self.config.name, worker.index)
            worker.last_error = f"supervision failed: {exc}"
            proc = worker.process
            if proc is not None and proc.returncode is None:
                await stop(proc, self.config.stop_timeout)
            if worker.port is not None:
                self.ports.release(worker.port)
            self.gpus.release(worker.gpus, worker.index)
            self._set_state(worker, "failed")
        finally:
            if worker.state != "failed":
                self._set_state(worker, "stopped")

    async def _life(self, worker: Worker) -> None:
        """Spawn, watch, stop and restart the worker until close or give-up."""
        while not self._closing and not worker.retiring:
            c = self.config  # timings as configured now (a reload may change them in place)
            self.gpus.acquire(worker.gpus, worker.index)
            port = self.ports.allocate()
            worker.port = port
            worker.endpoint.url = f"http://{client_host(worker.config.host)}:{port}/v1"
            worker.endpoint.events = events_address(worker.config, worker.index)
            header = f"{c.name} worker {worker.index} gpus={worker.gpus} port={port}"
            try:
                proc = await spawn(
                    worker.command(port), worker.environment(), worker.log_path, grace=c.stop_timeout, header=header
                )
            except OSError as exc:  # the launcher itself could not start: not worth retrying
                self.ports.release(port)
                self.gpus.release(worker.gpus, worker.index)
                worker.last_error = f"cannot start the launcher: {exc}"
                self._set_state(worker, "failed")
                log.error("pool %s worker %d: %s", c.name, worker.index, worker.last_error)
                return
            worker.process = proc
            worker.poke.clear()
            self._set_state(worker, "starting")
            log.info(
                "pool %s worker %d starting: pid %d, port %d, gpus %s",
                c.name,
                worker.index,
                proc.pid,
                port,
                worker.gpus or "-",
            )
            outcome = await self._watch(worker, proc)
            was_ready_for = time.time() - worker.ready_at if worker.ready_at is not None else 0.0
            self._set_state(worker, "stopping")
            if worker.retiring:  # replaced by a rollout: its calls in flight finish first
                await self._drained(worker, c.stop_timeout)
            await stop(proc, c.stop_timeout)
            # Only now is nothing of the old process alive: its port and GPUs are free again.
            self.ports.release(port)
            self.gpus.release(worker.gpus, worker.index)
            worker.last_exit = proc.returncode
            if self._closing or worker.retiring:
                break
            if was_ready_for >= c.restart.reset_after:
                worker.failures = 0
            worker.failures += 1
            worker.log_tail = tail(worker.log_path)
            worker.last_error = describe_outcome(outcome, proc.returncode, c, worker.last_error)
            if worker.failures >= c.restart.max_failures:
                self._set_state(worker, "failed")
                log.error(
                    "pool %s worker %d failed %d times in a row (%s); giving up. Last lines of %s:\n%s",
                    c.name,
                    worker.index,
                    worker.failures,
                    worker.last_error,
                    worker.log_path,
                    "\n".join(worker.log_tail),
                )
                return
            delay = min(c.restart.backoff_initial * 2 ** (worker.failures - 1), c.restart.backoff_max)
            self._set_state(worker, "backoff")
            log.warning(
                "pool %s worker %d: %s; restarting in %.3gs (failure %d of %d). Last lines of %s:\n%s",
                c.name,
                worker.index,
                worker.last_error,
                delay,
                worker.failures,
                c.restart.max_failures,
                worker.log_path,
                "\n".join(worker.log_tail),
            )
            with contextlib.suppress(TimeoutError):  # close() and retire() poke
                await asyncio.wait_for(worker.poke.wait(), delay)
            worker.restarts += 0 if self._closing or worker.retiring else 1

    async def _drained(self, worker: Worker, within: float) -> None:
        """Wait until no call is in flight on the worker (it takes no new ones), ``within`` s at most."""
        deadline = time.monotonic() + within
        if self.drain_barrier is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drain_barrier(), within)
        # Polled: in_flight is a bare counter on the request path, which must not pay for an
        # event per call; this loop runs only while a rollout retires a worker.
        while self.in_flight_of(worker.endpoint) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_DRAIN_POLL)

    async def _watch(self, worker: Worker, proc: WorkerProcess) -> str:
        """Run one process's life; returns why it ended: exited, startup_timeout, unhealthy, closing."""
        exited = asyncio.ensure_future(proc.wait())
        try:
            deadline = time.monotonic() + self.config.startup_timeout
            while True:
                if await self._sleep(worker, exited, self.config.probe.interval):
                    return "exited"
                if self._closing or worker.retiring:
                    return "closing"
                if await ready(self._control, worker) and self._answers_itself(worker, proc):
                    break
                if time.monotonic() >= deadline:
                    return "startup_timeout"
            self._became_ready(worker, await self._make_adapter(worker.endpoint.url, worker.config))
            failures = 0
            while True:
                if await self._sleep(worker, exited, self.config.probe.interval):
                    return "exited"
                if self._closing or worker.retiring:
                    return "closing"
                if await worker_get(self._control, worker, "/health") is not None:
                    failures = 0
                    if worker.state == "unhealthy":
                        self._set_state(worker, "ready")
                    continue
                failures += 1
                self._set_state(worker, "unhealthy")
                if failures >= self.config.probe.failures:
                    return "unhealthy"
        finally:
            exited.cancel()

    def _answers_itself(self, worker: Worker, proc: WorkerProcess) -> bool:
        """Whether the listener that answered on the worker's port is its own process's. Another
        program may take the port between the allocator's bind probe and the worker's own bind:
        the worker then fails to bind and exits (and gets another port on its restart), and the
        stranger's answers must not make it ready meanwhile."""
        if worker.port is None:
            return False
        stranger = foreign_listener(proc.pid, worker.port)
        if stranger is None:
            return True
        worker.last_error = f"port {worker.port} is answered by another process (pid {stranger}), not this worker"
        return False

    def _became_ready(self, worker: Worker, adapter: Backend) -> None:
        ep = worker.endpoint
        self._generations += 1
        ep.generation = self._generations
        ep.prefixes.clear()
        ep.load = WorkerLoad()
        ep.decided.clear()
        ep.adapter = adapter
        worker.ready_at = time.time()
        worker.last_error = None
        self._set_state(worker, "ready")
        log.info("pool %s worker %d ready at %s", self.config.name, worker.index, ep.url)

    async def _sleep(self, worker: Worker, exited: asyncio.Future[int], seconds: float) -> bool:
        """Wait ``seconds`` (or until poked); True when the process exited meanwhile."""
        poke = asyncio.ensure_future(worker.poke.wait())
        try:
            await asyncio.wait((exited, poke), timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            poke.cancel()
        worker.poke.clear()
        return exited.done()

    # --- load scraping -------------------------------------------------------------------
    async def _scrape_loop(self) -> None:
        while True:
            ready = [w for w in self.workers if w.state == "ready"]
            if ready:
                await asyncio.gather(*(self._scrape(w) for w in ready))
            self._on_change()
            await asyncio.sleep(self.config.routing.metrics_interval)

    async def _scrape(self, worker: Worker) -> None:
        ep = worker.endpoint
        generation = ep.generation
        body = await worker_get(self._control, worker, "/metrics")
        if ep.generation != generation:
            return
        if body is None:
            ep.load = ep.load.failed()  # routing falls back on the gateway's own count (score)
        else:
            ep.load = parse_vllm_metrics(body.decode("utf-8", "replace"), self.in_flight_of(ep))

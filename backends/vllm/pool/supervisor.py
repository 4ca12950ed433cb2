"""Supervising a pool's worker processes: spawn, readiness, health, restart, stop.

One :class:`Worker` per slot, each with a fixed GPU set and one asyncio task that runs
its life cycle::

    starting --(/health 200 and /v1/models lists the model)--> ready
    starting --(exit, or no readiness within startup_timeout)--> [stop] --> backoff | failed
    ready <--(probe fails / passes)--> unhealthy --(probe.failures in a row)--> [stop] --> backoff | failed
    ready | unhealthy --(process exited)--> [stop leftovers] --> backoff | failed
    backoff --(backoff_initial * 2**(failures-1), at most backoff_max)--> starting
    any --(close)--> stopping --> stopped

``[stop]`` is :func:`backends.vllm.pool.process.stop`: SIGTERM to the worker's process
group, SIGKILL after ``stop_timeout``, and it returns only once no process of the group
is alive. Only then are the worker's port and GPUs released (:class:`GpuLedger`), so a
GPU is never handed to a new process while an old one may still hold its memory.
``restart.max_failures`` failures in a row mark the worker ``failed``: it stays stopped
and is reported (state, last exit, the last lines of its log), never restarted forever.

Routing sees a worker through its :class:`~backends.vllm.pool.balancer.Endpoint`:
``available`` only while ``ready``; every new ready spell bumps its ``generation`` and
clears its prefix LRU (a restarted worker has a cold cache). ``poke`` asks for a probe
now (a request could not connect). Everything runs on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from backends.base import Backend
from backends.errors import UpstreamError
from backends.transport.base import HTTPTransport, get_ok
from backends.transport.httptools_client import FastHTTPTransport
from backends.vllm.pool.balancer import Endpoint
from backends.vllm.pool.process import WorkerProcess, spawn, stop, tail
from backends.vllm.pool.resources import GpuLedger, PortAllocator, detect_gpus, plan_gpus
from backends.vllm.pool.scrape import WorkerLoad, parse_vllm_metrics
from backends.vllm.pool.status import WorkerStatus
from schemas.config import TimeoutConfig, VLLMPoolBackendConfig

__all__ = ["Supervisor", "Worker"]

log = logging.getLogger("gateway.pool")

# A worker's base URL (.../v1) -> its started HTTP adapter (the vllm adapter reads the version).
AdapterFactory = Callable[[str], Awaitable[Backend]]


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# --- workers ------------------------------------------------------------------------------


class Worker:
    """One slot of the pool: a fixed GPU set, and whichever process currently fills it."""

    def __init__(self, index: int, gpus: list[int], endpoint: Endpoint, log_path: Path) -> None:
        self.index = index
        self.gpus = gpus
        self.endpoint = endpoint
        self.log_path = log_path
        self.state = "starting"  # its task spawns the first process right away
        self.process: WorkerProcess | None = None
        self.port: int | None = None
        self.ready_at: float | None = None
        self.restarts = 0
        self.failures = 0
        self.last_exit: int | None = None
        self.last_error: str | None = None
        self.log_tail: list[str] = []
        self.poke = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # Recent (monotonic time, state) changes, for logs and tests.
        self.transitions: deque[tuple[float, str]] = deque(maxlen=64)

    def status(self) -> WorkerStatus:
        ep = self.endpoint
        alive = self.process is not None and self.process.returncode is None
        return WorkerStatus(
            index=self.index,
            state=self.state,
            url=ep.url,
            gpus=list(self.gpus),
            port=self.port,
            pid=self.process.pid if alive and self.process is not None else None,
            uptime=time.time() - self.ready_at if self.ready_at is not None and self.state == "ready" else None,
            restarts=self.restarts,
            failures=self.failures,
            in_flight=ep.in_flight,
            waiting=ep.load.waiting,
            running=ep.load.running,
            kv_cache_usage=ep.load.kv_cache_usage,
            last_exit=self.last_exit,
            last_error=self.last_error,
            log_tail=list(self.log_tail),
            log_path=str(self.log_path),
        )


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
        probe = config.probe
        t = probe.timeout
        # Probes and scrapes get their own short timeouts, apart from the completion traffic.
        self._control: HTTPTransport = FastHTTPTransport(
            config.name, TimeoutConfig(connect=t, first_byte=t, total=t, stream_idle=t), 64
        )
        self._closing = False
        self._closed = asyncio.Event()
        self._scraper: asyncio.Task[None] | None = None

    # --- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        available = await detect_gpus() if self.config.gpus == "all" else None
        plan = plan_gpus(self.config, available)
        self._endpoints.clear()
        for index, gpus in enumerate(plan):
            endpoint = Endpoint(index, self.config.routing.affinity_entries)
            self._endpoints.append(endpoint)
            log_path = self.log_dir / f"worker-{index}.log"
            self.workers.append(Worker(index, gpus, endpoint, log_path))
        for worker in self.workers:
            worker.task = asyncio.create_task(self._run(worker), name=f"pool {self.config.name} worker {worker.index}")
        self._scraper = asyncio.create_task(self._scrape_loop(), name=f"pool {self.config.name} metrics")

    async def close(self) -> None:
        """Stop every worker (SIGTERM, SIGKILL after stop_timeout); returns when all exited."""
        self._closing = True
        self._closed.set()
        for worker in self.workers:
            worker.poke.set()
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
        tasks = [w.task for w in self.workers if w.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._control.close()

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
        if exc.reason not in ("connect", "closed") or endpoint.index >= len(self.workers):
            return
        worker = self.workers[endpoint.index]
        if worker.state == "ready" and endpoint.generation == worker.endpoint.generation:
            self._set_state(worker, "unhealthy")
            worker.poke.set()

    # --- one worker ---------------------------------------------------------------------
    def _set_state(self, worker: Worker, state: str) -> None:
        if worker.state == state:
            return
        worker.state = state
        worker.transitions.append((time.monotonic(), state))
        ep = worker.endpoint
        was = ep.available
        ep.available = state == "ready"
        if state == "ready":
            worker.ready_at = worker.ready_at or time.time()
        elif state != "unhealthy":
            worker.ready_at = None
        if ep.available and not was:
            self._on_available()
        self._on_change()

    def _command(self, port: int) -> list[str]:
        c = self.config
        cmd = [*c.command, c.model, "--host", c.host, "--port", str(port)]
        cmd += ["--tensor-parallel-size", str(c.tensor_parallel_size)]
        if c.served_model_name:
            cmd += ["--served-model-name", c.served_model_name]
        return cmd + list(c.vllm_args)

    def _env(self, worker: Worker) -> dict[str, str]:
        env = {**os.environ, **self.config.env}
        if worker.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, worker.gpus))
        return env

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
        c = self.config
        while not self._closing:
            self.gpus.acquire(worker.gpus, worker.index)
            port = self.ports.allocate()
            worker.port = port
            worker.endpoint.url = f"http://{_client_host(c.host)}:{port}/v1"
            header = f"{c.name} worker {worker.index} gpus={worker.gpus} port={port}"
            try:
                proc = await spawn(
                    self._command(port), self._env(worker), worker.log_path, grace=c.stop_timeout, header=header
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
            await stop(proc, c.stop_timeout)
            # Only now is nothing of the old process alive: its port and GPUs are free again.
            self.ports.release(port)
            self.gpus.release(worker.gpus, worker.index)
            worker.last_exit = proc.returncode
            if self._closing:
                break
            if was_ready_for >= c.restart.reset_after:
                worker.failures = 0
            worker.failures += 1
            worker.log_tail = tail(worker.log_path)
            worker.last_error = _describe_outcome(outcome, proc.returncode, c, worker.last_error)
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), delay)
            worker.restarts += 0 if self._closing else 1

    async def _watch(self, worker: Worker, proc: WorkerProcess) -> str:
        """Run one process's life; returns why it ended: exited, startup_timeout, unhealthy, closing."""
        c = self.config
        exited = asyncio.ensure_future(proc.wait())
        try:
            deadline = time.monotonic() + c.startup_timeout
            while True:
                if await self._sleep(worker, exited, c.probe.interval):
                    return "exited"
                if self._closing:
                    return "closing"
                if await self._ready_probe(worker):
                    break
                if time.monotonic() >= deadline:
                    return "startup_timeout"
            self._became_ready(worker, await self._make_adapter(worker.endpoint.url))
            failures = 0
            while True:
                if await self._sleep(worker, exited, c.probe.interval):
                    return "exited"
                if self._closing:
                    return "closing"
                if await self._get(worker, "/health") is not None:
                    failures = 0
                    if worker.state == "unhealthy":
                        self._set_state(worker, "ready")
                    continue
                failures += 1
                self._set_state(worker, "unhealthy")
                if failures >= c.probe.failures:
                    return "unhealthy"
        finally:
            exited.cancel()

    def _became_ready(self, worker: Worker, adapter: Backend) -> None:
        ep = worker.endpoint
        ep.generation += 1
        ep.prefixes.clear()
        ep.load = WorkerLoad()
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

    async def _ready_probe(self, worker: Worker) -> bool:
        if await self._get(worker, "/health") is None:
            return False
        body = await self._get(worker, "/v1/models")
        if body is None:
            return False
        try:
            data = orjson.loads(body)
            ids = {m.get("id") for m in data.get("data", []) if isinstance(m, dict)}
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return False
        if self.config.served_name in ids:
            return True
        worker.last_error = f"/v1/models does not list {self.config.served_name!r} (lists {sorted(map(str, ids))})"
        return False

    async def _get(self, worker: Worker, path: str) -> bytes | None:
        """GET a path at the worker's root; the body on 200, else None."""
        if worker.port is None:
            return None
        return await get_ok(self._control, f"http://{_client_host(self.config.host)}:{worker.port}{path}")

    # --- load scraping -------------------------------------------------------------------
    async def _scrape_loop(self) -> None:
        interval = self.config.routing.metrics_interval
        while True:
            ready = [w for w in self.workers if w.state == "ready"]
            if ready:
                await asyncio.gather(*(self._scrape(w) for w in ready))
            self._on_change()
            await asyncio.sleep(interval)

    async def _scrape(self, worker: Worker) -> None:
        generation = worker.endpoint.generation
        body = await self._get(worker, "/metrics")
        if body is not None and worker.endpoint.generation == generation:
            worker.endpoint.load = parse_vllm_metrics(body.decode("utf-8", "replace"))


def _describe_outcome(outcome: str, code: int | None, config: VLLMPoolBackendConfig, detail: str | None) -> str:
    if outcome == "startup_timeout":
        why = f": {detail}" if detail else ""
        return f"not ready within startup_timeout ({config.startup_timeout:g}s){why}"
    if outcome == "unhealthy":
        return f"failed {config.probe.failures} health probes in a row"
    if code is not None and code > 128:
        return f"exited (killed by signal {code - 128})"
    return f"exited with status {code}"

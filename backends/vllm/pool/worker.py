"""One slot of a pool as the supervisor tracks it: its GPU set, the config its processes are
started with, and whichever process currently fills it (``backends.vllm.pool.supervisor``
runs its life cycle; ``backends.vllm.pool.rollout`` replaces it with a worker of a new config).

A worker's ``index`` is unique among the live workers: a worker started by a rollout gets
one the worker it replaces does not have, and takes a freed one later (its log file
``worker-<index>.log`` then holds both processes' lines, each after its spawn header).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path

from backends.vllm.pool.process import WorkerProcess
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.status import WorkerStatus
from schemas.config import VLLMPoolBackendConfig

__all__ = ["Worker", "client_host", "describe_outcome"]


def client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class Worker:
    """One slot of the pool: a fixed GPU set and config, and whichever process currently fills it.

    ``config`` is the pool config its processes are started with (command, model, args, env,
    host); timings (probes, restarts, timeouts) come from the supervisor's current config.
    ``retiring``: a rollout replaces it; its task drains its calls in flight, stops its
    process and ends instead of restarting it.
    """

    def __init__(
        self, index: int, gpus: list[int], endpoint: Endpoint, log_path: Path, config: VLLMPoolBackendConfig
    ) -> None:
        self.index = index
        self.gpus = gpus
        self.endpoint = endpoint
        self.log_path = log_path
        self.config = config
        self.retiring = False
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


def describe_outcome(outcome: str, code: int | None, config: VLLMPoolBackendConfig, detail: str | None) -> str:
    if outcome == "startup_timeout":
        why = f": {detail}" if detail else ""
        return f"not ready within startup_timeout ({config.startup_timeout:g}s){why}"
    if outcome == "unhealthy":
        return f"failed {config.probe.failures} health probes in a row"
    if code is not None and code > 128:
        return f"exited (killed by signal {code - 128})"
    return f"exited with status {code}"

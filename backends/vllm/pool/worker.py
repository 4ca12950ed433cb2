"""One slot of a pool as the supervisor tracks it: its GPU set, the config its processes are
started with, and whichever process currently fills it (``backends.vllm.pool.supervisor``
runs its life cycle; ``backends.vllm.pool.rollout`` replaces it with a worker of a new config).

A worker's ``index`` is unique among the live workers: a worker started by a rollout gets
one the worker it replaces does not have, and takes a freed one later (its log file
``worker-<index>.log`` then holds both processes' lines, each after its spawn header).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections import deque
from hashlib import blake2b
from pathlib import Path

from backends.vllm.pool.process import WorkerProcess
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.kv_events import missing_libraries
from backends.vllm.routing.status import WorkerStatus, endpoint_fields
from schemas.config import VLLMPoolBackendConfig

__all__ = ["KV_TOPIC", "Worker", "client_host", "describe_outcome", "events_address", "hash_seed"]

KV_TOPIC = "kv"  # the topic of the KV events the pool's workers publish


def events_address(config: VLLMPoolBackendConfig, index: int) -> str | None:
    """Where worker ``index`` publishes its KV events (an ipc socket of its own), or None when routing
    does not read them. Under the temp directory, hashed: a Unix socket path is at most 107 bytes."""
    routing = config.routing
    if routing.strategy != "score" or routing.prefix != "kv-events" or missing_libraries() is not None:
        return None
    tag = blake2b(f"{os.getpid()}:{config.name}".encode(), digest_size=6).hexdigest()
    folder = os.path.join(tempfile.gettempdir(), f"completions-gateway-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return f"ipc://{folder}/kv-{tag}-{index}.sock"


def hash_seed(config: VLLMPoolBackendConfig) -> str | None:
    """The workers' ``PYTHONHASHSEED`` (vLLM seeds its block hashes with it), None when unset."""
    return config.env.get("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED"))


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

    def command(self, port: int) -> list[str]:
        """``COMMAND MODEL --host H --port P --tensor-parallel-size N [--served-model-name S]
        [--kv-events-config ...] VLLM_ARGS``: what its next process runs."""
        c = self.config
        cmd = [*c.command, c.model, "--host", c.host, "--port", str(port)]
        cmd += ["--tensor-parallel-size", str(c.tensor_parallel_size)]
        if c.served_model_name:
            cmd += ["--served-model-name", c.served_model_name]
        events = self.endpoint.events
        if events is not None:
            # vLLM binds an ipc:// endpoint; every routing process of the gateway subscribes to it.
            config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events, "topic": KV_TOPIC}
            cmd += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
        return cmd + list(c.vllm_args)

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.config.env}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        return env

    def status(self) -> WorkerStatus:
        ep = self.endpoint
        alive = self.process is not None and self.process.returncode is None
        return WorkerStatus(
            index=self.index,
            state=self.state,
            gpus=list(self.gpus),
            port=self.port,
            pid=self.process.pid if alive and self.process is not None else None,
            uptime=time.time() - self.ready_at if self.ready_at is not None and self.state == "ready" else None,
            restarts=self.restarts,
            failures=self.failures,
            last_exit=self.last_exit,
            last_error=self.last_error,
            log_tail=list(self.log_tail),
            log_path=str(self.log_path),
            **endpoint_fields(ep),
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

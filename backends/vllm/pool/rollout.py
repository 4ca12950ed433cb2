"""Applying a changed ``vllm-pool`` section to a running pool (a reload; issue 15).

Each key of the section is one of:

- in place (:data:`IN_PLACE_KEYS`): routing, probes, restarts, timings, the gateway's
  per-backend guards; ports and log directory for processes started from now on. Applied
  at once; no vLLM process is restarted.
- rolled (:data:`ROLLED_KEYS`): what a worker process is started with (model, command,
  args, env, GPUs, worker count...). Workers are replaced one at a time, so the others
  keep serving: see :func:`roll`.
- restart (:data:`RESTART_KEYS`): the connection pool every worker's adapter shares is
  built at start; a change is refused by name (:func:`restart_keys`).

Rolling, per slot of the new plan (GPU sets from ``gpus`` and ``tensor_parallel_size``),
skipping workers that already run the new config on that slot's GPUs:

1. when the slot's GPUs are free (CPU workers; GPUs no worker holds), the new worker is
   started first on a fresh port; once ready it takes traffic and the old worker of the
   slot is retired (no new calls, its calls in flight finish within ``stop_timeout``, then
   its processes stop);
2. when old workers still hold some of the slot's GPUs, those are retired first (a GPU is
   never shared by two vLLM processes: its memory may still be in use), then the new
   worker starts there; the other workers serve meanwhile;
3. a new worker that is not ready within ``startup_timeout`` (or fails its first start)
   ends the rollout: it is stopped, the old workers retired for it in step 2 are started
   again with their old config, and the workers not reached yet keep serving. A later
   reload of the same file resumes: workers already on the new config are kept.

Old workers left without a slot (a smaller pool) are retired last. Only one rollout runs at
a time per pool (:class:`~backends.vllm.pool.pool.VLLMPoolBackend` holds the lock).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from backends.vllm.pool.resources import detect_gpus, plan_gpus
from backends.vllm.pool.supervisor import Supervisor
from backends.vllm.pool.worker import Worker
from backends.vllm.routing.balancer import decision_names
from backends.vllm.routing.dispatch import Dispatcher
from schemas.config import VLLMPoolBackendConfig

__all__ = [
    "IN_PLACE_KEYS",
    "OUTCOMES",
    "RESTART_KEYS",
    "ROLLED_KEYS",
    "RolloutReport",
    "apply_routing",
    "restart_keys",
    "roll",
]

log = logging.getLogger("gateway.pool")

ROLLED_KEYS = frozenset(
    {
        "model",
        "served_model_name",
        "gpus",
        "tensor_parallel_size",
        "workers",
        "host",
        "vllm_args",
        "env",
        "command",
        # Read into each worker's adapter when it becomes ready.
        "capabilities",
        "stream_usage",
    }
)
IN_PLACE_KEYS = frozenset(
    {
        "routing",
        "probe",
        "restart",
        "startup_timeout",
        "stop_timeout",
        # For processes started from now on (a restart, a rollout); running ones keep theirs.
        "port_range",
        "log_dir",
        # The gateway's guards of the backend (gateway.reload rebuilds them).
        "max_concurrency",
        "retry",
        "circuit_breaker",
        "health_check",
    }
)
RESTART_KEYS = {
    key: "the connection pool all of the pool's workers share is built at start"
    for key in ("timeout", "max_connections", "transport", "limits")
}
# Fixed label values of ``gateway_pool_rollouts``.
OUTCOMES = ("in_place", "rolled", "failed")


@dataclass
class RolloutReport:
    """What one reconfiguration of a pool did (``status.json`` keeps the last one)."""

    backend: str
    outcome: Literal["unchanged", "in_place", "rolled", "failed", "refused"]
    in_place: list[str] = field(default_factory=list)  # keys applied without new processes
    rolled: list[str] = field(default_factory=list)  # keys that needed new processes
    started: int = 0  # new workers that became ready and took traffic
    retired: int = 0  # old workers stopped
    error: str | None = None
    finished_at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.outcome not in ("failed", "refused")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.outcome == "refused":
            return f"pool {self.backend!r}: refused: {self.error}"
        if not self.ok:
            return f"pool {self.backend!r}: rollout failed: {self.error}; the workers not replaced keep serving"
        return (
            f"pool {self.backend!r}: {self.outcome} (in place: {', '.join(self.in_place) or '-'}; "
            f"new workers for: {', '.join(self.rolled) or '-'}; {self.started} started, {self.retired} stopped)"
        )


def _changed(old: VLLMPoolBackendConfig, new: VLLMPoolBackendConfig) -> list[str]:
    return [k for k in type(new).model_fields if getattr(old, k) != getattr(new, k)]


def restart_keys(old: VLLMPoolBackendConfig, new: VLLMPoolBackendConfig) -> list[tuple[str, str]]:
    """``(key, why)`` for each changed key a running pool cannot apply (unknown keys included)."""
    out = []
    for key in _changed(old, new):
        if key not in ROLLED_KEYS and key not in IN_PLACE_KEYS:
            out.append((key, RESTART_KEYS.get(key, "is read when the pool starts")))
    return out


def split_changes(old: VLLMPoolBackendConfig, new: VLLMPoolBackendConfig) -> tuple[list[str], list[str]]:
    """(keys applied in place, keys that need new processes) among those that changed."""
    changed = _changed(old, new)
    return [k for k in changed if k in IN_PLACE_KEYS], [k for k in changed if k in ROLLED_KEYS]


def apply_routing(dispatcher: Dispatcher, config: VLLMPoolBackendConfig) -> None:
    """The new routing settings for the next pick; decision counters keep their counts."""
    routing = config.routing
    dispatcher.routing = dispatcher.balancer.routing = routing
    decisions = dispatcher.balancer.decisions
    for name in decision_names(routing.strategy):
        decisions.setdefault(name, 0)
    for ep in dispatcher.endpoints:
        ep.prefixes.capacity = routing.affinity_entries
        ep.blocks.capacity = routing.kv_index_blocks


def _process_view(config: VLLMPoolBackendConfig) -> tuple[Any, ...]:
    """What a worker's process and adapter are made of (two workers alike here are interchangeable)."""
    return tuple(getattr(config, k) for k in sorted(ROLLED_KEYS - {"gpus", "workers"}))


async def roll(supervisor: Supervisor, new: VLLMPoolBackendConfig) -> tuple[int, int, str | None]:
    """Replace the supervisor's workers by workers of ``new``, one slot at a time.

    Returns (workers started, workers retired, error or None). The supervisor's config must
    be ``new`` already (timings, ports, log directory of the new workers).
    """
    available = await detect_gpus() if new.gpus == "all" else None
    try:
        plan = plan_gpus(new, available)
    except RuntimeError as exc:
        return 0, 0, str(exc)
    view = _process_view(new)
    slots: list[list[int]] = []
    kept: set[int] = set()
    for gpus in plan:  # a worker already on the new config and these GPUs stays as it is
        same = next(
            (
                w
                for w in supervisor.workers
                if id(w) not in kept and w.gpus == gpus and not w.retiring and _process_view(w.config) == view
            ),
            None,
        )
        if same is None:
            slots.append(gpus)
        else:
            kept.add(id(same))
    old = [w for w in supervisor.workers if id(w) not in kept]
    started = retired = 0
    for gpus in slots:
        if supervisor.closing:  # the gateway stops: close() stops every worker
            return started, retired, "the pool is closing"
        holders = [w for w in old if set(w.gpus) & set(gpus)]
        for w in holders:  # their GPUs first: the others serve meanwhile
            old.remove(w)
            await supervisor.retire(w)
            retired += 1
        worker = supervisor.add_worker(gpus, new)
        error = await _ready(supervisor, worker)
        if error is not None:
            await supervisor.retire(worker)
            for w in holders:  # back on their GPUs with the config they ran
                supervisor.add_worker(w.gpus, w.config)
            return started, retired, f"worker {worker.index} ({worker.log_path}): {error}"
        started += 1
        if not holders and old:
            await supervisor.retire(old.pop(0))
            retired += 1
    for w in old:  # no slot left for it: the pool shrank
        if supervisor.closing:
            return started, retired, "the pool is closing"
        await supervisor.retire(w)
        retired += 1
    return started, retired, None


async def _ready(supervisor: Supervisor, worker: Worker) -> str | None:
    """None once ``worker`` is ready; why not when its first start failed or took too long."""
    c = supervisor.config
    loop = asyncio.get_running_loop()
    # The worker's own startup_timeout ends a slow start; the margin covers its last probe.
    deadline = loop.time() + c.startup_timeout + c.probe.interval + c.probe.timeout
    while True:
        if worker.state == "ready":
            return None
        if worker.failures or worker.state in ("failed", "stopped"):
            return worker.last_error or f"its first start failed ({worker.state})"
        remaining = deadline - loop.time()
        if remaining <= 0:
            return f"not ready within startup_timeout ({c.startup_timeout:g}s)"
        await supervisor.wait_change(remaining)

"""What a pool reports about its workers: for ``gateway pool status``, metrics and logs.

A running ``vllm-pool`` backend rewrites ``<log_dir>/status.json`` (atomically) when a
worker changes state and after each metrics scrape; ``gateway pool status`` reads it,
so the CLI works without any admin endpoint and even while the gateway is busy.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from backends.vllm.routing.scrape import WorkerLoad

__all__ = [
    "STATES",
    "PoolStatus",
    "ReportsPool",
    "WorkerStatus",
    "default_log_dir",
    "endpoint_fields",
    "endpoints_view",
    "fill_in_flight",
    "format_table",
    "read_status",
    "worker_load",
    "write_status",
]

# Every state a worker can be in (a fixed label set for metrics).
STATES = ("starting", "ready", "unhealthy", "stopping", "backoff", "failed", "stopped")


@dataclass
class WorkerStatus:
    index: int
    state: str
    url: str = ""
    gpus: list[int] = field(default_factory=list)
    port: int | None = None
    pid: int | None = None
    uptime: float | None = None  # seconds since it became ready (None unless ready)
    restarts: int = 0
    failures: int = 0  # in a row, reset after a long enough ready spell
    in_flight: int = 0
    # With ``--workers N``: calls in flight to this worker from each gateway worker (index K).
    in_flight_by: list[int] = field(default_factory=list)
    waiting: float = 0.0  # the worker's own queue (vllm:num_requests_waiting)
    running: float = 0.0
    kv_cache_usage: float = 0.0
    # ``score``'s inputs: the queue it reads (``Endpoint.queue``), whether the metrics are stale, the
    # gateway's calls in flight when they were scraped, the server's cache config
    # (vllm:cache_config_info), the blocks its KV events say it holds (and event gaps), and the
    # requests each term won it.
    queue: float = 0.0
    stale: bool = False
    scraped_in_flight: int = 0
    cache: dict[str, Any] = field(default_factory=dict)
    events: str | None = None
    prefix_blocks: int = 0
    kv_events: int = 0
    kv_event_gaps: int = 0
    decided: dict[str, int] = field(default_factory=dict)
    last_exit: int | None = None
    last_error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    log_path: str | None = None


@dataclass
class PoolStatus:
    backend: str
    kind: str
    workers: list[WorkerStatus]
    decisions: dict[str, int] = field(default_factory=dict)
    gateway_pid: int = field(default_factory=os.getpid)
    updated_at: float = field(default_factory=time.time)
    # Reconfigurations by a reload (``backends.vllm.pool.rollout``): counts by outcome, and the last one.
    rollouts: dict[str, int] = field(default_factory=dict)
    rollout: dict[str, Any] | None = None
    # ``score``: where the prefix term comes from and why (``backends.vllm.routing.signals``).
    scoring: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PoolStatus:
        workers = [WorkerStatus(**w) for w in data.get("workers", [])]
        return cls(
            backend=data["backend"],
            kind=data.get("kind", ""),
            workers=workers,
            decisions=dict(data.get("decisions", {})),
            gateway_pid=int(data.get("gateway_pid", 0)),
            updated_at=float(data.get("updated_at", 0.0)),
            rollouts=dict(data.get("rollouts", {})),
            rollout=data.get("rollout"),
            scoring=dict(data.get("scoring", {})),
        )


@runtime_checkable
class ReportsPool(Protocol):
    """A backend that spreads requests over several workers or servers."""

    name: str

    def pool_status(self) -> PoolStatus: ...


def endpoint_fields(ep: Any) -> dict[str, Any]:
    """The :class:`WorkerStatus` fields an endpoint (``backends.vllm.routing.balancer.Endpoint``) fills."""
    load = ep.load
    return {
        "url": ep.url,
        "in_flight": ep.in_flight,
        "waiting": load.waiting,
        "running": load.running,
        "kv_cache_usage": load.kv_cache_usage,
        "queue": ep.queue(),
        "stale": load.stale,
        "scraped_in_flight": load.in_flight,
        "cache": {
            "block_size": load.block_size,
            "num_gpu_blocks": load.num_gpu_blocks,
            "prefix_caching": load.prefix_caching,
            "hash_algo": load.hash_algo,
        },
        "events": ep.events,
        "prefix_blocks": len(ep.blocks),
        "kv_events": ep.blocks.events,
        "kv_event_gaps": ep.blocks.gaps,
        "decided": dict(ep.decided),
    }


def worker_load(w: WorkerStatus) -> WorkerLoad:
    """The load a status reports, as routing reads it (a gateway worker of ``--workers N``)."""
    cache = w.cache
    return WorkerLoad(
        w.waiting,
        w.running,
        w.kv_cache_usage,
        block_size=int(cache.get("block_size") or 0),
        num_gpu_blocks=int(cache.get("num_gpu_blocks") or 0),
        prefix_caching=bool(cache.get("prefix_caching", True)),
        hash_algo=str(cache.get("hash_algo") or ""),
        in_flight=w.scraped_in_flight,
        stale=w.stale,
    )


def fill_in_flight(workers: list[WorkerStatus], cells: Sequence[int], rows: int, cols: int) -> None:
    """With ``--workers N``: each worker's calls in flight from every gateway worker (a row each of the table)."""
    for w in workers:
        if w.index < cols:
            w.in_flight_by = [cells[row * cols + w.index] for row in range(rows)]
            w.in_flight = sum(w.in_flight_by)
            if not w.stale:  # the queue score reads, as Endpoint.queue computes it in a gateway worker
                w.queue = max(float(w.in_flight), w.waiting + w.running + w.in_flight - w.scraped_in_flight)
            else:
                w.queue = float(w.in_flight)


def endpoints_view(status: PoolStatus, endpoints: Iterable[Any], *, hopeless: bool, describe: str) -> dict[str, Any]:
    """What a gateway worker routing over a shared backend needs (``backends.vllm.pool.client``), JSON-friendly.

    ``endpoints``: :class:`~backends.vllm.routing.balancer.Endpoint` objects (their adapter tells the
    version and what the server's ``/v1/models`` reported: the workers' adapters are never started).
    """
    view = []
    for ep in endpoints:
        version = getattr(ep.adapter, "version", None)
        models = ep.adapter.models_listing() if hasattr(ep.adapter, "models_listing") else None
        view.append(
            {
                "index": ep.index,
                "url": ep.url,
                "available": ep.available,
                "generation": ep.generation,
                "version": str(version) if version is not None else None,
                "events": ep.events,
                "models": models,
            }
        )
    return {"status": status.to_json(), "endpoints": view, "hopeless": hopeless, "describe": describe}


def default_log_dir(backend: str) -> Path:
    return Path(tempfile.gettempdir()) / f"completions-gateway-{os.getuid()}" / backend


def write_status(path: Path, status: PoolStatus) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status.to_json(), indent=1), encoding="utf-8")
    os.replace(tmp, path)


def read_status(path: Path) -> PoolStatus:
    return PoolStatus.from_json(json.loads(path.read_text(encoding="utf-8")))


def _fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_table(status: PoolStatus) -> str:
    """A fixed-width table, one line per worker, then the routing decisions."""
    head: tuple[str, ...] = (
        "worker",
        "state",
        "gpus",
        "port",
        "pid",
        "uptime",
        "restarts",
        "in-flight",
        "queue",
        "kv-cache",
    )
    # --workers N: which gateway worker (g0, g1, ...) has how many of the calls in flight.
    split = any(w.in_flight_by for w in status.workers)
    scored = bool(status.scoring)
    if scored:
        head += ("score queue", "blocks held", "decided by")
    if split:
        head += ("by gateway worker",)
    rows = [head]
    for w in status.workers:
        row: tuple[str, ...] = (
            str(w.index),
            w.state,
            ",".join(map(str, w.gpus)) or "-",
            str(w.port) if w.port else "-",
            str(w.pid) if w.pid else "-",
            _fmt_uptime(w.uptime),
            str(w.restarts),
            str(w.in_flight),
            f"{w.waiting:g}",
            f"{w.kv_cache_usage:.0%}",
        )
        if scored:
            decided = " ".join(f"{k.removeprefix('score_')}:{v}" for k, v in sorted(w.decided.items()) if v)
            row += (f"{w.queue:g}" + (" (stale)" if w.stale else ""), str(w.prefix_blocks), decided or "-")
        if split:
            row += (" ".join(f"g{k}:{n}" for k, n in enumerate(w.in_flight_by)) or "-",)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for w in status.workers:
        if w.last_error and w.state in ("failed", "backoff", "unhealthy", "starting"):
            lines.append(f"worker {w.index}: {w.last_error}")
            lines.extend(f"  | {line}" for line in w.log_tail[-5:])
    last = status.rollout
    if last is not None and last.get("outcome") == "failed":
        lines.append(f"last rollout failed: {last.get('error')}")
    scoring = status.scoring
    if scoring:
        why = f" ({scoring['why']})" if scoring.get("why") else ""
        lines.append(
            f"prefix: {scoring.get('prefix')}{why}; scored by kv events {scoring.get('scored_kv_events', 0)}, "
            f"approximately {scoring.get('scored_approximate', 0)}"
        )
    total = sum(status.decisions.values())
    if total:
        parts = ", ".join(f"{k} {v}" for k, v in status.decisions.items() if v)
        lines.append(f"routing: {parts}")
    return "\n".join(lines)

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

__all__ = [
    "STATES",
    "PoolStatus",
    "ReportsPool",
    "WorkerStatus",
    "default_log_dir",
    "endpoints_view",
    "fill_in_flight",
    "format_table",
    "read_status",
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
        )


@runtime_checkable
class ReportsPool(Protocol):
    """A backend that spreads requests over several workers or servers."""

    name: str

    def pool_status(self) -> PoolStatus: ...


def fill_in_flight(workers: list[WorkerStatus], cells: Sequence[int], rows: int, cols: int) -> None:
    """With ``--workers N``: each worker's calls in flight from every gateway worker (a row each of the table)."""
    for w in workers:
        if w.index < cols:
            w.in_flight_by = [cells[row * cols + w.index] for row in range(rows)]
            w.in_flight = sum(w.in_flight_by)


def endpoints_view(status: PoolStatus, endpoints: Iterable[Any], *, hopeless: bool, describe: str) -> dict[str, Any]:
    """What a gateway worker routing over a shared backend needs (``backends.vllm.pool.client``), JSON-friendly.

    ``endpoints``: :class:`~backends.vllm.routing.balancer.Endpoint` objects (their adapter tells the version).
    """
    view = []
    for ep in endpoints:
        version = getattr(ep.adapter, "version", None)
        view.append(
            {
                "index": ep.index,
                "url": ep.url,
                "available": ep.available,
                "generation": ep.generation,
                "version": str(version) if version is not None else None,
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
    total = sum(status.decisions.values())
    if total:
        parts = ", ".join(f"{k} {v}" for k, v in status.decisions.items() if v)
        lines.append(f"routing: {parts}")
    return "\n".join(lines)

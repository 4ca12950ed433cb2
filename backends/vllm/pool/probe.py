"""The supervisor's HTTP calls to one worker's own endpoints: ``/health``, ``/v1/models``, ``/metrics``.

They go over a control transport of their own (:func:`control_transport`), with the pool's
probe timeout for every phase, so probes and scrapes neither wait behind completion traffic
nor take its long timeouts. A failed call is ``None``/``False``, never an exception: the
supervisor reads "no answer" as "not ready" and counts it.
"""

from __future__ import annotations

import orjson

from backends.transport.base import HTTPTransport, get_ok
from backends.transport.httptools_client import FastHTTPTransport
from backends.vllm.pool.worker import Worker, client_host
from schemas.config import TimeoutConfig, VLLMPoolBackendConfig

__all__ = ["control_transport", "ready", "worker_get"]


def control_transport(config: VLLMPoolBackendConfig) -> HTTPTransport:
    # Probes and scrapes get their own short timeouts, apart from the completion traffic.
    t = config.probe.timeout
    return FastHTTPTransport(config.name, TimeoutConfig(connect=t, first_byte=t, total=t, stream_idle=t), 64)


async def worker_get(control: HTTPTransport, worker: Worker, path: str) -> bytes | None:
    """GET a path at the worker's root; the body on 200, else None."""
    if worker.port is None:
        return None
    return await get_ok(control, f"http://{client_host(worker.config.host)}:{worker.port}{path}")


async def ready(control: HTTPTransport, worker: Worker) -> bool:
    """``/health`` answers 200 and ``/v1/models`` lists the served model; else why not goes to
    ``worker.last_error`` (when the model list is the reason)."""
    if await worker_get(control, worker, "/health") is None:
        return False
    body = await worker_get(control, worker, "/v1/models")
    if body is None:
        return False
    try:
        data = orjson.loads(body)
        ids = {m.get("id") for m in data.get("data", []) if isinstance(m, dict)}
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return False
    if worker.config.served_name in ids:
        return True
    worker.last_error = f"/v1/models does not list {worker.config.served_name!r} (lists {sorted(map(str, ids))})"
    return False

"""Gateway-wide caps split across N workers, so the gateway (not each worker) holds them.

Each worker gets ``ceil(limit / N)`` of ``server.admission.max_in_flight``, ``queue_size`` and every
backend's ``max_concurrency``: no shared state on the hot path, and the kernel spreads connections
over the workers. The price: a worker whose share is full refuses while another still has room, so
under skewed load the gateway may say 429 a little before the configured total (ceil rounds up,
so the total is never below the limit).
"""

from __future__ import annotations

import math

from schemas.config import GatewayConfig

__all__ = ["split_caps"]


def _share(limit: int, workers: int) -> int:
    return math.ceil(limit / workers)


def split_caps(config: GatewayConfig, workers: int) -> GatewayConfig:
    """``config`` with its gateway-wide caps divided among ``workers`` processes (unchanged for 1)."""
    if workers <= 1:
        return config
    admission = config.server.admission
    admission = admission.model_copy(
        update={
            "max_in_flight": _share(admission.max_in_flight, workers),
            # A queue of 0 stays 0 (refuse at once); any other size keeps at least one slot.
            "queue_size": _share(admission.queue_size, workers),
        }
    )
    server = config.server.model_copy(update={"admission": admission})
    backends = []
    for backend in config.backends:
        cap = getattr(backend, "max_concurrency", None)  # HTTP backends have one; mock and pool differ
        if isinstance(cap, int):
            backend = backend.model_copy(update={"max_concurrency": _share(cap, workers)})
        backends.append(backend)
    return config.model_copy(update={"server": server, "backends": backends})

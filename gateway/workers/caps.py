"""Gateway-wide caps split across N workers, so the gateway (not each worker) holds them.

Worker K of N gets ``limit // N``, plus one while K < ``limit % N``, of
``server.admission.max_in_flight``, ``queue_size`` and every backend's ``max_concurrency``: the
shares add up to the limit exactly, with no shared state on the hot path (the kernel spreads
connections over the workers). The price: a worker whose share is full refuses while another
still has room, so under skewed load the gateway may say 429 a little before the configured total.

A concurrency cap below N cannot be split that way (a worker with a share of 0 could never serve):
each worker then gets 1, the gateway may run N calls instead of the limit, and
:func:`overshoots` names those caps so the worker logs a warning. A queue share of 0 is fine
(that worker refuses at once instead of queueing).
"""

from __future__ import annotations

from schemas.config import GatewayConfig

__all__ = ["overshoots", "split_caps"]


def _share(limit: int, workers: int, index: int, *, floor: int) -> int:
    return max(floor, limit // workers + (1 if index % workers < limit % workers else 0))


def split_caps(config: GatewayConfig, workers: int, index: int = 0) -> GatewayConfig:
    """``config`` with its gateway-wide caps divided among ``workers`` processes, as worker ``index``
    (unchanged for 1)."""
    if workers <= 1:
        return config
    admission = config.server.admission
    admission = admission.model_copy(
        update={
            "max_in_flight": _share(admission.max_in_flight, workers, index, floor=1),
            "queue_size": _share(admission.queue_size, workers, index, floor=0),
        }
    )
    server = config.server.model_copy(update={"admission": admission})
    backends = []
    for backend in config.backends:
        cap = getattr(backend, "max_concurrency", None)  # HTTP backends have one; mock and pool differ
        if isinstance(cap, int):
            backend = backend.model_copy(update={"max_concurrency": _share(cap, workers, index, floor=1)})
        backends.append(backend)
    return config.model_copy(update={"server": server, "backends": backends})


def overshoots(config: GatewayConfig, workers: int) -> list[str]:
    """The concurrency caps below ``workers``: split, they would hold N calls, not the limit."""
    if workers <= 1:
        return []
    found = []
    if config.server.admission.max_in_flight < workers:
        found.append(f"server.admission.max_in_flight ({config.server.admission.max_in_flight})")
    for i, backend in enumerate(config.backends):
        cap = getattr(backend, "max_concurrency", None)
        if isinstance(cap, int) and cap < workers:
            found.append(f"backends[{i}].max_concurrency ({cap})")
    return found

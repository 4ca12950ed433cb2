"""Rules that depend on how many worker processes serve one config (``gateway serve --workers N``).

The YAML does not say N (the command line or the pod's CPU does), so these run where N is known:
``gateway serve`` and ``gateway check-config --workers N``.
"""

from __future__ import annotations

from schemas.config.gateway import GatewayConfig

__all__ = ["worker_notes", "worker_problems"]


def worker_problems(config: GatewayConfig, workers: int) -> list[str]:
    """Every reason ``config`` cannot be served by ``workers`` processes, each naming its YAML path.

    A ``vllm-pool`` backend is fine: the control process runs its supervisor once
    (``gateway.workers.pools``) and the workers route over its vLLM processes.
    Per-key limits (``rpm``, ``tpm``, ``max_concurrent``, ``budget``) counted in the in-memory store would
    hold per worker, so N workers would allow N times the limit: with N > 1 they need the Redis store.
    """
    if workers <= 1:
        return []
    problems: list[str] = []
    if config.auth is None or config.auth.store_url is not None:
        return problems
    for i, key in enumerate(config.auth.keys):
        limited = [name for name in ("rpm", "tpm", "max_concurrent", "budget") if getattr(key, name) is not None]
        if limited:
            problems.append(
                f"auth.keys[{i}] ({key.name}): {', '.join(limited)} with {workers} workers need "
                "auth.store set to a Redis URL (the in-memory store would allow each worker the whole limit)"
            )
    return problems


def worker_notes(config: GatewayConfig, workers: int) -> list[str]:
    """What ``workers`` processes change without making ``config`` unservable, each naming its YAML path.

    ``responses.store: memory`` is one process's: N workers would split conversations, so the
    gateway serves Responses without them (requests that need one are refused by name).
    """
    if workers <= 1 or config.responses.store_url is not None:
        return []
    return [
        f"responses.store: memory with {workers} workers keeps no conversations (the processes would not share "
        "them): Responses requests with store true or previous_response_id get 400 store_not_shared; set "
        "responses.store to a Redis URL to keep them"
    ]

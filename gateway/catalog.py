"""The model catalogue: ``GET /v1/models`` and ``GET /v1/models/{id}``, as OpenAI's model objects.

A model object is OpenAI's (``id``, ``object: "model"``, ``created``, ``owned_by``) plus what a
client budgeting a request wants to know: ``endpoints`` (the APIs it is served on, as
``models[].endpoints`` names them), ``max_model_len`` (a route's ``context_length`` where the config
sets one, else what a vLLM server reports in its own ``/v1/models``: ``Route.context_length``) and,
for models on vLLM routes, ``root`` (``Backend.model_info``); both learnt when a backend starts or
reconnects, never per request. With several routes, ``max_model_len`` is the smallest (what every
route can take) and ``root`` the first one's.

Built per call from the router (a few dicts per model): the listing is no hot path, and what the
backends learn after start-up shows without a rebuild.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.flow.router import ModelEntry, Router
from schemas.endpoints import Endpoint

__all__ = ["OWNED_BY", "model_list", "model_object"]

OWNED_BY = "gateway"


def model_object(entry: ModelEntry, created: int) -> dict[str, Any]:
    """One model as ``GET /v1/models/{id}`` answers it."""
    out: dict[str, Any] = {
        "id": entry.name,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "endpoints": [e.value for e in Endpoint if e in entry.served],
    }
    lengths: list[int] = []
    for route in entry.routes:
        length = route.context_length()  # the route's configured window, else what its server reported
        if length is not None:
            lengths.append(length)
        info = route.backend.model_info(route.upstream_model)
        root = info.get("root") if info else None
        if isinstance(root, str) and "root" not in out:
            out["root"] = root
    if lengths:
        out["max_model_len"] = min(lengths)
    return out


def model_list(router: Router, created: int, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """``GET /v1/models``: every configured model, or those in ``allowed`` (a key's), in config order."""
    names = None if allowed is None else frozenset(allowed)
    data = [model_object(e, created) for name, e in router.models.items() if names is None or name in names]
    return {"object": "list", "data": data}

"""An upstream's own ``/v1/responses`` relayed: the request as the client set it, the answer with minimal work.

Used by the families with a native endpoint (``openai``). :func:`native_payload` is the body:
every field the client set, nested explicit ``null`` kept (OpenAI reads a missing
``strict`` differently from ``strict: null``), top-level ``null`` dropped (the default), with
``model`` the route's upstream id and ``input`` the expanded conversation (the gateway resolved
``previous_response_id`` from its own store: it is never sent upstream, where the id would not
exist after a route change; every Response relayed back names it as the client sent it).
``store`` is ``false`` unless the backend lets the upstream keep its own copy
(``backends[].upstream_store``): the gateway's store is the only one, so its ``DELETE`` is final.

:func:`relay_response_body` relays a non-streamed Response: parsed once (shape check, usage, the
object for the store), the upstream's bytes with only ``model`` swapped where that is provably
one token, else serialised again exactly.

:class:`~backends.responses.native_events.NativeResponseEvents` relays a stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, ResponsesCall, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.responses.native_events import NativeResponseEvents

__all__ = ["NativeResponseEvents", "native_payload", "relay_response_body"]

# A non-streamed Response's status: finished, or (``background: true``) also still queued or running.
_ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
_RUNNING = _ENDED | {"queued", "in_progress"}


def native_payload(call: ResponsesCall, *, upstream_store: bool = False) -> dict[str, Any]:
    """The upstream body for ``call`` (module docstring). ``upstream_store`` off (the backend's
    default): ``store: false`` goes upstream whatever the client set (its ``store`` is the
    gateway's), and the earlier turns the gateway expanded are sent as an upstream that kept
    nothing can take them (:func:`_unstored`)."""
    request = call.request
    body = request.upstream_fields()
    body["model"] = call.upstream_model
    body.pop("previous_response_id", None)  # expanded into input by the gateway
    if not upstream_store:
        body["store"] = False
        own = request.stored_input  # set when previous_response_id put earlier turns before the input
        items = body.get("input")
        if own is not None and type(items) is list:
            earlier = len(items) - len(own)
            body["input"] = [*_unstored(items[:earlier]), *items[earlier:]]
    return body


def _unstored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier turns for an upstream with its store off. Items go by value (their ids may stay: the
    Codex CLI sends ids with ``store: false``), but a reasoning item without ``encrypted_content``
    is only an id there, which the upstream would look up in a store it never wrote (OpenAI
    answers 404 "Items are not persisted when store is set to false"): it is not sent, as the
    chat bridge sends no earlier reasoning. With its ``encrypted_content`` it goes as it is."""
    return [item for item in items if item.get("type") != "reasoning" or item.get("encrypted_content")]


def relay_response_body(data: bytes, call: ResponsesCall, backend: str) -> CompletionResult:
    """An upstream Response object, renamed to the client's model (module docstring)."""
    try:
        obj = loads_keeping_integers(data, backend)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), list):
        raise UpstreamProtocolError("the upstream sent a body that is not a Response", backend=backend)
    status = obj.get("status")
    if status not in (_RUNNING if call.request.background else _ENDED):
        # Stored as it came, a Response still running (or of no known status) would read so forever:
        # the gateway does not follow a run upstream unless the client asked for one (background).
        raise UpstreamProtocolError(
            f"the upstream answered with a Response whose status is {orjson.dumps(status).decode()[:64]}, "
            "not a finished one",
            backend=backend,
        )
    usage = usage_of(obj.get("usage"), "input_tokens", "output_tokens")
    upstream = obj.get("model")
    obj["model"] = call.public_model
    previous = call.request.previous_response_id
    if previous is not None:  # resolved here, never sent: the answer names it as the client did
        obj["previous_response_id"] = previous
        return CompletionResult(dumps_exact(obj, backend), usage, answer=obj)
    if type(upstream) is str and data.count(b'"model"') == 1 and b"\\u006" not in data:
        value = orjson.dumps(upstream)
        for key in (b'"model":', b'"model": '):
            if key + value in data:
                return CompletionResult(
                    data.replace(key + value, key + orjson.dumps(call.public_model), 1), usage, answer=obj
                )
    return CompletionResult(dumps_exact(obj, backend), usage, answer=obj)

"""An upstream's own ``/v1/responses`` relayed: the request as the client set it, the answer with minimal work.

Used by the families with a native endpoint (``openai``). :func:`native_payload` is the body:
every field the client set, nested explicit ``null`` kept (OpenAI reads a missing
``strict`` differently from ``strict: null``), top-level ``null`` dropped (the default), with
``model`` the route's upstream id and ``input`` the expanded conversation (the gateway resolved
``previous_response_id`` from its own store: it is never sent upstream, where the id would not
exist after a route change).

:func:`relay_response_body` relays a non-streamed Response: parsed once (shape check, usage, the
object for the store), the upstream's bytes with only ``model`` swapped where that is provably
one token, else serialised again exactly.

:class:`NativeResponseEvents` relays a stream per network read: a read of ordinary events
(deltas: no ``"response":`` object, no output item done, no error) leaves as the upstream sent
it, after a few ``bytes`` scans; the lifecycle events (``response.created`` ... ``completed``)
are parsed to put the client's model name in, the output items kept (for the store, and for
``response.failed`` should the upstream fail later). An upstream ``error`` or ``response.failed``
event ends the relay with an upstream error: the handler writes the one ``response.failed``
the client gets, numbered after the upstream's last event.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, ResponsesCall, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.responses.events import ResponseEventStream, event_bytes, failure_of
from backends.transport.base import UpstreamResponse
from backends.transport.sse import sse_data
from backends.transport.upstream_events import UpstreamEvents
from schemas.errors import GatewayError

__all__ = ["NativeResponseEvents", "native_payload", "relay_response_body"]

_MAX_EVENT = 8 * 1024 * 1024  # limits.max_event_bytes' default
# Events worth a parse: a whole Response (its model name), a finished item (kept), an error.
_MARKERS = (b'"response":', b"response.output_item.done", b'"error"')
_TERMINAL = frozenset({"response.completed", "response.incomplete"})


def native_payload(call: ResponsesCall) -> dict[str, Any]:
    """The upstream body for ``call`` (module docstring)."""
    request = call.request
    fields = request.model_dump(mode="json", by_alias=True, exclude_unset=True)
    body = {name: value for name, value in fields.items() if value is not None}
    body["model"] = call.upstream_model
    body.pop("previous_response_id", None)  # expanded into input by the gateway
    return body


def relay_response_body(data: bytes, call: ResponsesCall, backend: str) -> CompletionResult:
    """An upstream Response object, renamed to the client's model (module docstring)."""
    try:
        obj = loads_keeping_integers(data, backend)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), list):
        raise UpstreamProtocolError("the upstream sent a body that is not a Response", backend=backend)
    usage = usage_of(obj.get("usage"), "input_tokens", "output_tokens")
    upstream = obj.get("model")
    obj["model"] = call.public_model
    if type(upstream) is str and data.count(b'"model"') == 1 and b"\\u006" not in data:
        value = orjson.dumps(upstream)
        for key in (b'"model":', b'"model": '):
            if key + value in data:
                return CompletionResult(
                    data.replace(key + value, key + orjson.dumps(call.public_model), 1), usage, answer=obj
                )
    return CompletionResult(dumps_exact(obj, backend), usage, answer=obj)


class NativeResponseEvents(UpstreamEvents[bytes], ResponseEventStream):
    """A relayed upstream Responses stream (module docstring). Not thread-safe; one consumer."""

    _cut_message = "the upstream closed the stream before the response's last event"
    relayed_events: int

    def __init__(self, resp: UpstreamResponse, call: ResponsesCall, backend: str, *, max_event: int = _MAX_EVENT):
        super().__init__(resp, backend, sep=b"\n\n", max_event=max_event)
        self._public = call.public_model
        self._seq = 0  # the number the next event gets (the upstream's last + 1)
        self._response: dict[str, Any] | None = None  # the latest lifecycle Response
        self._items: dict[int, Any] = {}  # finished output items by index
        self.final: dict[str, Any] | None = None
        self.usage = None
        self.relayed_events = 0

    __anext__ = UpstreamEvents._pull

    def _process(self, block: bytes) -> bytes:
        if not any(marker in block for marker in _MARKERS):
            events = block.count(b"\n\n")
            lines = block.count(b"\n")
            if block.count(b"data:") == events and lines in (2 * events, 3 * events):
                self._count(block)
                return block
        out: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            raw = event + b"\n\n"
            if any(marker in raw for marker in _MARKERS) or raw.count(b"data:") != 1:
                relayed = self._parsed(raw)
                if self._pending is not None or self.finished:
                    if relayed:
                        out.append(relayed)
                    break
                out.append(relayed)
            else:
                self._count(raw)
                out.append(raw)
        return b"".join(out)

    def _count(self, block: bytes) -> None:
        self.relayed_events += block.count(b'.delta"')
        at = block.rfind(b'"sequence_number":')
        if at >= 0:
            digits = block[at + 18 : at + 40].lstrip(b" ")
            end = 0
            while end < len(digits) and digits[end : end + 1].isdigit():
                end += 1
            if end:
                self._seq = int(digits[:end]) + 1

    def _parsed(self, raw: bytes) -> bytes:
        out: list[bytes] = []
        for data in sse_data(raw):
            try:
                obj = loads_keeping_integers(data, self._backend)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
                self._pending = UpstreamProtocolError(
                    "the upstream sent a stream event that is not a Responses event",
                    backend=self._backend,
                    reason="stream_garbage",
                )
                break
            kind = obj["type"]
            seq = obj.get("sequence_number")
            if kind == "error" or kind == "response.failed":
                if type(seq) is int:
                    self._seq = seq  # not relayed: the gateway's response.failed takes its number
                error = obj.get("response", {}).get("error") if kind == "response.failed" else obj
                message = error.get("message") if isinstance(error, dict) else None
                self._pending = UpstreamProtocolError(
                    f"the upstream failed mid-stream: {message or kind}", backend=self._backend, reason="stream_error"
                )
                break
            if type(seq) is int:
                self._seq = seq + 1
            response = obj.get("response")
            if isinstance(response, dict):
                response["model"] = self._public
                self._response = response
                if kind in _TERMINAL:
                    self.final = response
                    self.usage = usage_of(response.get("usage"), "input_tokens", "output_tokens")
                    self.finished = True
            elif kind == "response.output_item.done" and type(obj.get("output_index")) is int:
                self._items[obj["output_index"]] = obj.get("item")
            out.append(event_bytes(obj, self._backend))
            if self.finished:
                break
        return b"".join(out)

    # --- ResponseEventStream ---------------------------------------------------------------------
    def failed_event(self, error: GatewayError) -> bytes:
        response = self.snapshot("failed")
        event: dict[str, Any]
        if response is None:  # not even response.created came: a bare error event
            event = {"type": "error", "sequence_number": self._seq, **failure_of(error), "param": error.param}
        else:
            response["error"] = failure_of(error)
            self.final = response
            event = {"type": "response.failed", "sequence_number": self._seq, "response": response}
        self._seq += 1
        return event_bytes(event, self._backend)

    def snapshot(self, status: str) -> dict[str, Any] | None:
        if self.final is not None:
            return self.final
        if self._response is None:
            return None
        output = [self._items[i] for i in sorted(self._items)]
        return {**self._response, "status": status, "output": output}

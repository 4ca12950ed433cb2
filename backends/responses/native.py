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

:class:`NativeResponseEvents` relays a stream per network read: a read of ordinary events
(deltas: no ``"response":`` object, no output item done, no error) leaves as the upstream sent
it, after a few ``bytes`` scans; the lifecycle events (``response.created`` ... ``completed``)
are parsed to put the client's model name in, the output items kept (for the store, and for
``response.failed`` should the upstream fail later). An upstream ``error`` or ``response.failed``
event ends the relay with an upstream error: the handler writes the one ``response.failed``
the client gets, numbered after the upstream's last event.
"""

from __future__ import annotations

import re
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
_NUMBER = re.compile(rb" ?(\d{1,18})")  # a sequence number, after its key
_TERMINAL = frozenset({"response.completed", "response.incomplete"})


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


class NativeResponseEvents(UpstreamEvents[bytes], ResponseEventStream):
    """A relayed upstream Responses stream (module docstring). Not thread-safe; one consumer."""

    _cut_message = "the upstream closed the stream before the response's last event"
    relayed_events: int

    def __init__(self, resp: UpstreamResponse, call: ResponsesCall, backend: str, *, max_event: int = _MAX_EVENT):
        super().__init__(resp, backend, sep=b"\n\n", max_event=max_event)
        self._public = call.public_model
        self._asked = orjson.dumps(call.upstream_model)  # the id sent: how a Response names it, usually
        # Resolved by the gateway and not sent: every Response in the stream names it as the client did.
        self._previous = call.request.previous_response_id
        self._seq = 0  # the number the next event gets (the upstream's last + 1)
        # The latest lifecycle Response and the finished items: their JSON, read only when a
        # snapshot is needed (the store, a failure midway), so a stream that ends well parses one event.
        self._response: bytes | dict[str, Any] | None = None
        self._items: list[bytes | dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.usage = None
        self.relayed_events = 0

    __anext__ = UpstreamEvents._pull

    def _process(self, block: bytes) -> bytes:
        # Only the events holding a marker are parsed (a few per stream); the runs of deltas
        # between them take the byte path. A marker is JSON structure, never generated text
        # (quotes inside strings are escaped), so a find locates its event.
        out: list[bytes] = []
        start = 0
        for at in _marker_positions(block):
            if at < start:
                continue  # a second marker in an event already parsed
            begin = block.rfind(b"\n\n", start, at)
            begin = start if begin < 0 else begin + 2
            end = block.find(b"\n\n", at)
            end = len(block) if end < 0 else end + 2
            if begin > start:
                out.append(self._plain(block[start:begin]))
            out.append(self._marked(block[begin:end]))
            if self._pending is not None or self.finished:
                break
            start = end
        else:
            if start < len(block):
                out.append(self._plain(block[start:]))
        return out[0] if len(out) == 1 else b"".join(out)

    def _marked(self, raw: bytes) -> bytes:
        """One event holding a marker: a lifecycle event before the end is relayed with the model
        swapped on its bytes and kept unparsed, so is a finished item; the rest is parsed."""
        at = raw.find(b"data: ")
        if at < 0 or raw.count(b"\n", at) != 2 or not raw.endswith(b"\n\n"):
            return self._parsed(raw)  # not one event with one data line
        data = raw[at + 6 : -2]
        head = data[:64]
        if head.startswith(b'{"type":"response.output_item.done"'):
            self._items.append(data)
            self._numbered(raw)
            return raw
        if self._previous is None and head.startswith(
            (b'{"type":"response.created"', b'{"type":"response.in_progress"', b'{"type":"response.queued"')
        ):
            if data.count(b'"model"') == 1:
                for key in (b'"model":', b'"model": '):
                    if key + self._asked in data:
                        self._response = data
                        self._numbered(raw)
                        return (
                            raw[:at]
                            + b"data: "
                            + data.replace(key + self._asked, key + orjson.dumps(self._public), 1)
                            + b"\n\n"
                        )
        return self._parsed(raw)

    def _plain(self, block: bytes) -> bytes:
        """Ordinary events, relayed as sent when each is ``event:`` and ``data:`` lines (or ``data:`` alone)."""
        events = block.count(b"\n\n")
        if block.count(b"data:") != events or block.count(b"\n") not in (2 * events, 3 * events):
            return self._parsed(block)
        self._count(block)
        return block

    def _count(self, block: bytes) -> None:
        """Relayed ordinary events: their deltas counted (token settlement), their last number kept."""
        self.relayed_events += block.count(b'.delta"')
        self._numbered(block)

    def _numbered(self, block: bytes) -> None:
        """The number the next event gets: one past the last ``sequence_number`` in ``block``."""
        at = block.rfind(b'"sequence_number":')
        if at >= 0 and (number := _NUMBER.match(block, at + 18)) is not None:
            self._seq = int(number[1]) + 1

    def _parsed(self, raw: bytes) -> bytes:
        """Events parsed one by one: renamed, kept for the store, an upstream failure raised."""
        out: list[bytes] = []
        at = raw.find(b"data: ")
        one = at >= 0 and raw.count(b"\n", at) == 2 and raw.endswith(b"\n\n")  # one event, one data line
        for data in (raw[at + 6 : -2],) if one else sse_data(raw):
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
            upstream = None
            if isinstance(response, dict):
                upstream = response.get("model")
                response["model"] = self._public
                if self._previous is not None:
                    response["previous_response_id"] = self._previous
                    upstream = object()  # not a str: _written serialises the event anew
                self._response = response
                if kind in _TERMINAL:
                    self.final = response
                    self.usage = usage_of(response.get("usage"), "input_tokens", "output_tokens")
                    self.finished = True
            elif kind == "response.output_item.done":
                self._items.append(obj)
            out.append(self._written(obj, data, upstream))
            if self.finished:
                break
        return b"".join(out)

    def _written(self, obj: dict[str, Any], data: bytes, upstream: Any) -> bytes:
        """The event for the client: the upstream's bytes with only the model swapped where the event
        holds exactly one ``"model"`` token, spelled as orjson spells the upstream's id (the
        Response's: a quote inside a JSON string is escaped, so the token is the key); else
        serialised again. ``upstream``: the event's model before the swap (None: no Response)."""
        kind: str = obj["type"]
        head = b"event: " + kind.encode() + b"\ndata: "
        if upstream is None:
            return head + data + b"\n\n"
        if type(upstream) is str and data.count(b'"model"') == 1 and b"\\u006" not in data:
            value = orjson.dumps(upstream)
            for key in (b'"model":', b'"model": '):
                if key + value in data:
                    return head + data.replace(key + value, key + orjson.dumps(self._public), 1) + b"\n\n"
        return event_bytes(obj, self._backend)

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
        response = _object(self._response, self._backend)
        if response is None:
            return None
        items = [_object(item, self._backend) for item in self._items]
        ordered = sorted((item for item in items if item is not None), key=_output_index)
        output = [event.get("item") for event in ordered]
        return {**response, "model": self._public, "status": status, "output": output}


def _marker_positions(block: bytes) -> list[int]:
    """Where the markers are in ``block``, in order: one ``find`` pass per marker (memchr-fast; a
    regex alternation scans ten times slower)."""
    found: list[int] = []
    for marker in _MARKERS:
        at = block.find(marker)
        while at >= 0:
            found.append(at)
            at = block.find(marker, at + len(marker))
    found.sort()
    return found


def _output_index(event: dict[str, Any]) -> int:
    index = event.get("output_index")
    return index if type(index) is int else 0


def _object(data: bytes | dict[str, Any] | None, backend: str) -> dict[str, Any] | None:
    """A kept event (bytes until now) as an object; a lifecycle event gives its ``response``."""
    if not isinstance(data, bytes):
        return data
    try:
        obj = loads_keeping_integers(data, backend)
    except (orjson.JSONDecodeError, UpstreamProtocolError):
        return None
    if not isinstance(obj, dict):
        return None
    response = obj.get("response")
    return response if isinstance(response, dict) else obj

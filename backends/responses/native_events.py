"""An upstream's own ``/v1/responses`` stream relayed with minimal work (``openai``: see
:mod:`backends.responses.native`).

:class:`NativeResponseEvents` relays a stream per network read, parsing one event of a stream
that ends well. A read's run of deltas (from its first delta event to its last: most of a
streamed answer's bytes) is checked with two counts (every event in it of one delta type, one
data line each, numbered in sequence) and leaves as the upstream sent it. The few events around
it are known by their type: the ordinary ones (an item or part added, a text done) leave as they
came, the lifecycle events before the end (``response.created``, ``in_progress``, ``queued``)
are renamed on their bytes (the client's model name) and kept unparsed, and
``response.completed`` (or ``incomplete``) is parsed: renamed, its usage read, the Response the
store keeps. An event of another type or layout is searched for markers (a ``"response":``
object, an error) and parsed when it holds one. An upstream ``error`` or ``response.failed``
event ends the relay with an upstream error: the handler writes the one ``response.failed`` the
client gets, numbered as the upstream's failure was (else after the last event relayed).

The reads are kept as they came (a list append each): a stream cut short (a client that left,
an upstream that failed or ended before its last event) is snapshotted from them, its output as
far as it was relayed (:class:`~backends.responses.native_output.OutputSoFar`), parsed only then.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from backends.base import ResponsesCall, usage_of
from backends.errors import UpstreamProtocolError
from backends.exact_json import loads_keeping_integers
from backends.responses.event_stream import ResponseEventStream, event_bytes, failure_of
from backends.responses.native_output import OutputSoFar
from backends.transport.base import UpstreamResponse
from backends.transport.sse import sse_data
from backends.transport.upstream_events import UpstreamEvents
from schemas.errors import GatewayError

__all__ = ["NativeResponseEvents"]

_MAX_EVENT = 8 * 1024 * 1024  # limits.max_event_bytes' default
# The reads kept for a snapshot are folded (parsed) past this many bytes: a long stream's memory.
_KEEP = 1024 * 1024
# Events worth a parse: a whole Response (its model name), an error.
_MARKERS = (b'"response":', b'"error"')
_NUMBER = re.compile(rb" ?(\d{1,18})")  # a sequence number, after its key
_TERMINAL = frozenset({"response.completed", "response.incomplete"})
# The lifecycle events before the end: each holds the Response so far, renamed on its bytes and kept.
_OPENING = frozenset({b"response.created", b"response.in_progress", b"response.queued"})
# The events parsed: the terminal ones (the Response the store keeps, the usage) and the failures.
_ENDING = frozenset({b"response.completed", b"response.incomplete", b"response.failed", b"error"})
_OPENING_HEADS = tuple(b'{"type":"' + kind + b'"' for kind in _OPENING)
_OPENS = (b'{"type":"response.created"', b'{"type": "response.created"')  # a stream's usual first data
# Event types that hold no Response and no failure: relayed as they come (as is any ``*.delta``).
# Any other type is searched for markers.
_PLAIN = frozenset(
    b"response." + kind
    for kind in (
        b"output_item.added", b"output_item.done", b"content_part.added", b"content_part.done", b"output_text.done",
        b"output_text.annotation.added", b"refusal.done", b"function_call_arguments.done",
        b"custom_tool_call_input.done", b"reasoning_text.done", b"reasoning_summary_part.added",
        b"reasoning_summary_part.done", b"reasoning_summary_text.done",
    )
)  # fmt: skip


class NativeResponseEvents(UpstreamEvents[bytes], ResponseEventStream):
    """A relayed upstream Responses stream (module docstring). Not thread-safe; one consumer."""

    _cut_message = "the upstream closed the stream before the response's last event"
    relayed_events: int

    def __init__(self, resp: UpstreamResponse, call: ResponsesCall, backend: str, *, max_event: int = _MAX_EVENT):
        super().__init__(resp, backend, sep=b"\n\n", max_event=max_event)
        self._public = call.public_model
        self._asked = orjson.dumps(call.upstream_model)  # the id sent: how a Response names it, usually
        self._same = call.upstream_model == call.public_model
        # Resolved by the gateway and not sent: every Response in the stream names it as the client did.
        self._previous = call.request.previous_response_id
        self._seq = 0  # the number the next event gets (the last relayed one's + 1)
        self._failed_at: int | None = None  # the number of the upstream's failure event, if it had one
        # The latest lifecycle Response (its JSON) and the reads since the last fold: read only when
        # a snapshot is needed (the store, a failure midway), so a stream that ends well parses one event.
        self._response: bytes | dict[str, Any] | None = None
        self._reads: list[bytes] = []
        self._kept = 0  # their bytes
        self._output = OutputSoFar(backend)
        self.final: dict[str, Any] | None = None
        self.usage = None
        self.relayed_events = 0
        self._delta: bytes | None = None  # the data line's head of this stream's deltas (_learn)
        self._opened = False  # the stream's first event was seen to open a Response (_opening)

    __anext__ = UpstreamEvents._pull

    def _process(self, block: bytes) -> bytes:
        # The read's run of deltas (most of its bytes) is checked with a count or two and relayed
        # as it came (_run); the few events before and after it are taken one by one (_edge). A
        # read that does not look like that is searched for markers (_scan). The number the next
        # event gets is read once, from what leaves.
        if not self._opened and (refused := self._opening(block)) is not None:
            self._pending = refused  # raised by the pull before a byte is relayed: the handler's 502
            return b""
        self._reads.append(block)
        self._kept += len(block)
        if self._kept > _KEEP:
            self._fold()
        head = self._delta
        first = block.find(head) if head is not None else -1
        if first >= 0 and block.find(b"\n\n") == len(block) - 2:  # one event: a token as it arrives
            if block.count(b"\n") == (3 if first else 2) and (not first or block[first - 1] == 10):
                self.relayed_events += 1  # (one data line: the delta's own)
                self._numbered(block)
                return block
        if first < 0:
            head, first = self._learn(block)
        events = start = end = 0
        if head is not None:
            start = block.rfind(b"\n\n", 0, first) + 2
            start = start if start > 1 else 0
            end = block.find(b"\n\n", block.rfind(head)) + 2
            events = _run(block, head, start, first, end)
        if not events:
            out = self._edge(block)
        elif not start and end == len(block):  # the usual read of a streamed answer: deltas alone
            self.relayed_events += events
            out = block
        else:
            parts = [self._edge(block[:start])] if start else []
            if self._pending is None and not self.finished:  # (an error or the end before the run)
                self.relayed_events += events
                parts.append(block[start:end])
                if end < len(block):
                    parts.append(self._edge(block[end:]))
            out = b"".join(parts)
        self._numbered(out)
        return out

    def _opening(self, block: bytes) -> UpstreamProtocolError | None:
        """The refusal of a stream whose first event opens no Response (a bare delta, ``[DONE]``
        alone, text), or None: it does (``response.created``; a lifecycle event or a failure is
        taken as it is), or ``block`` holds no data line yet (a comment)."""
        at = block.find(b"data:")
        if at < 0:
            return None
        self._opened = True
        end = block.find(b"\n", at)
        data = block[at + 5 : end if end >= 0 else len(block)].strip()
        if data.startswith(_OPENS):
            return None
        try:
            kind = orjson.loads(data).get("type")
        except (orjson.JSONDecodeError, AttributeError):
            kind = None
        if isinstance(kind, str) and (kind.encode() in _OPENING or kind in ("error", "response.failed")):
            return None
        return UpstreamProtocolError(
            f"the upstream's Responses stream began with {kind or 'no Responses event'!s:.64}, not response.created",
            backend=self._backend,
            reason="stream_garbage",
        )

    def _learn(self, block: bytes) -> tuple[bytes | None, int]:
        """The data line's head of the first delta in ``block`` (``data: {"type":"<...>.delta",``),
        kept for the stream, and where it is; (None, -1) when there is none in the usual layout."""
        at = block.find(b'.delta",')
        begin = block.rfind(b'data: {"type":"', 0, at) if at >= 0 else -1
        if begin < 0 or (begin and block[begin - 1] != 10) or b'"' in block[begin + 15 : at + 6]:
            return None, -1  # none, or not a type (a text ending in ".delta"): markers only
        self._delta = head = block[begin : at + 8]
        return head, begin

    def _edge(self, part: bytes) -> bytes:
        """The few events around a run, one by one, each known by its type where it has the usual
        layout (``[event: ...]``, ``data: {"type":"...",``, one line each): a lifecycle event renamed
        on its bytes, a type that carries nothing to act on (:data:`_PLAIN`) as it came, the end or
        a failure parsed; any other type, and an event in another layout, as :meth:`_scan` takes it."""
        out: list[bytes] = []
        start = kept = 0  # the next event; the first one relayed as it came not yet in out
        size = len(part)
        while start < size:
            at = start
            line = part.find(b"\n", at)
            if part.startswith(b"event: ", at):  # the type named twice: the data's is what counts
                kind = part[at + 7 : line]
                at = line + 1
                line = part.find(b"\n", at)
                usual = part.startswith(b'data: {"type":"' + kind + b'"', at)
            else:
                quote = part.find(b'"', at + 15, line)
                kind = part[at + 15 : quote]
                usual = quote > 0 and part.startswith(b'data: {"type":"', at)
            end = line + 2
            if line < 0 or not usual or part[line + 1 : end] != b"\n":
                end = part.find(b"\n\n", start) + 2
                end = end if end > 1 else size
                done = self._scan(part[start:end])  # one event in another layout
            else:
                if kind in _PLAIN:
                    start = end
                    continue
                if kind.endswith(b".delta"):
                    self.relayed_events += 1
                    start = end
                    continue
                raw = part[start:end]
                if kind in _ENDING:
                    done = self._parsed(raw)
                else:
                    renamed = self._renamed(raw, at - start, part[at + 6 : line]) if kind in _OPENING else None
                    done = renamed if renamed is not None else self._scan(raw)
            if kept < start:
                out.append(part[kept:start])
            out.append(done)
            start = kept = end
            if self._pending is not None or self.finished:
                break
        if not kept:
            return part
        if kept < start:
            out.append(part[kept:start])
        return b"".join(out)

    def _scan(self, block: bytes) -> bytes:
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
        swapped on its bytes and kept unparsed; the rest is parsed."""
        at = raw.find(b"data: ")
        if at < 0 or raw.count(b"\n", at) != 2 or not raw.endswith(b"\n\n"):
            return self._parsed(raw)  # not one event with one data line
        data = raw[at + 6 : -2]
        renamed = self._renamed(raw, at, data) if data[:64].startswith(_OPENING_HEADS) else None
        return renamed if renamed is not None else self._parsed(raw)

    def _renamed(self, raw: bytes, at: int, data: bytes) -> bytes | None:
        """A lifecycle event before the end (``data`` its JSON, its data line at ``at`` in ``raw``)
        with the client's model swapped in on its bytes, kept unparsed; None when that cannot be
        done safely (a ``previous_response_id`` to add, a ``"model"`` key more, another id)."""
        if self._previous is not None or data.count(b'"model"') != 1:
            return None
        for key in (b'"model":', b'"model": '):
            if (old := key + self._asked) in data:
                self._response = data
                if self._same:  # the upstream's id is the client's name: nothing to swap
                    return raw
                renamed = data.replace(old, key + orjson.dumps(self._public), 1)
                return b"".join((raw[:at], b"data: ", renamed, b"\n\n"))
        return None

    def _plain(self, block: bytes) -> bytes:
        """Ordinary events, relayed as sent when each is ``event:`` and ``data:`` lines (or ``data:``
        alone); their deltas counted (token settlement)."""
        events = block.count(b"\n\n")
        if block.count(b"data:") != events or block.count(b"\n") not in (2 * events, 3 * events):
            return self._parsed(block)
        self.relayed_events += block.count(b'.delta"')
        return block

    def _numbered(self, block: bytes) -> None:
        """The number the next event gets: one past the last ``sequence_number`` in ``block`` (a read's
        relayed events)."""
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
                    self._failed_at = seq  # not relayed: the gateway's response.failed takes its number
                error = obj.get("response", {}).get("error") if kind == "response.failed" else obj
                message = error.get("message") if isinstance(error, dict) else None
                self._pending = UpstreamProtocolError(
                    f"the upstream failed mid-stream: {message or kind}", backend=self._backend, reason="stream_error"
                )
                break
            if kind.endswith(".delta"):
                self.relayed_events += 1
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
                    self._reads = []  # the snapshot is this Response now
                    self.usage = usage_of(response.get("usage"), "input_tokens", "output_tokens")
                    self.finished = True
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
                    if upstream != self._public:
                        data = data.replace(key + value, key + orjson.dumps(self._public), 1)
                    return head + data + b"\n\n"
        return event_bytes(obj, self._backend)

    # --- ResponseEventStream ---------------------------------------------------------------------
    def failed_event(self, error: GatewayError) -> bytes:
        response = self.snapshot("failed")
        seq = self._seq if self._failed_at is None else self._failed_at
        event: dict[str, Any]
        if response is None:  # not even response.created came: a bare error event
            event = {"type": "error", "sequence_number": seq, **failure_of(error), "param": error.param}
        else:
            response["error"] = failure_of(error)
            self.final = response
            event = {"type": "response.failed", "sequence_number": seq, "response": response}
        self._seq, self._failed_at = seq + 1, None
        return event_bytes(event, self._backend)

    def snapshot(self, status: str) -> dict[str, Any] | None:
        if self.final is not None:
            return self.final
        response = _object(self._response, self._backend)
        if response is None:
            return None
        self._fold()
        return {**response, "model": self._public, "status": status, "output": self._output.output()}

    def _fold(self) -> None:
        """The reads kept so far folded into the output (and let go)."""
        self._output.fold(self._reads)
        self._reads, self._kept = [], 0


def _run(block: bytes, head: bytes, start: int, first: int, end: int) -> int:
    """How many events ``block[start:end]`` holds (from the one whose data starts at ``first``) when
    they are all of ``head``'s type; 0 when another event may be among them.

    Each such event holds ``head`` once (the start of its JSON object, which no string can hold).
    Where the upstream numbers its events (OpenAI does: each takes the next ``sequence_number``),
    the first and last numbers tell when another event is among them; where it does not (or for
    one event), the line ends do (two or three per event: one data line each, an ``event:`` line
    or not). These events need nothing from the relay: they leave as they came."""
    events = block.count(head, start, end)
    if events > 1 and (initial := _number_after(block, first, end)) >= 0:
        key = block.rfind(b'"sequence_number":', first, end)
        final = _NUMBER.match(block, key + 18)
        return events if final is not None and int(final[1]) == initial + events - 1 else 0
    lines = block.count(b"\n", start, end)
    return events if lines == 3 * events or lines == 2 * events else 0


def _number_after(block: bytes, at: int, end: int) -> int:
    """The first sequence number after ``at`` (-1: none before ``end``)."""
    key = block.find(b'"sequence_number":', at, end)
    number = _NUMBER.match(block, key + 18) if key >= 0 else None
    return int(number[1]) if number is not None else -1


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


def _object(data: bytes | dict[str, Any] | None, backend: str) -> dict[str, Any] | None:
    """The kept lifecycle event (bytes until now) as its ``response`` object."""
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

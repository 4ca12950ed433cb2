"""Relaying an OpenAI-shaped upstream stream to the client with minimal work.

Non-streamed bodies: ``backends.openai.body``. Streams are relayed per network read, not per
event: the read is cut into whole events by the shared decoder (``backends.transport.sse``:
linear in bytes, each event capped by ``limits.max_event_bytes``), and the complete events are
rewritten with a few ``bytes`` scans and one ``replace`` (``"model":"<upstream id>"`` ->
``"model":"<public name>"``: the byte path, ``backends.openai.frame``); only reads that carry
something the gateway must act on (a usage object, an error event, an unexpected model shape, a
line that is not ``data:``) are parsed event by event (:meth:`OpenAIStreamRelay._process_slow`).
This is what keeps a 64-token stream at a small fraction of a Python proxy's budget. A stream the
gateway reads itself (the Responses bridge: ``backends.base.BridgeChatCall``) is vouched the same
way but not rewritten for a client: no swap, and the usage chunk's object handed over as read
(``usage_fields``) instead of an event to parse again.

What reaches the client is ``data:`` events only (an upstream's ``id:``, ``event:``,
``retry:``, comment and bare lines are not relayed), up to the *first* ``[DONE]``; the usage
chunk a client asked for is its last event wherever the upstream sent it; a ``[DONE]`` before
every choice has its ``finish_reason`` is an error (reason ``stream_cut``), never a clean end.

Why the byte scans are safe: inside JSON strings quotes and newlines are
escaped, so ``"model":`` and ``\\n\\ndata:`` can only occur as real structure, never inside
generated text; the usage key is searched for unquoted (``prompt_tokens``), so a text that
names it only sends its event to the parse. What the fast path does not scan for: error events
and an early ``[DONE]`` carry no ``"model"`` key, so a read holding one fails the self-check
(one upstream-spelled ``"model"`` per event, or the head learned from the stream's first
event: its bytes through the model key) and is parsed; one that carries the model key still
lacks the learned choice end. An event cut short is caught by the framing
(``data: {`` ... ``}``) and the learned choice end (:func:`~backends.openai.frame.choice_end_of`), which also sends
the event that finishes a choice to the parse (where finishes are counted per choice). The
rest of an event's bytes are not proven JSON on the byte path (a parse of every event costs
a 64-token stream about 10% more CPU): damage inside an event with its structure intact is
relayed as sent (docs/security.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import Call, CompletionStream, TokenUsage, usage_of
from backends.errors import UpstreamProtocolError, error_fields
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.openai.frame import EventFrame
from backends.transport.base import UpstreamResponse
from backends.transport.sse import sse_data
from backends.transport.upstream_events import UpstreamEvents

__all__ = ["OpenAIStreamRelay", "usage_of", "with_usage_null"]

_MAX_EVENT = 8 * 1024 * 1024  # limits.max_event_bytes' default
_DONE_TAIL = b"\n\ndata: [DONE]\n\n"  # how a normal stream's last read ends: a whole event after whole events
_DONE_ALONE = b"data: [DONE]\n\n"  # or the whole of it
_DONE_CUT = -len(_DONE_ALONE)
# Where a usage object may be: its key, unquoted (a search for a pattern ending in a letter skips
# ahead faster than for one ending in a quote, 2.7 against 3.4 us over a 64-token stream's 11 KB).
# Also in generated text, where it sends that event to the parse: slower, never wrong.
_USAGE_KEY = b"prompt_tokens"


class OpenAIStreamRelay(EventFrame, UpstreamEvents[bytes], CompletionStream):
    """A :class:`CompletionStream` over an OpenAI-shaped SSE upstream (OpenAI, vLLM)."""

    _cut_message = "the upstream closed the stream before [DONE]"
    relayed_events: int
    _done_early = False  # the parse met a [DONE] before the read's end: nothing after it is relayed
    _usage_event: bytes | None = None  # the client's usage chunk, held until the end

    def __init__(
        self,
        resp: UpstreamResponse,
        call: Call[Any],
        backend: str,
        *,
        client_wants_usage: bool,
        client_wants_continuous_usage: bool,
        max_event: int = _MAX_EVENT,
    ) -> None:
        super().__init__(resp, backend, sep=b"\n\n", max_event=max_event)
        # A stream the gateway reads itself (the Responses bridge) keeps the upstream's model name:
        # its events pass as vouched, with no swap (_same), and so do a family's client-only edits.
        self._for_client = for_client = call.for_client
        self._public = call.public_model if for_client else call.upstream_model
        upstream = orjson.dumps(call.upstream_model)
        self._old = b'"model":' + upstream
        self._old_spaced = b'"model": ' + upstream
        self._new = b'"model":' + orjson.dumps(self._public)
        self._keep_usage_chunk = client_wants_usage
        # OpenAI's "usage": null in every other chunk, for a client that asked for usage (subclasses).
        self._usage_null = client_wants_usage and for_client
        self._keep_chunk_usage = client_wants_continuous_usage
        self.usage: TokenUsage | None = None
        self.relayed_events = 0  # events returned so far (CompletionStream.relayed_events)
        # One choice per event is what the byte path can vouch for; n > 1 (or a batch of
        # prompts) is parsed event by event, so each choice's finish is known by its index.
        request = call.request
        self._one_choice = request.effective_n * request.prompt_count == 1
        self._open: set[Any] = set()  # choices seen in parsed events without their finish_reason yet
        self._ended: set[Any] = set()  # choices whose finish_reason came

    __anext__ = UpstreamEvents._pull  # an alias: the loop is the shared one, no call more per read

    def _process(self, block: bytes) -> bytes:
        # The usual last event is cut here, looking at the tail only: a [DONE] earlier in the
        # block is an event without a "model" key, so it fails _rename's self-check and the
        # event-by-event parse honours it (the first [DONE] wins).
        if block.endswith(_DONE_TAIL):
            self.finished = True
            block = block[:_DONE_CUT]
        elif block == _DONE_ALONE:
            self.finished = True
            block = b""
        # Only the events that carry something to act on are parsed; the runs of ordinary
        # events between them take the byte-level fast path. 'prompt_tokens' is in a usage
        # object (ordinary chunks carry "usage":null) or in text (_USAGE_KEY). Error events need no
        # scan of their own: they carry no "model" key ({"error": ...}, vLLM's {"object": "error"}),
        # so the self-check sends them to the parse.
        at = block.find(_USAGE_KEY)
        if at < 0 and not self.finished:  # the usual read: ordinary events, nothing to settle
            one = self._rename(block)
            if self._pending is None and not self._done_early:
                return one
            out = [one]
        else:
            out = []
            while block:
                if at < 0:
                    out.append(self._rename(block))
                    break
                start = block.rfind(b"\n\n", 0, at)
                start = 0 if start < 0 else start + 2
                end = block.find(b"\n\n", at)
                end = len(block) if end < 0 else end + 2
                if start:
                    out.append(self._rename(block[:start]))
                    if self._pending is not None or self._done_early:
                        break
                parsed = self._process_slow(block[start:end])
                if parsed:  # (a usage chunk the client did not ask for leaves nothing: no join of it)
                    out.append(parsed)
                if self._pending is not None or self._done_early:
                    break
                block = block[end:]
                if block:
                    at = block.find(_USAGE_KEY)
        if self._done_early:
            self.finished = True  # an earlier [DONE] than the tail's: what follows it is not relayed
        if self._pending is not None:
            # Events that arrived before the upstream's failure still reach the client (an
            # error after [DONE] in the same read included); the error is raised at the next call.
            self.finished = False
        elif self.finished:
            self._end(out)
        return (out[0] if len(out) == 1 else b"".join(out)) if out else b""

    def _end(self, out: list[bytes]) -> None:
        """At the upstream's [DONE]: every choice must have ended, and the usage chunk goes last.

        A stream whose choices never got a ``finish_reason`` was cut, however it ended: the
        client gets an error event, never a stream that only looks complete (the native
        backends do the same). The usage chunk, wherever it came, is the client's last event.
        """
        if self._open or not self._ended:
            what = "a choice" if self._ended else "its choices"
            self._pending = UpstreamProtocolError(
                f"the upstream ended the stream without a finish_reason for {what}",
                backend=self._backend,
                reason="stream_cut",
            )
            self.finished = False
            return
        if self._usage_event is not None:
            out.append(self._usage_event)
            self._usage_event = None
            self.relayed_events += 1

    def _process_slow(self, block: bytes) -> bytes:
        out: list[bytes] = []
        # One event on one line (a usage chunk, say) is its own data; else the SSE decode, where
        # events without data (comments, keep-alives) are dropped.
        one = block.startswith(b"data: {") and block.find(b"\n") == len(block) - 2
        for data in (block[6:-2],) if one else sse_data(block):
            if data == b"[DONE]":
                self._done_early = True  # the first [DONE] ends the stream
                break
            try:
                obj = loads_keeping_integers(data, self._backend)
            except orjson.JSONDecodeError:
                obj = None
            except UpstreamProtocolError as exc:  # valid JSON, but no exact reading of it
                exc.reason = "stream_garbage"
                self._pending = exc
                break
            if not isinstance(obj, dict):
                self._pending = UpstreamProtocolError(
                    "the upstream sent a stream event that is not a JSON object",
                    backend=self._backend,
                    reason="stream_garbage",
                )
                break
            if "error" in obj or obj.get("object") == "error":
                self._pending = UpstreamProtocolError(
                    f"the upstream failed mid-stream: {error_fields(obj).message}",
                    backend=self._backend,
                    reason="stream_error",
                )
                break
            if not isinstance(obj.get("choices", []), list):  # a usage chunk may leave the key out
                self._pending = UpstreamProtocolError(
                    "the upstream sent a stream event whose choices is not a list",
                    backend=self._backend,
                    reason="stream_garbage",
                )
                break
            choices = obj.get("choices")
            if choices:
                self._track(choices)
            usage = usage_of(obj.get("usage"))
            hold = False
            if usage is not None:
                self.usage = usage
                if not choices:
                    if not self._for_client:  # the bridge: the object as read, no event (no dump, no parse there)
                        self.usage_fields = obj["usage"]
                        continue
                    if not self._keep_usage_chunk:
                        continue  # the gateway asked for it, for metrics only
                    hold = True  # the client's last event, whenever the upstream sent it
                elif not self._keep_chunk_usage:
                    obj["usage"] = None
            upstream_model = obj.get("model")
            if isinstance(upstream_model, str) and upstream_model != self._public:
                # Upstreams may answer with another spelling than the id we sent (OpenAI adds
                # a version suffix): learn it so later reads take the byte path again.
                self._old = b'"model":' + orjson.dumps(upstream_model)
                self._old_spaced = b'"model": ' + orjson.dumps(upstream_model)
            obj["model"] = self._public
            try:
                event = b"data: " + dumps_exact(obj, self._backend, "a stream event") + b"\n\n"
            except UpstreamProtocolError as exc:
                exc.reason = "stream_garbage"
                self._pending = exc
                break
            if hold:
                self._usage_event = event
            else:
                out.append(event)
        self.relayed_events += len(out)
        return b"".join(out)

    def _track(self, choices: list[Any]) -> None:
        """Which choices have ended, from a parsed chunk's ``choices``."""
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if isinstance(index, dict | list):
                index = None  # not a key: counted as one choice of its own
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self._ended.add(index)
                self._open.discard(index)
            elif index not in self._ended:
                self._open.add(index)


_USAGE_NULL = b',"usage":null}\n\n'


def with_usage_null(block: bytes) -> bytes:
    """``"usage":null`` added to the events of a block of relayed events that lack a ``usage`` key.

    OpenAI's shape with ``include_usage``: every chunk but the usage chunk carries
    ``"usage": null``; vLLM (and some OpenAI-compatible servers) leave the key out.
    The block is the relay's output: one-line ``data:`` events of JSON objects, so each event
    ends in ``}\\n\\n`` and that sequence occurs nowhere else (newlines inside JSON strings
    are escaped). The events before the first one that has a ``"usage"`` key get the key in
    one ``replace``; only the rest (usually the usage chunk alone) are looked at one by one.
    """
    first = block.find(b'"usage"')
    if first < 0:
        return block.replace(b"}\n\n", _USAGE_NULL)
    start = block.rfind(b"\n\n", 0, first) + 2  # where that event starts (0 when it is the first)
    head = block[:start].replace(b"}\n\n", _USAGE_NULL) if start else b""
    rest = block[start:]
    if rest.count(b'"usage"') >= rest.count(b"\n\n"):
        return head + rest if head else rest  # every event left has one already
    out = [head]
    for event in rest.split(b"\n\n"):
        if not event:
            continue
        if b'"usage"' in event or not event.endswith(b"}"):
            out.append(event + b"\n\n")
        else:
            out.append(event[:-1] + _USAGE_NULL)
    return b"".join(out)

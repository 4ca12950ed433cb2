"""Relaying OpenAI-shaped upstream answers to the client with minimal work.

Non-streaming bodies are parsed once (orjson) for the shape check and the usage, and
relayed as the upstream's bytes with only the model name swapped (:func:`relay_completion_body`);
a body where that swap is not provably safe is serialised again, exactly (:func:`dumps_exact`).
Streams are relayed per network read, not per event: the
read is cut into whole events by the shared decoder (``backends.transport.sse``:
linear in bytes, each event capped by ``limits.max_event_bytes``), and the
complete events are rewritten with a few ``bytes`` scans and one ``replace``
(``"model":"<upstream id>"`` -> ``"model":"<public name>"``); only reads that carry
something the gateway must act on (a usage object, an error event, an unexpected
model shape, a line that is not ``data:``) are parsed event by event. This is what
keeps a 64-token stream at a small fraction of a Python proxy's budget.

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
(``data: {`` ... ``}``) and the learned choice end (:func:`_choice_end_of`), which also sends
the event that finishes a choice to the parse (where finishes are counted per choice). The
rest of an event's bytes are not proven JSON on the byte path (a parse of every event costs
a 64-token stream about 10% more CPU): damage inside an event with its structure intact is
relayed as sent (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from backends.base import Call, CompletionResult, CompletionStream, TokenUsage, usage_of
from backends.errors import UpstreamProtocolError, error_fields
from backends.exact_json import dumps_exact, loads_exact, loads_keeping_integers, may_hold_long_int
from backends.transport.base import UpstreamResponse
from backends.transport.sse import sse_data
from backends.transport.upstream_events import UpstreamEvents

__all__ = ["OpenAIStreamRelay", "relay_completion_body", "usage_of", "with_usage_null"]

_MAX_EVENT = 8 * 1024 * 1024  # limits.max_event_bytes' default


def relay_completion_body(
    data: bytes,
    call: Call[Any],
    backend: str,
    kind: str = "text_completion",
    *,
    items: str = "choices",
    read_usage: Callable[[Any], TokenUsage | None] = usage_of,
) -> CompletionResult:
    """An upstream ``text_completion`` (or ``chat.completion``, an embeddings ``list``: ``kind``, whose
    array is ``items``) body, renamed to the client's model.

    The client gets the upstream's bytes (numbers, escapes, spacing and key order as sent)
    with only the model name swapped; the parse is for the shape check and the usage.

    The swap is made on the bytes when the body holds exactly one ``"model"`` token,
    followed by ``:`` (or ``: ``) and the upstream id as orjson spells it, and no ``\\u006``
    escape. Why that is safe: a quote inside a JSON string is escaped, so ``"model"`` occurs
    only as a whole string token (a key, or a value, which the count catches); the one other
    way to spell the top-level key escapes one of its letters, all ``\\u006X``. So the one
    token is the top-level key, and a JSON string token ends at its own closing quote: the
    swap replaces exactly the value. Anything else is serialised again, exactly.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict) or not isinstance(obj.get(items), list):
        raise UpstreamProtocolError(f"the upstream sent a body that is not a {kind}", backend=backend)
    usage = read_usage(obj.get("usage"))
    upstream = obj.get("model")
    # Inline, not a helper: this is every non-streamed request's path (calls per request count).
    # One "model" token: the first is the last (one pass over the body, not a count and two more).
    at = data.find(b'"model"')
    if type(upstream) is str and at >= 0 and data.rfind(b'"model"') == at and not (b"\\" in data and b"\\u006" in data):
        value = orjson.dumps(upstream)
        start = at + 8  # past '"model":'; orjson and Python's json write no space before the colon
        if data[start : start + 1] == b" ":
            start += 1
        if data[at + 7 : at + 8] == b":" and data.startswith(value, start):  # the key's value, exactly
            end = start + len(value)
            return CompletionResult(data[:start] + orjson.dumps(call.public_model) + data[end:], usage)
    return CompletionResult(_renamed_reserialised(data, obj, call.public_model, backend), usage)


def _renamed_reserialised(data: bytes, obj: dict[str, Any], public: str, backend: str) -> bytes:
    """The body serialised again with the client's model name (the byte swap did not apply)."""
    if may_hold_long_int(data):
        # orjson read integers beyond 64 bits as floats: read the body again, keeping them.
        obj = loads_exact(data, backend)
    obj["model"] = public
    return dumps_exact(obj, backend)


_DONE_TAIL = b"\n\ndata: [DONE]\n\n"  # how a normal stream's last read ends: a whole event after whole events
_DONE_ALONE = b"data: [DONE]\n\n"  # or the whole of it
_DONE_CUT = -len(_DONE_ALONE)
# Where a usage object may be: its key, unquoted (a search for a pattern ending in a letter skips
# ahead faster than for one ending in a quote, 2.7 against 3.4 us over a 64-token stream's 11 KB).
# Also in generated text, where it sends that event to the parse: slower, never wrong.
_USAGE_KEY = b"prompt_tokens"


def _choice_end_of(block: bytes, start: int = 0) -> bytes | None:
    """The bytes from a null ``finish_reason`` to the ``]`` after it in the event at ``start``, if any.

    Why they vouch for an event whose bytes hold them (``OpenAIStreamRelay._rename``): in JSON
    text ``"finish_reason":null`` can only be structure (quotes inside strings are escaped), and
    the bytes from it to the ``]`` that closes ``choices`` are the same in every ordinary chunk
    of one upstream. An event cut anywhere before that ``]`` lacks them; one cut after it ends
    in something other than ``}`` (what follows ``choices`` is scalars in every upstream we
    know; a usage object is parsed anyway), which the framing check catches. A choice that
    finishes, or any other shape, does not hold them and is parsed.
    """
    first = block.find(b"\n", start)
    at = block.find(b'"finish_reason":null', start, first)
    if at < 0:
        at = block.find(b'"finish_reason": null', start, first)
    close = block.find(b"]", at, first) if at >= 0 else -1
    return block[at : close + 1] if close >= 0 else None


class OpenAIStreamRelay(UpstreamEvents[bytes], CompletionStream):
    """A :class:`CompletionStream` over an OpenAI-shaped SSE upstream (OpenAI, vLLM)."""

    _cut_message = "the upstream closed the stream before [DONE]"
    relayed_events: int
    _done_early = False  # the parse met a [DONE] before the read's end: nothing after it is relayed
    _usage_event: bytes | None = None  # the client's usage chunk, held until the end
    # What the stream's first ordinary event teaches (:meth:`_learn`); class defaults until then, so a
    # stream pays no store for them. The upstream's bytes from a null finish_reason to "]":
    _choice_end: bytes | None = None
    _finish_key = b'"finish_reason":"'  # and of a finish reason, and the bytes after it
    _finish_tail = b"}]"
    _head = b""  # the event's bytes from its start through the upstream's model key
    _frame: bytes | None = None  # what lies between two events: "}", the separator and the head (:meth:`_rename`)
    _frame_tail: bytes | None = None  # the choice end and "}\n\n", when an event ends with its choices
    _same = False  # the head's model key is already the client's (nothing to rename)
    _fused: bytes | None = None  # the choice end, "}" and the next event's start (when the head varies)
    _fused_end = _fused_finish = b""
    _peeled = False  # the stream's first event was parsed apart (:meth:`_split`)

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

    def _rename(self, block: bytes) -> bytes:
        """Ordinary events: swap the upstream model id for the public name, bytes only.

        Self-check first (anything else is parsed): data events only, each one line holding
        one JSON object (``data: {`` ... ``}``), so every LF is one of a ``}\n\ndata: {``
        between events or of the final ``}\n\n`` (no ``id:``/``event:``/``retry:`` field,
        comment, bare or multi-line ``data`` line); each event holds the upstream's own bytes
        from a null ``finish_reason`` to the end of ``choices`` (:func:`_choice_end_of`); as many
        ``"model":<upstream id>`` keys as events, all spelled one way. An event without one
        (a ``[DONE]``, an error event, a choice that finishes, garbage, a cut one) or with
        another model is parsed. The replace itself counts the renamed keys (its length
        change) when the two names differ in length. The event count is also what the relay
        reports as relayed (``relayed_events``): the handler does not scan the block again.

        The usual read is checked by one count more than its LFs (the *frame*, :meth:`_learn`):
        the bytes between two events of this stream, ``}``, the separator and the next event's
        head (its start through the upstream's model key, the same in every chunk of one
        upstream's stream: id, object, created, model), led by the choice end when the events
        end with their choices (vLLM's layout). Every LF of the read is one of a frame's or of
        the final ``}\n\n`` (twice the frames plus two), the read starts with the head and ends
        as the events do: so each event is one line with its model key where the first had it
        and (in vLLM's layout) the choice end just before its ``}``. A read that misses the frame
        takes the checks above; one that passes them all the same (an upstream whose heads vary:
        ``created`` ticking, say) turns the frame off for the rest of the stream.
        """
        frame = self._frame
        if frame is None and self._choice_end is None and self._one_choice:
            frame = self._learn(block, 0)  # the stream's first read: its first event says how they look
        if frame is not None:
            lines = block.count(b"\n")
            events = lines >> 1
            if (
                lines == events << 1
                and (events == 1 or block.count(frame) == events - 1)
                and block.startswith(self._head)
            ):
                tail = self._frame_tail
                if tail is not None:  # the frames vouched for every event's choice end but the last's
                    vouched = block.endswith(tail) or (
                        block.endswith(self._fused_finish) and self._finishes_here(block, events, events - 1)
                    )
                else:  # OpenAI's layout: the choice end is counted
                    end = self._choice_end
                    held = -1 if end is None else block.count(end)
                    vouched = block.endswith(b"}\n\n") and (held == events or self._finishes_here(block, events, held))
                if vouched:
                    if self._same:  # every event's model key is the head's, already the client's
                        self.relayed_events += events
                        return block
                    return self._swap(block, events)
        fused = self._fused
        if fused is not None:  # one count frames the events and vouches for each
            events = block.count(fused) + 1
            if (
                block.count(b"\n") == 2 * events
                and block.startswith(b"data: {")
                and (
                    block.endswith(self._fused_end)
                    or (block.endswith(self._fused_finish) and self._finishes_here(block, events, events - 1))
                )
            ):
                self._frame = None  # framed and vouched, but the heads differ: the frame no longer pays
                return self._swap(block, events)
        if block.startswith(b"data: {"):
            between = b"}\n\ndata: {"
        elif block.startswith(b"data:{"):
            between = b"}\n\ndata:{"
        else:
            return self._process_slow(block)
        events = block.count(between) + 1
        if block.count(b"\n") != 2 * events or not block.endswith(b"}\n\n") or not self._one_choice:
            return self._process_slow(block)
        end = self._choice_end
        held = -1 if end is None else block.count(end)
        if held != events and not self._finishes_here(block, events, held):
            return self._split(block, events, held)
        self._frame = None  # (as for the fused count above)
        return self._swap(block, events)

    def _swap(self, block: bytes, events: int) -> bytes:
        """``events`` framed, vouched events: the upstream's model key swapped, when each has it once."""
        for old in (self._old, self._old_spaced):
            grow = len(self._new) - len(old)
            if grow:
                if old not in block:  # found in the first event when it is the spelling: no full scan
                    continue
                out = block.replace(old, self._new)
                if len(out) - len(block) == grow * events:
                    self.relayed_events += events
                    return out
            elif block.count(old) == events:
                self.relayed_events += events
                return block if old == self._new else block.replace(old, self._new)
        return self._process_slow(block)

    def _finishes_here(self, block: bytes, events: int, held: int) -> bool:
        """Whether the read's last event is the one that finishes the choice, in the upstream's own
        spelling, and every event before it is vouched (the usual last read of a stream).

        The finishing event holds ``"finish_reason":"<reason>"`` followed by the same bytes as
        the choice end after its ``null`` (``}]`` for OpenAI; vLLM's ``,"stop_reason":null...``):
        cut anywhere before they end, it fails; after, the framing catches it. The choice has
        ended (one choice: :meth:`_end` needs no index).
        """
        end = self._choice_end
        if end is None or held != events - 1:
            return False
        last = block.rfind(b"\n\ndata:") + 2  # 1 when the read is one event; then the whole read
        if last == 1:
            last = 0
        key = self._finish_key
        at = block.find(key, last)
        if at < 0 or block.find(end, last) >= 0:
            return False
        close = block.find(b'"', at + len(key))
        if close < 0 or b"\\" in block[at:close] or not block.startswith(self._finish_tail, close + 1):
            return False
        self._open.clear()
        self._ended.add(0)
        return True

    def _split(self, block: bytes, events: int, held: int) -> bytes:
        """A read whose events the learned choice end does not all vouch for: the last event parsed
        when only it lacks it (a finish in another spelling), else the choice end learned again from
        this read's first event (an upstream that changed its spelling) or its second (the stream's first
        event shaped apart), else parsed."""
        end = self._choice_end
        if end is not None and events > 1 and held == events - 1:
            last = block.rfind(b"\n\ndata:") + 2
            if block.find(end, last) < 0:
                head = self._rename(block[:last])
                if self._pending is not None or self._done_early:
                    return head
                return head + self._process_slow(block[last:])
        learned = _choice_end_of(block)
        if learned is not None and learned != end:
            self._learn(block, 0, learned)
            return self._rename(block)
        if events > 1 and not self._peeled:
            # A stream's first event may end its choice apart from the rest (vLLM's role chunk has
            # no token_ids key): it is parsed and the spelling learned from the next. Once per
            # stream, so a read of shapes that keep changing costs a parse, not a scan per event.
            self._peeled = True
            at = block.find(b"\n\ndata:") + 2
            learned = _choice_end_of(block, at)
            if learned is not None and learned != end:
                head = self._process_slow(block[:at])
                if self._pending is not None or self._done_early:
                    return head
                self._learn(block, at, learned)
                return head + self._rename(block[at:])
        return self._process_slow(block)

    def _learn(self, block: bytes, start: int, end: bytes | None = None) -> bytes | None:
        """The upstream's spelling, from the event at ``start`` (its choice end ``end`` when already
        found, :func:`_choice_end_of`): of an ordinary choice's end, of a finishing one's key and tail,
        of the event's head and so of the frame between two events (:meth:`_rename`), returned (None
        when the event holds no choice end, or no model key before it). When that event ends with
        its choices (``...]}``, vLLM's layout) the frame starts with the choice end."""
        line = block.find(b"\n", start)
        if end is None:
            at = block.find(b'"finish_reason":null', start, line)
            if at < 0:
                at = block.find(b'"finish_reason": null', start, line)
            close = block.find(b"]", at, line) if at >= 0 else -1
            if close < 0:
                return None
            end = block[at : close + 1]
        else:
            at = block.find(end, start, line)
        self._choice_end = end
        null = end.index(b"null") + 4
        self._finish_key = end[: null - 4] + b'"'
        self._finish_tail = end[null:]
        self._fused_end = end + b"}\n\n"
        self._fused_finish = self._finish_tail + b"}\n\n"
        ends_with_choices = block.startswith(b"}\n\n", at + len(end))
        self._fused = end + b"}\n\ndata: {" if ends_with_choices and block.startswith(b"data: {", start) else None
        spelled = self._old
        model = block.find(spelled, start, at)
        if model < 0:
            spelled = self._old_spaced
            model = block.find(spelled, start, at)
        if model < 0:  # another spelling (the parse learns it) or the key after the choices: no frame
            self._frame = None
            return None
        self._head = head = block[start : model + len(spelled)]
        self._same = spelled == self._new
        self._frame_tail = self._fused_end if ends_with_choices else None
        self._frame = frame = (self._fused_end if ends_with_choices else b"}\n\n") + head
        return frame

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

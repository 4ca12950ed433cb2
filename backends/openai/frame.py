"""The OpenAI relay's byte path: what a stream's first ordinary event teaches, and the reads it vouches for.

:class:`EventFrame` is the half of :class:`~backends.openai.relay.OpenAIStreamRelay` that passes a
read of ordinary events on with a few ``bytes`` scans and one ``replace`` (or none: a stream read by
the gateway itself, or whose model name is already the client's). From the stream's first ordinary
event it learns the upstream's spelling (:meth:`EventFrame._learn`): the bytes from a null
``finish_reason`` to the end of ``choices`` (the *choice end*, :func:`choice_end_of`), of a
finishing choice's key and tail, and the event's head through the model key, so the *frame*
between two events. A read whose events all carry them is framed and vouched by a count or two
(:meth:`EventFrame._rename`); any other read, or event, goes to the relay's parse
(``_process_slow``), where finishes are counted per choice. Why the scans are safe: the relay's
module docstring.
"""

from __future__ import annotations

from typing import Any

from backends.errors import UpstreamError

__all__ = ["EventFrame", "choice_end_of"]


def choice_end_of(block: bytes, start: int = 0) -> bytes | None:
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


class EventFrame:
    """The byte path of :class:`~backends.openai.relay.OpenAIStreamRelay` (module docstring); a mixin."""

    # The relay's state the byte path reads and sets (backends.openai.relay).
    _pending: UpstreamError | None
    _done_early: bool
    _one_choice: bool
    _old: bytes
    _old_spaced: bytes
    _new: bytes
    _open: set[Any]
    _ended: set[Any]
    relayed_events: int
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

    def _process_slow(self, block: bytes) -> bytes:
        """The relay's parse of ``block``, event by event (``OpenAIStreamRelay._process_slow``)."""
        raise NotImplementedError

    def _rename(self, block: bytes) -> bytes:
        """Ordinary events: swap the upstream model id for the public name, bytes only.

        Self-check first (anything else is parsed): data events only, each one line holding
        one JSON object (``data: {`` ... ``}``), so every LF is one of a ``}\n\ndata: {``
        between events or of the final ``}\n\n`` (no ``id:``/``event:``/``retry:`` field,
        comment, bare or multi-line ``data`` line); each event holds the upstream's own bytes
        from a null ``finish_reason`` to the end of ``choices`` (:func:`choice_end_of`); as many
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
        learned = choice_end_of(block)
        if learned is not None and learned != end:
            self._learn(block, 0, learned)
            return self._rename(block)
        if events > 1 and not self._peeled:
            # A stream's first event may end its choice apart from the rest (vLLM's role chunk has
            # no token_ids key): it is parsed and the spelling learned from the next. Once per
            # stream, so a read of shapes that keep changing costs a parse, not a scan per event.
            self._peeled = True
            at = block.find(b"\n\ndata:") + 2
            learned = choice_end_of(block, at)
            if learned is not None and learned != end:
                head = self._process_slow(block[:at])
                if self._pending is not None or self._done_early:
                    return head
                self._learn(block, at, learned)
                return head + self._rename(block[at:])
        return self._process_slow(block)

    def _learn(self, block: bytes, start: int, end: bytes | None = None) -> bytes | None:
        """The upstream's spelling, from the event at ``start`` (its choice end ``end`` when already
        found, :func:`choice_end_of`): of an ordinary choice's end, of a finishing one's key and tail,
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

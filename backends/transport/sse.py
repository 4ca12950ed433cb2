"""The one decoder of upstream event streams: SSE (``\\n\\n``-separated) and NDJSON (``\\n``).

:class:`EventBuffer` turns network reads into blocks of whole events, per read, without
parsing them (the relays decide which events are worth a parse). Its contract:

- ``feed(chunk)`` returns every complete event the stream holds so far, as one block
  ending in the separator (``b""`` while the first event is still incomplete); CRLF line
  ends and bare CR line ends are normalised to LF, also when a CR and its LF arrive in
  different reads (a read's final CR counts as a line end at once, a leading LF next is dropped);
- cost is linear in the bytes fed: an incomplete event is kept as a list of reads and
  joined once, when its end arrives; only the new read is searched for a separator;
- an event (the incomplete tail, or a whole one in a read) longer than ``max_event``
  bytes raises :class:`~backends.errors.UpstreamTooLargeError`: the gateway holds at most
  that much of an event the upstream never ends.

:func:`sse_data` reads the ``data`` of the SSE events in a block (other fields, comments
and keep-alives are not data: a relay forwards data only).
"""

from __future__ import annotations

from backends.errors import UpstreamTooLargeError

__all__ = ["EventBuffer", "sse_data"]


class EventBuffer:
    """Whole events out of a stream of reads (see the module docstring). Not thread-safe."""

    __slots__ = ("_backend", "_cr", "_max", "_parts", "_sep", "_size")

    def __init__(self, sep: bytes, max_event: int, backend: str) -> None:
        self._sep = sep
        self._max = max_event
        self._backend = backend
        self._parts: list[bytes] = []  # the incomplete event, as it arrived
        self._size = 0
        self._cr = False  # the last read ended in a CR whose LF may be next

    def feed(self, chunk: bytes) -> bytes:
        if not self._parts and chunk.endswith(self._sep) and not self._cr and b"\r" not in chunk:
            # The common read: whole events, nothing held (no copy, one scan for CR).
            if len(chunk) > self._max and _longest(chunk, self._sep) > self._max:
                self._too_large()
            return chunk
        if self._cr:  # the last read's final CR already ended its line: an LF here is that line end's
            self._cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\r" in chunk:
            # CRLF and a bare CR are both SSE line ends (a CR cannot be inside JSON text). A read's
            # final CR ends its line now (held, a last event ending in CR would never complete).
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not chunk:
            return b""
        sep = self._sep
        parts = self._parts
        # A separator may start in the kept tail (its last byte) and end in this read.
        overlap = parts[-1][1 - len(sep) :] if parts and len(sep) > 1 else b""
        window = overlap + chunk if overlap else chunk
        at = window.rfind(sep)
        if at < 0:
            parts.append(chunk)
            self._size += len(chunk)
            if self._size > self._max:
                self._too_large()
            return b""
        shift = len(sep) - len(overlap)
        end = at + shift
        head, rest = chunk[:end], chunk[end:]
        if parts:
            first = window.find(sep) + shift  # where the held event ends in this read
            if self._size + first - len(sep) > self._max:
                self._too_large()
            parts.append(head)
            block = b"".join(parts)
            parts.clear()
        else:
            block = head
        if len(head) > self._max and _longest(head, sep) > self._max:
            self._too_large()
        if rest:
            parts.append(rest)
        self._size = len(rest)
        if self._size > self._max:
            self._too_large()
        return block

    def pending(self) -> int:
        """Bytes of the incomplete event held now."""
        return self._size

    def _too_large(self) -> None:
        self._parts.clear()
        self._size = 0
        raise UpstreamTooLargeError(
            f"an upstream stream event is larger than {self._max} bytes (limits.max_event_bytes)",
            backend=self._backend,
        )


def _longest(block: bytes, sep: bytes) -> int:
    longest = start = 0
    while True:
        end = block.find(sep, start)
        if end < 0:
            return max(longest, len(block) - start)
        longest = max(longest, end - start)
        start = end + len(sep)


def sse_data(block: bytes) -> list[bytes]:
    """The ``data`` of each SSE event in a block of whole events (events without data skipped).

    Per the SSE format, an event's ``data:`` lines are joined with LF and one space after the
    colon is dropped; ``event:``, ``id:``, ``retry:`` and ``:`` comment lines are not data.
    """
    out: list[bytes] = []
    for event in block.split(b"\n\n"):
        if not event:
            continue
        lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines))
    return out

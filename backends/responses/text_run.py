"""The chat bridge's learned text shape, and a run of plain text events written at once.

A stream's plain text events (one choice, a piece of text, nothing else) differ only in their
content string: :func:`learn` keeps the bytes around it, so later ones are known by their ends
(and their string relayed as the upstream escaped it); :func:`write_run` writes a run of them in
one read with one ``%`` format. Used by :class:`~backends.responses.events.ChatResponseEvents`.
"""

from __future__ import annotations

import re
from io import BytesIO

import orjson

from backends.responses.lifecycle_bytes import NO_LOGPROBS

__all__ = ["RUN", "Shape", "learn", "write_run"]

# Where a text delta's template (lifecycle_bytes.delta_template) has its string's ``%b``: before NO_LOGPROBS.
_STRING = -2 - len(NO_LOGPROBS)
RUN = 3  # plain text events a read must still hold after one for a run of them to be written at once

# A JSON string (and the blanks before it), as a text event's content is written.
_JSON_STRING = re.compile(rb'\s*"(?:[^"\\]|\\.)*"')
_CONTENT_KEY = b'"content":'
_CONTENT_KEY_LEN = len(_CONTENT_KEY)

# A plain text event's shape (learn): the bytes before and after its string, their lengths, and
# what lies between two such events: after, separator, before (write_run); after and the separator.
Shape = tuple[bytes, bytes, int, int, bytes, bytes]


def learn(raw: bytes) -> Shape | None:
    """The shape of a plain text event (its bytes around its content string); None when
    ``"content":`` is not there exactly once or the event spans lines (then no shape is kept).
    A key is JSON structure, never generated text (quotes inside strings are escaped)."""
    if raw.count(_CONTENT_KEY) != 1 or b"\n" in raw:
        return None
    start = raw.index(_CONTENT_KEY) + _CONTENT_KEY_LEN
    match = _JSON_STRING.match(raw, start)
    if match is None:
        return None
    before, after = raw[:start], raw[match.end() :]
    if not after:
        return None
    return before, after, start, len(after), after + b"\n\n" + before, after + b"\n\n"


def write_run(
    chunk: bytes, start: int, shape: Shape, template: bytes, seq: int, out: list[bytes]
) -> tuple[int, int, str]:
    """The plain text events of ``chunk`` from ``start`` (where one begins) written at once with
    ``template`` (the part's, :func:`~backends.responses.lifecycle_bytes.delta_template`): how
    many, where the next event begins, and their text; ``(0, start, "")`` when the loop is to take
    them one by one.

    The usual read (a fast upstream's: plain text events, then at most a finish and the usage
    chunk) is taken to its last event that ends in ``after``: its lines (cut by ``readlines``, a
    ``memchr`` each) less the shape's ``before`` and ``after`` are the strings, and they are
    plain text events when (1) ``before``, the strings joined by the shape's middle (``after``,
    separator, ``before``), then ``after`` and the separator are those bytes exactly; and (2) each
    string is one JSON string: read together as one JSON array, they give as many strings as
    lines (an empty piece, or one with two values, gives no array of that length), and the array
    holds no line feed (each lies within one event). A read with another event among its plain
    ones fails (1) and is cut by :func:`_write_pieces`. The events are one ``%`` of the template's
    bytes around the strings, which gives each its sequence number (their ``%`` doubled): no
    object per event but its line and its string.
    """
    cut, back = shape[2], -shape[3] - 1
    stop = chunk.rfind(shape[5], start) + shape[3] + 2  # after the last event that ends in ``after`` and "\n\n"
    strings = [line[cut:back] for line in BytesIO(chunk[start:stop]).readlines()[::2]]
    taken = len(strings)
    if taken < 2:  # (no other event in the read ends in ``after``)
        return 0, start, ""
    if chunk[start + cut : stop - shape[3] - 2] != shape[4].join(strings):
        return _write_pieces(chunk, start, shape, template, seq, out)
    return _written(strings, taken, start, stop, template, seq, out)


def _written(
    strings: list[bytes], taken: int, start: int, stop: int, template: bytes, seq: int, out: list[bytes]
) -> tuple[int, int, str]:
    """The events of a run whose ``taken`` strings lie each between the shape's ends (:func:`write_run`'s
    (1)), once they are JSON strings without a line feed (its (2)): how many, ``stop``, their text; or
    ``(0, start, "")``."""
    array = b"[" + b",".join(strings) + b"]"
    if b"\n" in array:
        return 0, start, ""
    try:
        texts = orjson.loads(array)
        text = "".join(texts)  # (a TypeError for anything but strings)
    except (orjson.JSONDecodeError, TypeError):
        return 0, start, ""
    if len(texts) != taken:
        return 0, start, ""
    head, end = template[:_STRING], template[_STRING + 2 :]  # delta_template's: head (with %d), the string, end
    if b"%" in array:  # (the template's own are doubled already)
        strings = [string.replace(b"%", b"%%") for string in strings]
    out.append((head + (end + head).join(strings) + end) % tuple(range(seq, seq + taken)))
    return taken, stop, text


def _write_pieces(
    chunk: bytes, start: int, shape: Shape, template: bytes, seq: int, out: list[bytes]
) -> tuple[int, int, str]:
    """:func:`write_run` for a read with another event among its plain ones: the run ends before it.

    The rest of the read is cut after each ``after`` and separator; the pieces up to the last
    such cut, or up to one that spans two events (an event of another kind between: it holds
    a separator), are taken. They are plain text events when (1) each but the first starts with
    ``before``: the cuts are the only places the shape's middle (``after``, separator,
    ``before``) can be, since ``after`` holds no line feed, so its count over them says so; and
    (2) as :func:`write_run`'s.
    """
    pieces = chunk[start:].split(shape[5])
    stop = len(chunk) - len(pieces.pop())  # what follows the last event ending in ``after``: the loop's
    taken = len(pieces)
    if taken < 2:
        return 0, start, ""
    cut = shape[2]
    strings = [piece[cut:] for piece in pieces]
    array = b"[" + b"\n,".join(strings) + b"]"  # (JSON allows the line feed before a comma)
    if array.count(b"\n") != taken - 1:  # a piece spans two events: the run ends before it
        spans = array.find(b"\n\n")
        taken = array.count(b"\n,", 0, spans) if spans > 0 else 0
        if taken < 2:
            return 0, start, ""
        strings = strings[:taken]
        stop = start + len(b"".join(pieces[:taken])) + taken * len(shape[5])
    if chunk.count(shape[4], start, stop) != taken - 1:
        return 0, start, ""
    return _written(strings, taken, start, stop, template, seq, out)

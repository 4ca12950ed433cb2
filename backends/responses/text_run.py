"""The chat bridge's learned text shape, and a run of plain text events written at once.

A stream's plain text events (one choice, a piece of text, nothing else) differ only in their
content string: :func:`learn` keeps the bytes around it, so later ones are known by their ends
(and their string relayed as the upstream escaped it); :func:`write_run` writes a run of them in
one read as one list of pieces (the read's one join takes them); :func:`opening_shape` learns it
from the event that opens a text part, and :func:`finish_of` reads a stream's last text event, the
same bytes but for its finish. Used by :class:`~backends.responses.events.ChatResponseEvents`.
"""

from __future__ import annotations

import re
from io import BytesIO
from operator import itemgetter
from typing import Any

import orjson

from backends.responses.lifecycle_bytes import NO_LOGPROBS, TEXT_HEAD

__all__ = ["RUN", "Shape", "finish_of", "learn", "opening_shape", "write_run"]

# The sequence numbers' bytes, made once: a run's events take theirs by one slice.
_NUMBERED = 4096
_NUMBERS = [b"%d" % number for number in range(_NUMBERED)]
# A text delta's bytes from the end of the one before it through its sequence number (NO_LOGPROBS, TEXT_HEAD,
# the number), made as runs reach them (up to _NUMBERED): a run's events take theirs by one slice, so each
# event is three pieces of the read's join, not four (each piece costs the join about what a dozen bytes do).
_HEADED: list[bytes] = []
RUN = 3  # plain text events a read must still hold after one for a run of them to be written at once

# A JSON string (and the blanks before it), as a text event's content is written.
_JSON_STRING = re.compile(rb'\s*"(?:[^"\\]|\\.)*"')
_CONTENT_KEY = b'"content":'
_CONTENT_KEY_LEN = len(_CONTENT_KEY)

# A plain text event's shape (learn): the bytes before and after its string, their lengths, and
# what lies between two such events: after, separator, before (write_run); after and the separator.
Shape = tuple[bytes, bytes, int, int, bytes, bytes]


def learn(raw: bytes, text: Any = None) -> Shape | None:
    """The shape of a plain text event (its bytes around its content string); None when
    ``"content":`` is not there exactly once or the event spans lines (then no shape is kept).
    A key is JSON structure, never generated text (quotes inside strings are escaped).
    ``text``: the event's content as read, where the caller has it (anything but a str: not had)."""
    if raw.count(_CONTENT_KEY) != 1 or raw.find(b"\n") >= 0:  # (find, not ``in``: a cheaper call)
        return None
    start = raw.index(_CONTENT_KEY) + _CONTENT_KEY_LEN
    # The string's end: where the upstream escaped the text as orjson does (the usual), its JSON's
    # (one check, no pattern: the match below would end at the same place, its first unescaped
    # quote being the last of that JSON); else the pattern's.
    dumped = orjson.dumps(text) if type(text) is str else b""
    if dumped and raw.startswith(dumped, start):
        end = start + len(dumped)
    else:
        match = _JSON_STRING.match(raw, start)
        if match is None:
            return None
        end = match.end()
    before, after = raw[:start], raw[end:]
    if not after:
        return None
    return before, after, start, len(after), after + b"\n\n" + before, after + b"\n\n"


def write_run(
    chunk: bytes, start: int, shape: Shape, head: bytes, where: bytes, seq: int, out: list[bytes]
) -> tuple[int, int, str]:
    """The plain text events of ``chunk`` from ``start`` (where one begins) written at once as the
    part's text deltas (``head``: a delta's bytes before its sequence number, ``where``: between it
    and its string, as ResponseWriter._fast holds them): how many, where the next event begins, and
    their text; ``(0, start, "")`` when the loop is to take them one by one.

    The usual read (a fast upstream's: plain text events, then at most a finish and the usage
    chunk) is taken to its last event that ends in ``after``: its lines (cut by ``readlines``, a
    ``memchr`` each) less the shape's ``before`` and ``after`` are the strings, and they are
    plain text events when (1) ``before``, the strings joined by the shape's middle (``after``,
    separator, ``before``), then ``after`` and the separator are those bytes exactly; and (2) each
    string is one JSON string: read together as one JSON array, a line feed before each comma, they
    give as many strings as lines (an empty piece, or one with two values, gives no array of that
    length; a string one piece opens and the next closes would hold a line feed: no JSON), and no
    piece holds a line feed of its own (each lies within one event). A read with another event among its plain
    ones fails (1) and is cut by :func:`_write_pieces`. (A split at the middles would cost more: a
    search for a needle that long prepares it again at each cut.)
    """
    cut, back = shape[2], -shape[3] - 1
    stop = chunk.rfind(shape[5], start) + shape[3] + 2  # after the last event that ends in ``after`` and "\n\n"
    # The read's lines from ``start`` up to the last one's "\n" before ``stop``: readlines' size hint ends
    # them there. BytesIO shares the read's buffer and the comparison below is made in place: the read
    # (the whole answer, for a fast upstream) is not copied (each copy costs as much as a dozen calls).
    # Each event line's string is cut out by map (a slice per line, no bytecode per event).
    lines = BytesIO(chunk)
    lines.seek(start)
    strings = list(map(itemgetter(slice(cut, back)), lines.readlines(stop - start - 1)[::2]))
    taken = len(strings)
    if taken < 2:  # (no other event in the read ends in ``after``)
        return 0, start, ""
    middle = shape[4].join(strings)
    if len(middle) != stop - start - cut - shape[3] - 2 or not chunk.startswith(middle, start + cut):
        return _write_pieces(chunk, start, shape, head, where, seq, out)
    return _written(strings, taken, start, stop, head, where, seq, out)


def _written(
    strings: list[bytes], taken: int, start: int, stop: int, head: bytes, where: bytes, seq: int, out: list[bytes]
) -> tuple[int, int, str]:
    """The events of a run whose ``taken`` strings lie each between the shape's ends (:func:`write_run`'s
    (1)), once they are JSON strings without a line feed (its (2)): how many, ``stop``, their text; or
    ``(0, start, "")``."""
    # A line feed before each comma (JSON allows one there, never inside a string): a string left open by
    # one piece and closed by the next (each then no JSON string) fails the read instead of passing as one.
    array = b"[" + b"\n,".join(strings) + b"]"
    if array.count(b"\n") != taken - 1:  # (a piece with one of its own)
        return 0, start, ""
    try:
        texts = orjson.loads(array)
        text = "".join(texts)  # (a TypeError for anything but strings)
    except (orjson.JSONDecodeError, TypeError):
        return 0, start, ""
    if len(texts) != taken:
        return 0, start, ""
    # The events as their pieces (head, sequence number, where, string; NO_LOGPROBS and the next head
    # between two), laid out by slice assignments: no bytecode, and no format, per event. They go into
    # ``out`` as they are: the caller joins its read's once (no copy of the run's bytes of its own).
    end = seq + taken
    if head is TEXT_HEAD and end <= _NUMBERED:
        if end > len(_HEADED):
            _HEADED.extend([NO_LOGPROBS + TEXT_HEAD + number for number in _NUMBERS[len(_HEADED) : end]])
        pieces = [where] * (3 * taken + 1)
        pieces[0::3] = [head + _NUMBERS[seq], *_HEADED[seq + 1 : end], NO_LOGPROBS]
        pieces[2::3] = strings
        out += pieces
        return taken, stop, text
    numbers = _NUMBERS[seq:end] if end <= _NUMBERED else list(map(b"%d".__mod__, range(seq, end)))
    pieces = [where] * (4 * taken + 1)
    pieces[0::4] = [head, *[NO_LOGPROBS + head] * (taken - 1), NO_LOGPROBS]
    pieces[1::4] = numbers
    pieces[3::4] = strings
    out += pieces
    return taken, stop, text


def _write_pieces(
    chunk: bytes, start: int, shape: Shape, head: bytes, where: bytes, seq: int, out: list[bytes]
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
    return _written(strings, taken, start, stop, head, where, seq, out)


_NULL_FINISH = b'"finish_reason":null'
# The reasons a plain text event usually ends a stream with, and their bytes there.
_FINISHES = (("stop", b'"finish_reason":"stop"'), ("length", b'"finish_reason":"length"'))
# Each shape's ``after`` (what follows a plain text event's string: no id or time, so the same bytes for
# every stream of an upstream) and the endings of its last event with each finish (finish_of): made once.
_ENDINGS: dict[bytes, tuple[tuple[str, bytes], ...]] = {}
_MAX_ENDINGS = 64  # (a bound: an upstream whose events vary there, continuous usage say, makes one each)


def _endings(after: bytes) -> tuple[tuple[str, bytes], ...]:
    if len(_ENDINGS) >= _MAX_ENDINGS:
        _ENDINGS.clear()
    endings: tuple[tuple[str, bytes], ...] = ()
    if after.count(_NULL_FINISH) == 1:
        endings = tuple((reason, after.replace(_NULL_FINISH, given, 1)) for reason, given in _FINISHES)
    _ENDINGS[after] = endings
    return endings


def finish_of(chunk: bytes, pos: int, cut: int, shape: Shape) -> tuple[str, bytes, str] | None:
    """Where the event at ``chunk[pos:cut]`` (which starts as the shape's do) is a learned plain text
    event's bytes but for ``"finish_reason":null`` given as ``"stop"`` or ``"length"`` (nothing else
    differs, so it means what that event means with a finish, as the parse would read it): its text, its
    string as the upstream escaped it, and the finish reason; else None (the parse's way). A key is JSON
    structure (quotes in strings are escaped)."""
    endings = _ENDINGS.get(shape[1])
    if endings is None:
        endings = _endings(shape[1])
    for reason, ending in endings:
        if chunk.endswith(ending, pos, cut):
            piece = chunk[pos + shape[2] : cut - len(ending)]
            try:
                text = orjson.loads(piece)
            except orjson.JSONDecodeError:
                return None
            return (text, piece, reason) if type(text) is str else None
    return None


_ROLE_AND_CONTENT = b'{"role":"assistant","content":'
_CONTENT_ONLY = b'{"content":'


def opening_shape(obj: dict[str, Any], raw: bytes) -> Shape | None:
    """The shape of the plain text events to come (:func:`learn`), from ``raw``, the event ``obj`` that opened
    a text part, where it is one but for the role, which a stream's first event often adds: then from its
    bytes without it (the role member just before ``"content":``, the one key of that name (learn): the
    delta's); None where it is not one (a finish, logprobs, usage, another key or choice)."""
    if "usage" in obj and obj["usage"] is not None:
        return None
    try:
        (choice,) = obj["choices"]  # (a list, with the one that opened the part)
    except ValueError:  # another choice too
        return None
    if ("finish_reason" in choice and choice["finish_reason"] is not None) or (
        "logprobs" in choice and choice["logprobs"] is not None
    ):
        return None
    delta = choice["delta"]
    if len(delta) == 2 and "role" in delta and delta["role"] == "assistant":
        raw = raw.replace(_ROLE_AND_CONTENT, _CONTENT_ONLY, 1)
    elif len(delta) != 1:
        return None
    return learn(raw, delta["content"] if "content" in delta else None)

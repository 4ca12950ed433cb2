"""EventBuffer against every way a hostile upstream can cut and end its lines: each split offset,
LF / CRLF / bare-CR line ends (all legal SSE), NDJSON with CRLF. The blocks it gives, joined, must be
the stream's events with LF line ends, whatever the reads were."""

from __future__ import annotations

import pytest

from backends.transport.sse import EventBuffer, sse_data

EVENTS = b'data: {"a":1}\n\n: ping\n\nid: 3\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'
ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def _feed(buf: EventBuffer, reads: list[bytes]) -> bytes:
    return b"".join(buf.feed(r) for r in reads)


@pytest.mark.parametrize("end", list(ENDS))
def test_every_two_read_split_gives_the_same_events(end: str) -> None:
    stream = EVENTS.replace(b"\n", ENDS[end])
    for at in range(len(stream) + 1):
        buf = EventBuffer(b"\n\n", 1 << 20, "b")
        assert _feed(buf, [stream[:at], stream[at:]]) == EVENTS, (end, at)
        assert buf.pending() == 0


@pytest.mark.parametrize("end", list(ENDS))
def test_one_byte_reads_give_the_same_events(end: str) -> None:
    stream = EVENTS.replace(b"\n", ENDS[end])
    buf = EventBuffer(b"\n\n", 1 << 20, "b")
    assert _feed(buf, [stream[i : i + 1] for i in range(len(stream))]) == EVENTS
    assert sse_data(EVENTS) == [b'{"a":1}', b'{"b":\n2}', b"[DONE]"]


def test_a_last_event_ending_in_bare_cr_completes_without_another_read() -> None:
    # Held for a possible LF, the final CR would leave the last event incomplete at EOF.
    buf = EventBuffer(b"\n\n", 1 << 20, "b")
    assert buf.feed(b"data: [DONE]\r\r") == b"data: [DONE]\n\n"


def test_ndjson_crlf_split_between_cr_and_lf() -> None:
    buf = EventBuffer(b"\n", 1 << 20, "b")
    assert _feed(buf, [b'{"a":1}\r', b'\n{"b":2}\r', b"\n"]) == b'{"a":1}\n{"b":2}\n'

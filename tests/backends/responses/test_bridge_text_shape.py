"""The bridge's byte path for text deltas (backends/responses/events.py and text_run.py, ``learn``): a chat event
with the bytes of the stream's last plain text event around another JSON string is written
without a parse. Whatever the texts (quotes, backslashes, ``"content":`` inside them, escapes the
upstream chose), however the events are cut into reads, and whatever other events come between
(a finish, logprobs, usage, an extra key, another id), the events are those of the parsed path."""

from __future__ import annotations

import functools
import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from backends.errors import UpstreamProtocolError
from backends.responses import events as events_module
from backends.responses import text_run
from backends.responses.answer import ResponseFrame
from backends.responses.capabilities import chat_request_of
from backends.responses.events import ChatResponseEvents
from backends.responses.lifecycle_bytes import TEXT_HEAD, delta_template
from schemas.responses import ResponsesRequest
from tests.fakes import Reads

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}


def text_event(text: str, *, delta_first: bool = False, **choice: Any) -> dict[str, Any]:
    """A chat chunk of one text piece: vLLM writes ``index`` first, OpenAI-like servers ``delta``."""
    delta = {"delta": {"content": text}}
    fields = {**delta, "index": 0} if delta_first else {"index": 0, **delta}
    return {**HEAD, "choices": [{**fields, "logprobs": None, "finish_reason": None, **choice}]}


def others(delta_first: bool) -> list[dict[str, Any]]:
    """Events that are not a plain text delta, or are one written another way: each must go the
    parsed way (some differ from a plain one after its text only, and in the same number of bytes)."""
    event = functools.partial(text_event, delta_first=delta_first)
    return [
        event("!", finish_reason="stop"),
        event("", finish_reason="length"),  # (vLLM's last: no text)
        event("?", logprobs={"content": []}),
        {**event("u"), "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        {**event("x"), "system_fingerprint": "fp"},
        {**event("y"), "id": "chatcmpl-2"},
        event("other choice", index=1),
        {**HEAD, "choices": [{"index": 0, "delta": {"content": "z", "refusal": None}, "finish_reason": None}]},
    ]


def frame() -> ResponseFrame:
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", "stream": True})
    return ResponseFrame(request, "public", chat_request_of(request)[1])


async def translate(reads: list[bytes], shared: ResponseFrame) -> tuple[list[dict[str, Any]], bytes]:
    out = await written(reads, shared)
    return parse(out), out


async def written(reads: list[bytes], shared: ResponseFrame) -> bytes:
    out = b""
    async for piece in ChatResponseEvents(Reads(list(reads)), shared, "b"):
        out += piece
    return out


def parse(out: bytes) -> list[dict[str, Any]]:
    events = []
    for raw in out.split(b"\n\n"):
        if raw:
            kind, data = raw.split(b"\n", 1)
            event = orjson.loads(data.removeprefix(b"data: "))  # every event is JSON, on the byte path too
            assert kind == b"event: " + event["type"].encode()
            events.append(event)
    return _same_ids(events)


def _same_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Item ids are minted per run: compare them by position."""
    text = orjson.dumps(events).decode()
    for i, minted in enumerate(dict.fromkeys(_ids(events))):
        text = text.replace(minted, f"item{i}")
    return list(orjson.loads(text))


def _ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["item_id"] for e in events if "item_id" in e] + [
        e["item"]["id"] for e in events if isinstance(e.get("item"), dict)
    ]


def serialised(event: dict[str, Any], ascii_escapes: bool) -> bytes:
    body = json.dumps(event, separators=(",", ":")).encode() if ascii_escapes else orjson.dumps(event)
    return b"data: " + body + b"\n\n"


PIECES = st.sampled_from(["a", " ", '"', "\\", "é", "😀", "\n", '"content":', "}", "\u2028"])
TEXTS = st.lists(PIECES, max_size=5).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    plan=st.lists(st.one_of(TEXTS, st.integers(0, len(others(False)) - 1)), min_size=1, max_size=14),
    cuts=st.lists(st.integers(1, 4), max_size=14),
    ascii_escapes=st.booleans(),
    delta_first=st.booleans(),
    usual_first=st.booleans(),
)
# Another choice whose event differs from a plain one after its text only, in as many bytes.
@example(plan=["a", "b", 6], cuts=[], ascii_escapes=False, delta_first=True, usual_first=False)
@example(plan=["a", "b", 0, "c"], cuts=[1, 2], ascii_escapes=True, delta_first=False, usual_first=True)
async def test_the_byte_path_gives_the_parsed_paths_events(
    plan: list[str | int], cuts: list[int], ascii_escapes: bool, delta_first: bool, usual_first: bool
) -> None:
    other = others(delta_first)
    if usual_first:  # a plain text event with the role too: the shape is learned from it without the role
        first = text_event("A", delta_first=delta_first)
        first["choices"][0]["delta"] = {"role": "assistant", "content": "A"}
    else:
        choice = {"index": 0, "delta": {"role": "assistant", "content": "A"}, "finish_reason": None}
        first = {**HEAD, "choices": [choice]}
    chunks = [serialised(first, ascii_escapes)]
    chunks += [
        serialised(text_event(p, delta_first=delta_first) if isinstance(p, str) else other[p], ascii_escapes)
        for p in plan
    ]
    reads, at = [], 0
    for size in [*cuts, len(chunks)]:
        if at < len(chunks):
            reads.append(b"".join(chunks[at : at + size]))
            at += size
    shared = frame()
    fast, _ = await translate(reads, shared)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module, "learn", lambda raw, text=None: None)  # no shape kept: every event parsed
        parsed, _ = await translate(reads, shared)
    assert fast == parsed


async def test_most_text_events_take_the_byte_path() -> None:
    """A stream of plain text events is parsed once (the first, which opens the part and shows their
    shape, with or without the role), then written from bytes, its strings as the upstream escaped them."""
    chunks = [serialised(text_event(t), True) for t in ["A", "b", "é", 'say "hi"', "d"]]
    calls = 0
    real = orjson.loads

    def counting(data: Any) -> Any:
        nonlocal calls
        calls += len(data) > 40  # an event's whole JSON, not a string from it
        return real(data)

    role = text_event("A")
    role["choices"][0]["delta"] = {"role": "assistant", "content": "A"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module.orjson, "loads", counting)
        shared = frame()
        out = await written([b"".join(chunks)], shared)
        assert calls == 1
        calls = 0
        with_role = await written([serialised(role, True) + b"".join(chunks[1:])], shared)
        assert calls == 1
    assert parse(with_role) == parse(out)
    events = parse(out)
    assert b'"delta":"\\u00e9"' in out  # relayed as the upstream wrote it
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["A", "b", "é", 'say "hi"', "d"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["text"] == 'Abésay "hi"d'


@pytest.mark.parametrize("delta_first", [False, True])
@pytest.mark.parametrize(("finish", "last"), [("stop", "!"), ("length", ""), ("length", 'é"\\'), ("tool_calls", "x")])
async def test_the_finishing_text_event_takes_the_byte_path(delta_first: bool, finish: str, last: str) -> None:
    """The usual last event (a plain text event's bytes but for its ``stop``/``length`` finish) is not
    parsed, and gives the parsed path's events (an empty piece none); another finish reason is parsed."""
    first = text_event("A", delta_first=delta_first)
    first["choices"][0]["delta"] = {"role": "assistant", "content": "A"}
    chunks = [serialised(first, False), serialised(text_event("b", delta_first=delta_first), False)]
    chunks.append(serialised(text_event(last, delta_first=delta_first, finish_reason=finish), True))
    shared = frame()
    real = orjson.loads
    for reads in (chunks, [b"".join(chunks)]):
        parses: list[bytes] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(events_module.orjson, "loads", lambda data, seen=parses: seen.append(data) or real(data))
            out = await written(reads, shared)
        assert len([data for data in parses if len(data) > 40]) == (1 if finish != "tool_calls" else 2)  # events'
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(events_module, "learn", lambda raw, text=None: None)
            parsed = parse(await written(reads, shared))
        assert parse(out) == parsed
        final = parsed[-1]["response"]
        assert final["status"] == ("incomplete" if finish == "length" else "completed")
        assert final["output"][0]["content"][0]["text"] == "Ab" + last


@pytest.mark.parametrize("delta_first", [False, True])
@pytest.mark.parametrize("other", range(len(others(False))))
async def test_a_run_of_text_events_in_one_read_is_written_at_once(delta_first: bool, other: int) -> None:
    """Many plain text events in one read (a fast upstream's, or a stream read late) are written as
    one run (write_run), up to an event of another kind, which the run leaves to the parse; the events
    are those of the parsed path, and the events of a run cost one parse for all."""
    texts = ["A", "b", '"q"', "\\", "é", "x%dy", "😀", '"content":', "}", "\u2028"]
    first = {**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "A"}, "finish_reason": None}]}
    chunks = [serialised(first, False)]
    chunks += [serialised(text_event(t, delta_first=delta_first), False) for t in texts]
    chunks += [serialised(others(delta_first)[other], False)]
    chunks += [serialised(text_event(t, delta_first=delta_first), True) for t in texts]
    read = b"".join(chunks)
    calls = 0
    real = orjson.loads

    def counting(data: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(data)

    shared = frame()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module.orjson, "loads", counting)
        out = await written([read], shared)
    fast = parse(out)
    plain = serialised(text_event("b", delta_first=delta_first), False)
    after = plain[plain.index(b'"b"') + 3 :]
    if not serialised(others(delta_first)[other], False).endswith(after):
        assert calls <= 6  # the first two events, the other one (and the one after it), each run once
    else:  # one that differs from a plain one before its text only (another id, another choice) ends
        assert calls == 22  # the run's check: the read is taken event by event
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module, "learn", lambda raw, text=None: None)
        parsed = parse(await written([read], shared))
    assert fast == parsed
    done = next(e for e in fast if e["type"] == "response.output_text.done")
    assert done["text"].endswith("".join(texts))


RUN_PIECES = st.sampled_from(["a", " ", '"', "\\", "é", "%", "%d", "\n", '"content":', "}"])
RUN_TEXTS = st.lists(RUN_PIECES, max_size=4).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(RUN_TEXTS, min_size=2, max_size=10),
    other=st.one_of(st.none(), st.tuples(st.integers(0, len(others(False)) - 1), st.integers(1, 9))),
    model=st.sampled_from(["m", "m%dx", "org/model-3.1"]),
    ascii_escapes=st.booleans(),
    delta_first=st.booleans(),
    ends=st.integers(0, 2),
    seq=st.sampled_from([7, 1000, 4090, 5000]),  # (the numbers' and heads' tables end at 4096; heads grow as reached)
)
def test_a_run_is_the_events_of_its_strings(
    texts: list[str],
    other: tuple[int, int] | None,
    model: str,
    ascii_escapes: bool,
    delta_first: bool,
    ends: int,
    seq: int,
) -> None:
    """write_run's usual way (the read's lines, one comparison) takes what the pieces' way takes (a
    read with another event among the plain ones included), and writes each string once (its
    pieces added to the caller's list, nothing added when it takes none), as the
    template would, with its sequence number: whatever the strings, the model name, ``%`` in either,
    and the sequence numbers."""
    head = {**HEAD, "model": model}

    def event(text: str, **choice: Any) -> bytes:
        return serialised({**text_event(text, delta_first=delta_first, **choice), **head}, ascii_escapes)

    chunks = [event(t) for t in texts]
    if other is not None:  # another event among them (or after them)
        kind, at = other
        chunks.insert(min(at, len(chunks)), serialised({**others(delta_first)[kind], "model": model}, ascii_escapes))
    chunks += [event("!", finish_reason="stop"), serialised({**head, "choices": [], "usage": None}, False)][:ends]
    read = event("first") + b"".join(chunks)
    shape = text_run.learn(event("first")[:-2])
    assert shape is not None
    start = len(event("first"))
    where = b',"item_id":"msg_%%1","output_index":0,"content_index":0,"delta":'
    template = delta_template(TEXT_HEAD, where)
    usual: list[bytes] = []
    taken, stop, text = text_run.write_run(read, start, shape, TEXT_HEAD, where, seq, usual)
    pieces: list[bytes] = []
    assert text_run._write_pieces(read, start, shape, TEXT_HEAD, where, seq, pieces) == (taken, stop, text)
    assert usual == pieces
    if not taken:
        assert usual == []
    if taken:
        strings = [read[at + shape[2] : read.index(b"\n\n", at) - shape[3]] for at in _starts(read, start, stop)]
        # (the events' pieces, joined once by the caller with the rest of its read)
        assert b"".join(usual) == b"".join(template % (seq + i, string) for i, string in enumerate(strings))
        assert text == "".join(orjson.loads(b"[" + b",".join(strings) + b"]"))
    if other is None and len(texts) >= 2:
        assert taken == len(texts)  # a read of plain text events is one run


def _starts(read: bytes, start: int, stop: int) -> list[int]:
    starts = [start]
    while (at := read.find(b"\n\n", starts[-1]) + 2) < stop:
        starts.append(at)
    return starts


@pytest.mark.parametrize(
    "other",
    [
        b": keep-alive\n\n",
        b"id: 3\n" + serialised(text_event("skipped"), False),
        b": a\n_" + serialised(text_event("skipped"), False),  # (a line no field: the data after it is its own)
    ],
)
@pytest.mark.parametrize("tokens", [2, 12])
async def test_an_event_on_two_lines_is_one_event(other: bytes, tokens: int) -> None:
    """An event ends at a blank line, not at its first line's end: a comment, or an event whose first
    line is not its data (the bridge reads events that start with theirs), among one-line text events
    is one event, passed over as before, whether the read goes one by one or as a run."""
    first = {**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "A"}, "finish_reason": None}]}
    texts = [serialised(text_event(f"t{i}"), False) for i in range(tokens)]
    read = serialised(first, False) + b"".join(texts[: tokens // 2]) + other + b"".join(texts[tokens // 2 :])
    shared = frame()
    events = parse(await written([read], shared))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["A", *(f"t{i}" for i in range(tokens))]


async def test_a_stream_read_a_token_at_a_time_is_written_per_read() -> None:
    """Reads of one text event each in the learned shape (a model's pace) are written by ``__anext__``
    itself: the same events as the parsed path's, and no pass through the read loop per token."""
    first = {**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "A"}, "finish_reason": None}]}
    texts = ["b", 'say "hi"', "é", "x%dy", "\\", "z"]
    reads = [serialised(first, True)] + [serialised(text_event(t), True) for t in texts]
    reads.append(serialised(text_event("!", finish_reason="stop"), True))
    shared = frame()
    loops = 0
    real = ChatResponseEvents._chunk

    def counting(self: ChatResponseEvents, chunk: bytes, out: list[bytes]) -> None:
        nonlocal loops
        loops += 1
        real(self, chunk, out)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChatResponseEvents, "_chunk", counting)
        fast = await written(list(reads), shared)
    assert loops == 3  # the first event, the one the shape is learned from, the finish
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module, "learn", lambda raw, text=None: None)
        assert parse(fast) == parse(await written(list(reads), shared))
    assert b'"delta":"\\u00e9"' in fast  # relayed as the upstream wrote it


@pytest.mark.parametrize("pieces", [(b'"a","b', b'c"'), (b'"a\\', b'"')])
async def test_a_run_of_broken_events_is_refused_as_the_parse_refuses_them(pieces: tuple[bytes, bytes]) -> None:
    """Two events that are no JSON, each between the learned ends, the first leaving a string open that
    the second closes (read together as one array they would give as many strings as events), among
    plain ones: the stream fails as the parsed path fails it, no event written with a broken string."""
    plain = serialised(text_event("Q"), False)
    before, after = plain.split(b'"Q"')
    texts = [serialised(text_event(t), False) for t in ["x", "y", "z", "w"]]
    read = serialised(text_event("A"), False) + texts[0] + before + pieces[0] + after + before + pieces[1] + after
    read += b"".join(texts[1:])
    with pytest.raises(UpstreamProtocolError, match="not JSON"):
        await written([read], frame())


def test_a_finishs_endings_are_made_once_per_shape_end() -> None:
    """finish_of's endings are made once per shape ``after`` (the bytes after a text event's string: no
    id, so every stream of an upstream has the same) and kept in a bounded table: a second stream's shape
    (its own id, new bytes) reads its finish from the first's entry."""
    text_run._ENDINGS.clear()
    found = []
    for stream_id in ("chatcmpl-1", "chatcmpl-2"):
        shape = text_run.learn(b"data: " + orjson.dumps({**text_event("a"), "id": stream_id}))
        assert shape is not None
        last = b"data: " + orjson.dumps({**text_event("z!", finish_reason="length"), "id": stream_id})
        found.append(text_run.finish_of(last, 0, len(last), shape))
    assert found == [("z!", b'"z!"', "length")] * 2
    assert len(text_run._ENDINGS) == 1
    for n in range(2 * text_run._MAX_ENDINGS):
        text_run._endings(b"%d" % n)
    assert len(text_run._ENDINGS) <= text_run._MAX_ENDINGS


@settings(max_examples=300, deadline=None)
@given(
    text=TEXTS,
    given_text=st.one_of(st.none(), TEXTS, st.just(0)),
    ascii_escapes=st.booleans(),
    blank=st.booleans(),
    role=st.booleans(),
)
@example(text="a\\", given_text="a\\", ascii_escapes=False, blank=False, role=False)  # the string ends in an escape
@example(text="é", given_text="é", ascii_escapes=True, blank=False, role=False)  # escaped as orjson does not
def test_a_shape_learned_with_its_text_is_the_patterns(
    text: str, given_text: str | int | None, ascii_escapes: bool, blank: bool, role: bool
) -> None:
    """learn given the event's text (its string found as orjson writes it, without the pattern) learns
    the shape it learns without: for any text, escaped either way, after a blank or not, and for a text
    given that is not the event's (another, or not a str): never another string's end."""
    event = text_event(text)
    if role:
        event["choices"][0]["delta"] = {"role": "assistant", "content": text}
    raw = serialised(event, ascii_escapes)[:-2]
    if blank:
        raw = raw.replace(b'"content":', b'"content": ', 1)
    assert text_run.learn(raw, given_text) == text_run.learn(raw)
    if role:  # opening_shape gives it its text: the shape of the events without the role
        obj = orjson.loads(raw[5:])
        plain = serialised(text_event(text), ascii_escapes)[:-2]
        if blank:
            plain = plain.replace(b'"content":', b'"content": ', 1)
        assert text_run.opening_shape(obj, raw) == text_run.learn(plain) is not None

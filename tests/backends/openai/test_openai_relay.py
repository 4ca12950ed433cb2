"""``OpenAIStreamRelay`` over a scripted fake upstream response.

The fake hands the relay exactly the byte chunks a test scripts, so every
network-read boundary (mid-event, mid-``\\r\\n``, mid-``[DONE]``) is under the
test's control. The relay's promise: whatever the boundaries, the client gets the
same events, each one renamed to the public model, never ``[DONE]``; usage is
recorded (and hidden unless the client asked); a cut or an upstream error event
raises; ``release()`` happens exactly once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
import pytest

from backends.base import TokenUsage, UpstreamCall
from backends.errors import UpstreamError, UpstreamProtocolError, UpstreamTimeoutError
from backends.openai.relay import OpenAIStreamRelay, usage_of, with_usage_null
from schemas.completions import CompletionRequest

UP = "org/up-model"
PUB = "public-model"


class FakeResponse:
    """A minimal ``UpstreamResponse``: scripted reads, recorded releases.

    A script item that is an exception is raised at that read instead.
    """

    def __init__(self, chunks: Iterable[bytes | BaseException], status: int = 200) -> None:
        self.status = status
        self._chunks = list(chunks)
        self.reads = 0  # chunks handed out so far
        self.exhausted = False  # the body was read to its end
        self.releases = 0
        self.exhausted_at_release: list[bool] = []

    def header(self, name: str) -> str | None:
        return None

    async def read(self) -> bytes:
        raise AssertionError("the relay must read the stream chunk by chunk")

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for item in self._chunks:
            if isinstance(item, BaseException):
                raise item
            self.reads += 1
            yield item
        self.exhausted = True

    def release(self) -> None:
        self.releases += 1
        self.exhausted_at_release.append(self.exhausted)


def make_relay(
    chunks: Iterable[bytes | BaseException],
    *,
    wants_usage: bool = False,
    wants_continuous: bool = False,
    public: str = PUB,
) -> tuple[OpenAIStreamRelay, FakeResponse]:
    """A relay of ``chunks`` from upstream model ``UP``, served to the client as ``public``."""
    resp = FakeResponse(chunks)
    request = CompletionRequest.model_validate({"model": public, "prompt": "hi", "stream": True})
    call = UpstreamCall(request=request, upstream_model=UP, public_model=public, request_id="req-1")
    relay = OpenAIStreamRelay(
        resp, call, "up", client_wants_usage=wants_usage, client_wants_continuous_usage=wants_continuous
    )
    return relay, resp


async def drain(relay: OpenAIStreamRelay) -> list[bytes]:
    """Everything the relay yields; ``aclose()`` afterwards, as the gateway does."""
    out: list[bytes] = []
    try:
        async for piece in relay:
            assert isinstance(piece, bytes)
            assert piece, "the relay must never yield empty bytes"
            out.append(piece)
    finally:
        await relay.aclose()
    return out


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The data events of an SSE byte stream (comments skipped); fails on [DONE]."""
    assert raw == b"" or raw.endswith(b"\n\n"), "the relay yields whole events only"
    events = []
    for block in raw.split(b"\n\n")[:-1]:
        data = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if not data:
            assert all(line.startswith(b":") for line in block.split(b"\n")), block
            continue
        payload = b"\n".join(data)
        assert payload != b"[DONE]", "the relay must not pass [DONE] on"
        events.append(orjson.loads(payload))
    return events


# --- payload builders -------------------------------------------------------------------


def chunk(text: str, *, index: int = 0, finish: str | None = None, model: str = UP, **extra: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def usage_chunk(prompt: int = 3, completion: int = 4, model: str = UP) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1700000000,
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def ev(obj: Any, *, spaced: bool = False, crlf: bool = False, nospace: bool = False) -> bytes:
    """One SSE event; ``spaced`` writes JSON as Python's json.dumps does (``"model": "x"``)."""
    body = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    line = (b"data:" if nospace else b"data: ") + body
    return line + (b"\r\n\r\n" if crlf else b"\n\n")


def done(*, crlf: bool = False, nospace: bool = False) -> bytes:
    line = b"data:[DONE]" if nospace else b"data: [DONE]"
    return line + (b"\r\n\r\n" if crlf else b"\n\n")


def renamed(event: bytes) -> bytes:
    """What the fast path makes of an ordinary compact event: the same bytes, renamed."""
    return event.replace(b'"model":' + orjson.dumps(UP), b'"model":' + orjson.dumps(PUB))


def reserialised(obj: dict[str, Any]) -> bytes:
    """What the slow path makes of an event it parsed."""
    return b"data: " + orjson.dumps({**obj, "model": PUB}) + b"\n\n"


def expected_events(objs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**obj, "model": PUB} for obj in objs]


CONTENT = [chunk("Hello"), chunk(", wor"), chunk("ld", finish="length")]
USAGE = usage_chunk()


def split_payloads() -> dict[str, bytes]:
    lf = b"".join(ev(c) for c in CONTENT) + ev(USAGE) + done()
    crlf = b"".join(ev(c, crlf=True) for c in CONTENT) + ev(USAGE, crlf=True) + done(crlf=True)
    spaced = b"".join(ev(c, spaced=True) for c in CONTENT) + ev(USAGE, spaced=True) + done()
    mixed = (
        b": keep-alive\n\n"
        + ev(CONTENT[0], nospace=True)
        + ev(CONTENT[1], spaced=True)
        + b": ping\n\n"
        + ev(USAGE)  # in the middle: a content event still follows
        + ev(CONTENT[2])
        + done(nospace=True)
    )
    return {"lf": lf, "crlf": crlf, "spaced": spaced, "mixed": mixed}


PAYLOADS = split_payloads()
SPLITS = [(name, at) for name, payload in PAYLOADS.items() for at in range(1, len(payload))]


# --- plain relaying ----------------------------------------------------------------------


async def test_renames_every_chunk_and_stops_at_done() -> None:
    events = [ev(c) for c in CONTENT]
    relay, resp = make_relay([b"".join(events) + done()])
    out = await drain(relay)
    assert b"".join(out) == b"".join(renamed(e) for e in events)
    assert parse_sse(b"".join(out)) == expected_events(CONTENT)
    assert resp.releases == 1


async def test_one_event_per_read_is_one_yield_per_read() -> None:
    events = [ev(c) for c in CONTENT]
    relay, _ = make_relay([*events, done()])
    out = await drain(relay)
    assert out == [renamed(e) for e in events]


async def test_upstream_model_that_differs_is_renamed_too() -> None:
    # OpenAI answers with a dated snapshot id, not the id we asked for: the byte swap
    # cannot apply, so the events are parsed and still get the public name.
    objs = [chunk("a", model="gpt-x-0914"), chunk("b", model="gpt-x-0914", finish="stop")]
    relay, _ = make_relay([b"".join(ev(o) for o in objs) + done()])
    out = await drain(relay)
    assert parse_sse(b"".join(out)) == expected_events(objs)


async def test_upstream_model_that_differs_across_many_reads() -> None:
    objs = [chunk(t, model="gpt-x-0914", finish="stop" if t == "c" else None) for t in ("a", "b", "c")]
    usage = usage_chunk(model="gpt-x-0914")
    reads = [ev(objs[0]), ev(objs[1]) + ev(usage), ev(objs[2]), done()]
    relay, _ = make_relay(reads, wants_usage=True)
    out = await drain(relay)
    # The usage chunk reaches the client last (docs/api.md), wherever the upstream sent it.
    assert parse_sse(b"".join(out)) == expected_events([objs[0], objs[1], objs[2], usage])
    assert relay.usage == TokenUsage(3, 4)


@pytest.mark.parametrize(("name", "at"), SPLITS, ids=[f"{n}-{a}" for n, a in SPLITS])
async def test_any_read_boundary_gives_the_same_output(name: str, at: int) -> None:
    payload = PAYLOADS[name]
    whole, _ = make_relay([payload])
    reference = b"".join(await drain(whole))
    split, resp = make_relay([payload[:at], payload[at:]])
    out = b"".join(await drain(split))
    if name == "mixed":
        # Mixed model spellings may take the parse path in one grouping and the byte
        # path in another: the events must be equal, the bytes need not be.
        assert parse_sse(out) == parse_sse(reference)
    else:
        assert out == reference
    assert split.usage == whole.usage == TokenUsage(3, 4)
    assert resp.releases == 1


@pytest.mark.parametrize("name", sorted(PAYLOADS))
async def test_one_byte_per_read(name: str) -> None:
    payload = PAYLOADS[name]
    whole, _ = make_relay([payload])
    reference = b"".join(await drain(whole))
    relay, resp = make_relay([payload[i : i + 1] for i in range(len(payload))])
    out = b"".join(await drain(relay))
    assert parse_sse(out) == parse_sse(reference) == expected_events(CONTENT)
    if name != "mixed":
        assert out == reference
    assert relay.usage == TokenUsage(3, 4)
    assert resp.releases == 1


async def test_crlf_line_endings_become_lf() -> None:
    relay, _ = make_relay([PAYLOADS["crlf"]])
    out = b"".join(await drain(relay))
    assert b"\r" not in out
    assert out == b"".join(renamed(ev(c)) for c in CONTENT)


async def test_spaced_json_is_renamed() -> None:
    relay, _ = make_relay([PAYLOADS["spaced"]])
    out = b"".join(await drain(relay))
    assert b'"model": ' not in out
    assert out.count(b'"model":' + orjson.dumps(PUB)) == len(CONTENT)
    assert parse_sse(out) == expected_events(CONTENT)
    assert relay.usage == TokenUsage(3, 4)


# --- usage -------------------------------------------------------------------------------


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every block the relay parses (its event-by-event path), in order."""
    blocks: list[bytes] = []
    original = OpenAIStreamRelay._process_slow

    def spy(self: OpenAIStreamRelay, block: bytes) -> bytes:
        blocks.append(block)
        return original(self, block)

    monkeypatch.setattr(OpenAIStreamRelay, "_process_slow", spy)
    return blocks


async def test_usage_chunk_mid_read_is_the_only_event_parsed(parsed: list[bytes]) -> None:
    before = [ev(CONTENT[0]), ev(CONTENT[1])]
    after = [ev(CONTENT[2])]
    read = b"".join(before) + ev(USAGE) + b"".join(after)
    relay, _ = make_relay([read, done()])
    out = b"".join(await drain(relay))
    assert parsed == [ev(USAGE)]  # the event that finishes the choice is vouched on the byte path too
    # Ordinary events keep their exact bytes (only the name swapped); the usage chunk is hidden.
    assert out == b"".join(renamed(e) for e in before + after)
    assert relay.usage == TokenUsage(3, 4)


async def test_usage_chunk_is_relayed_when_the_client_asked() -> None:
    relay, _ = make_relay([PAYLOADS["lf"]], wants_usage=True)
    out = b"".join(await drain(relay))
    assert out == b"".join(renamed(ev(c)) for c in CONTENT) + reserialised(USAGE)
    assert parse_sse(out)[-1]["usage"] == USAGE["usage"]
    assert relay.usage == TokenUsage(3, 4)


def continuous_payload() -> tuple[list[dict[str, Any]], bytes]:
    # vLLM's continuous_usage_stats (0.6.3's default when stream_options is present):
    # a running usage object on every chunk, then the final usage chunk.
    objs = [
        chunk(
            text,
            usage={"prompt_tokens": 3, "completion_tokens": i + 1, "total_tokens": 4 + i},
            finish="stop" if text == "d" else None,
        )
        for i, text in enumerate(["a", "b", "c", "d"])
    ]
    return objs, b"".join(ev(o) for o in objs) + ev(USAGE) + done()


async def test_continuous_usage_is_nulled_unless_asked() -> None:
    objs, payload = continuous_payload()
    relay, _ = make_relay([payload], wants_usage=False, wants_continuous=False)
    events = parse_sse(b"".join(await drain(relay)))
    assert events == [{**o, "model": PUB, "usage": None} for o in objs]
    assert relay.usage == TokenUsage(3, 4)


async def test_continuous_usage_is_kept_when_asked() -> None:
    objs, payload = continuous_payload()
    relay, _ = make_relay([payload], wants_usage=True, wants_continuous=True)
    events = parse_sse(b"".join(await drain(relay)))
    assert events == expected_events([*objs, USAGE])
    assert relay.usage == TokenUsage(3, 4)


async def test_continuous_usage_split_one_byte_per_read() -> None:
    _, payload = continuous_payload()
    whole, _ = make_relay([payload])
    reference = b"".join(await drain(whole))
    relay, _ = make_relay([payload[i : i + 1] for i in range(len(payload))])
    assert b"".join(await drain(relay)) == reference
    assert relay.usage == TokenUsage(3, 4)


async def test_usage_null_on_ordinary_chunks_takes_the_fast_path(parsed: list[bytes]) -> None:
    # With include_usage, vLLM and OpenAI put "usage":null on every content chunk.
    events = [ev(chunk("x", usage=None)), ev(chunk("y", usage=None))]
    last = ev(chunk("z", finish="stop", usage=None))
    relay, _ = make_relay([b"".join(events) + last + done()])
    assert b"".join(await drain(relay)) == b"".join(renamed(e) for e in [*events, last])
    assert parsed == []
    assert relay.usage is None


async def test_heads_that_vary_midway_stay_on_the_byte_path(parsed: list[bytes]) -> None:
    # The relay learns an event's head (id, object, created, model) from the first one; an
    # upstream that stamps each chunk (Ollama's created) changes it midway: same events, no parse.
    first = [ev(chunk("a")), ev(chunk("b"))]
    later = [ev(chunk("c") | {"created": 1700000001}), ev(chunk("d") | {"created": 1700000002})]
    last = ev(chunk("e", finish="stop") | {"created": 1700000002})
    relay, _ = make_relay([b"".join(first), b"".join(later), last + done()])
    assert b"".join(await drain(relay)) == b"".join(renamed(e) for e in [*first, *later, last])
    assert parsed == []


@pytest.mark.parametrize("public", [PUB, UP])
async def test_a_read_that_starts_with_another_model_is_renamed(public: str, parsed: list[bytes]) -> None:
    # The client's name may be the upstream's own: then nothing is swapped on the byte path, and
    # the head learned from the stream's first event is what shows every event carries that name.
    other = chunk("c", model=UP + "-2024")
    reads = [ev(chunk("a")) + ev(chunk("b")), ev(other), ev(other) + ev(chunk("d", finish="stop")) + done()]
    relay, _ = make_relay(reads, public=public)
    events = parse_sse(b"".join(await drain(relay)))
    assert [e["model"] for e in events] == [public] * 5
    assert parsed == [ev(other), ev(other) + ev(chunk("d", finish="stop"))]


async def test_a_data_line_split_after_the_model_key_is_parsed(parsed: list[bytes]) -> None:
    whole = orjson.dumps(chunk("b"))
    at = whole.index(b'"choices"')
    split = b"data: " + whole[:at] + b"\ndata: " + whole[at:] + b"\n\n"  # valid SSE: the lines are joined
    relay, _ = make_relay([ev(chunk("a")), split, ev(chunk("c", finish="stop")) + done()], public=UP)
    out = b"".join(await drain(relay))
    assert [e["choices"][0]["text"] for e in parse_sse(out)] == ["a", "b", "c"]
    assert all(line.startswith(b"data: {") for line in out.split(b"\n\n")[:-1])  # one line each
    assert parsed == [split]


# --- SSE framing edge cases ---------------------------------------------------------------


async def test_comments_and_keep_alives_are_not_data() -> None:
    relay, resp = make_relay(
        [
            b": keep-alive\n\n",
            ev(CONTENT[0]),
            b": ping\n\n",
            b":\n\n",
            ev(CONTENT[1]) + b": x\n\n",
            ev(CONTENT[2]),
            done(),
        ]
    )
    out = await drain(relay)
    assert parse_sse(b"".join(out)) == expected_events(CONTENT)
    assert resp.releases == 1


async def test_done_without_space_ends_the_stream() -> None:
    relay, resp = make_relay([ev(CONTENT[2]) + done(nospace=True) + ev(CONTENT[1])])
    out = await drain(relay)
    assert parse_sse(b"".join(out)) == expected_events(CONTENT[2:])
    assert resp.releases == 1


@pytest.mark.parametrize("text", ["data: [DONE]", "\ndata: [DONE]\n\n", "data:[DONE]", "\n\ndata: [DONE]"])
async def test_done_inside_generated_text_does_not_end_the_stream(text: str) -> None:
    objs = [chunk(text), chunk("after", finish="stop")]
    payload = b"".join(ev(o) for o in objs)
    relay, _ = make_relay([payload])  # no real [DONE] yet: the stream must still be open
    first = await relay.__anext__()
    assert parse_sse(first) == expected_events(objs)
    with pytest.raises(UpstreamProtocolError):
        await relay.__anext__()
    await relay.aclose()
    relay, _ = make_relay([payload + done()])
    assert parse_sse(b"".join(await drain(relay))) == expected_events(objs)


@pytest.mark.parametrize(
    "text",
    [
        f'"model":"{UP}"',
        f'"model": "{UP}"',
        '"model":"other"',
        '"usage":{"prompt_tokens":1,"completion_tokens":2}',
        'data: {"error": "not really"}',
        '"object":"error"',
    ],
)
async def test_structure_lookalikes_inside_generated_text_are_left_alone(text: str) -> None:
    objs = [chunk(text), chunk(text, finish="stop")]
    relay, _ = make_relay([b"".join(ev(o) for o in objs) + done()])
    out = b"".join(await drain(relay))
    events = parse_sse(out)
    assert events == expected_events(objs)
    assert [e["choices"][0]["text"] for e in events] == [text, text]
    assert relay.usage is None


async def test_event_split_inside_the_done_marker() -> None:
    payload = ev(CONTENT[2]) + done()
    at = payload.index(b"[DO") + 3
    relay, resp = make_relay([payload[:at], payload[at:], b"ignored trailing bytes"])
    out = await drain(relay)
    assert out == [renamed(ev(CONTENT[2]))]
    assert resp.exhausted_at_release == [True]


# --- errors ------------------------------------------------------------------------------


NESTED_ERROR = {"error": {"message": "boom", "type": "BadRequestError", "param": None, "code": 400}}
FLAT_ERROR = {"object": "error", "message": "boom", "type": "BadRequestError", "param": None, "code": 400}
ERROR_EVENTS = {
    "nested": (NESTED_ERROR, False),
    "nested-spaced": (NESTED_ERROR, True),
    "flat": (FLAT_ERROR, False),
    "flat-spaced": (FLAT_ERROR, True),  # Python's json.dumps spacing: '"object": "error"'
    "string": ({"error": "boom"}, False),
    # vLLM <=0.10.0 wraps its flat ErrorResponse: {"error": {"object": "error", ...}}.
    "wrapped-flat": ({"error": {**FLAT_ERROR, "code": 500}}, True),
}


@pytest.mark.parametrize("name", sorted(ERROR_EVENTS))
async def test_error_event_raises_with_the_upstream_message(name: str) -> None:
    obj, spaced = ERROR_EVENTS[name]
    relay, resp = make_relay([ev(CONTENT[0]), ev(obj, spaced=spaced) + done()])
    assert await relay.__anext__() == renamed(ev(CONTENT[0]))
    with pytest.raises(UpstreamProtocolError) as info:
        await relay.__anext__()
    assert "boom" in info.value.message
    assert info.value.reason == "stream_error"
    await relay.aclose()
    assert resp.releases == 1


@pytest.mark.parametrize("name", sorted(ERROR_EVENTS))
async def test_error_event_in_the_same_read_as_content_still_raises(name: str) -> None:
    obj, spaced = ERROR_EVENTS[name]
    relay, resp = make_relay([ev(CONTENT[0]) + ev(obj, spaced=spaced) + done()])
    with pytest.raises(UpstreamProtocolError, match="boom"):
        await drain(relay)
    assert resp.releases == 1


@pytest.mark.parametrize(
    "tail",
    [b"", ev(CONTENT[1])[:-1], b"data: [DON", b"data: [DONE]"],
    ids=["clean-cut", "half-event", "half-done", "done-unterminated"],
)
async def test_stream_ending_without_done_raises(tail: bytes) -> None:
    relay, resp = make_relay([ev(CONTENT[0]), tail] if tail else [ev(CONTENT[0])])
    assert await relay.__anext__() == renamed(ev(CONTENT[0]))
    with pytest.raises(UpstreamProtocolError) as info:
        await relay.__anext__()
    assert info.value.reason == "stream_cut"
    assert resp.releases == 1
    await relay.aclose()
    assert resp.releases == 1


async def test_empty_stream_raises() -> None:
    relay, resp = make_relay([])
    with pytest.raises(UpstreamProtocolError):
        await drain(relay)
    assert resp.releases == 1


async def test_non_json_special_event_raises() -> None:
    relay, resp = make_relay([b'data: {"usage":{ not json\n\n', done()])
    with pytest.raises(UpstreamProtocolError):
        await drain(relay)
    assert resp.releases == 1


async def test_transport_error_mid_stream_propagates_and_releases() -> None:
    relay, resp = make_relay([ev(CONTENT[0]), UpstreamTimeoutError("idle", backend="up", reason="stream_idle")])
    assert await relay.__anext__() == renamed(ev(CONTENT[0]))
    with pytest.raises(UpstreamTimeoutError):
        await relay.__anext__()
    assert resp.releases == 1
    await relay.aclose()
    assert resp.releases == 1


# --- release / lifecycle -----------------------------------------------------------------


async def test_release_once_on_normal_end_after_draining_the_rest() -> None:
    relay, resp = make_relay([ev(CONTENT[2]), done() + b"data: junk after done\n\n", b"more", b"bytes"])
    out = await drain(relay)
    assert out == [renamed(ev(CONTENT[2]))]
    assert resp.reads == 4 and resp.exhausted
    assert resp.exhausted_at_release == [True]  # drained first, so the connection can be reused
    await relay.aclose()
    await relay.aclose()
    assert resp.releases == 1
    with pytest.raises(StopAsyncIteration):
        await relay.__anext__()


async def test_finished_turns_true_with_the_last_chunk() -> None:
    relay, _ = make_relay([ev(CONTENT[0]), ev(CONTENT[2]) + done()])
    assert await relay.__anext__() == renamed(ev(CONTENT[0]))
    assert not relay.finished
    assert await relay.__anext__() == renamed(ev(CONTENT[2]))
    assert relay.finished
    with pytest.raises(StopAsyncIteration):
        await relay.__anext__()
    await relay.aclose()


async def test_drain_error_after_done_is_swallowed() -> None:
    relay, resp = make_relay([ev(CONTENT[2]) + done(), UpstreamError("cut after done", backend="up")])
    out = await drain(relay)
    assert out == [renamed(ev(CONTENT[2]))]
    assert resp.releases == 1


async def test_aclose_before_the_end_releases_once_without_reading_on() -> None:
    relay, resp = make_relay([ev(CONTENT[0]), ev(CONTENT[1]), ev(CONTENT[2]), done()])
    assert await relay.__anext__() == renamed(ev(CONTENT[0]))
    await relay.aclose()
    assert resp.releases == 1
    assert resp.exhausted_at_release == [False]  # half-read: the transport closes the connection
    assert resp.reads == 1
    await relay.aclose()
    assert resp.releases == 1
    with pytest.raises(StopAsyncIteration):
        await relay.__anext__()


async def test_aclose_before_the_first_read() -> None:
    relay, resp = make_relay([ev(CONTENT[0]), done()])
    await relay.aclose()
    assert resp.releases == 1 and resp.reads == 0
    assert [piece async for piece in relay] == []
    assert resp.releases == 1


async def test_error_event_then_aclose_twice_releases_once() -> None:
    obj, _ = ERROR_EVENTS["nested"]
    relay, resp = make_relay([ev(obj), done()])
    with pytest.raises(UpstreamProtocolError):
        await relay.__anext__()
    await relay.aclose()
    await relay.aclose()
    assert resp.releases == 1


# --- the relay's own event count (what the handler accounts as relayed) --------------------


_END = chunk("end", finish="stop")


def relayed_count(out: list[bytes]) -> int:
    return len(parse_sse(b"".join(out)))


@pytest.mark.parametrize(
    "script",
    [
        pytest.param([ev(chunk("a")) + ev(chunk("b")) + ev(_END) + done()], id="fast_path_one_read"),
        pytest.param([ev(chunk("a"), spaced=True), ev(_END, nospace=True) + done()], id="spaced_and_nospace"),
        pytest.param([ev(chunk("a")) + b": keep-alive\n\n" + ev(_END) + done()], id="slow_path_comment"),
        pytest.param([ev(_END) + ev(usage_chunk()) + done()], id="usage_chunk_dropped"),
        pytest.param(
            [ev(chunk("a")), ev(chunk("b", model="org/up-model-2024", finish="stop")) + done()], id="learned_spelling"
        ),
        pytest.param([ev(chunk("x data: y data: z")) + ev(chunk("data: ", finish="stop")) + done()], id="data_in_text"),
    ],
)
async def test_relayed_events_counts_every_event_yielded_and_no_other(script: list[bytes]) -> None:
    relay, _ = make_relay(script)
    out = await drain(relay)
    assert relay.relayed_events == relayed_count(out) > 0


async def test_relayed_events_stops_at_an_error_event() -> None:
    relay, _ = make_relay([ev(chunk("a")) + ev(chunk("b")) + ev({"error": {"message": "boom"}}) + ev(chunk("c"))])
    out: list[bytes] = []
    with pytest.raises(UpstreamError):
        async for piece in relay:
            out.append(piece)
    await relay.aclose()
    assert relay.relayed_events == relayed_count(out) == 2


async def test_relayed_events_is_one_per_event_when_generated_text_says_data() -> None:
    """The handler used to count ``data: `` in the bytes: generated text saying it was charged as events."""
    relay, _ = make_relay([ev(chunk("data: data: data: ", finish="stop")) + done()])
    await drain(relay)
    assert relay.relayed_events == 1


_A, _A_NULL = b'data: {"a":1}\n\n', b'data: {"a":1,"usage":null}\n\n'
_B, _B_NULL = b'data: {"b":2}\n\n', b'data: {"b":2,"usage":null}\n\n'
_USED = b'data: {"usage":{"p":1}}\n\n'
_NESTED = b'data: {"u":{"usage":{"p":1}}}\n\n'  # a usage key, not at the top: the event is left as it is


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (_A + _B, _A_NULL + _B_NULL),
        (_A + _NESTED, _A_NULL + _NESTED),
        (_A_NULL + _B, _A_NULL + _B_NULL),
        (_USED, _USED),
        (_A + _USED + _B, _A_NULL + _USED + _B_NULL),
        (b'data: {"t":"}\\n\\n"}\n\n', b'data: {"t":"}\\n\\n","usage":null}\n\n'),  # escaped text is no event end
    ],
)
def test_with_usage_null_adds_the_key_to_every_event_that_lacks_it(block: bytes, expected: bytes) -> None:
    out = with_usage_null(block)
    assert out == expected
    for event in out.split(b"\n\n")[:-1]:
        orjson.loads(event[len(b"data: ") :])  # still JSON


# --- parsed events keep integers beyond 64 bits ------------------------------------------------------

BIG = 2**64 + 1  # orjson reads it as a float


@pytest.mark.parametrize("cls", ["openai", "vllm", "vllm_chat"])
async def test_a_parsed_event_keeps_an_integer_beyond_64_bits(cls: str) -> None:
    """The usage chunk (always parsed) and a chunk the parse renames carry a 2^64+1 ``created``: it
    reaches the client as that integer, never as 1.8446744073709552e+19."""
    from backends.vllm.stream import VLLMChatStreamRelay, VLLMStreamRelay

    relay_cls = {"openai": OpenAIStreamRelay, "vllm": VLLMStreamRelay, "vllm_chat": VLLMChatStreamRelay}[cls]

    def wire(obj: dict[str, Any]) -> bytes:
        return json.dumps({**obj, "created": BIG}, separators=(",", ":")).encode()  # orjson cannot write it

    first = wire(chunk("a", model="other-spelling"))
    finish = wire(chunk("b", finish="repetition" if cls != "openai" else "stop"))
    used = wire(usage_chunk())
    reads = [b"data: " + first + b"\n\ndata: " + finish + b"\n\ndata: " + used + b"\n\n" + done()]
    relay, _ = make_relay(reads, wants_usage=True)
    relay.__class__ = relay_cls
    out = b"".join(await drain(relay))
    assert out.count(b'"created":%d' % BIG) == 3, out
    assert b"e+19" not in out
    assert relay.usage is not None and relay.usage.prompt_tokens == 3


@pytest.mark.parametrize("bad", [2**64 + 1, 2**62, -1, True, 1.0, "3", None])
async def test_a_usage_count_that_is_no_count_is_not_usage(bad: Any) -> None:
    """A hostile upstream's 2^62 or 2^64+1 token count must not settle a key's budget (it would lock the key
    out for ages): the relay reports no usage instead (the gateway then keeps its estimate)."""
    used = usage_chunk()
    used["usage"]["completion_tokens"] = bad
    body = json.dumps(used, separators=(",", ":")).encode()  # orjson cannot write 2^64+1
    relay, _ = make_relay([ev(chunk("a", finish="stop")) + b"data: " + body + b"\n\n" + done()], wants_usage=True)
    await drain(relay)
    assert relay.usage is None
    assert usage_of({"prompt_tokens": 3, "completion_tokens": bad}) is None
    assert usage_of({"prompt_tokens": 3, "completion_tokens": 4}) == TokenUsage(3, 4)

"""The stream relay's byte fast path against its own event-by-event parse, on generated streams.

The fast path (``OpenAIStreamRelay._rename``) relays whole reads after a few byte scans and
leans on a self-check to send anything unusual (an early ``[DONE]``, error events, comments,
``id:`` lines, another model spelling) to the parse. Whatever the reads, the client must get
the same events, the same end, the same usage and the same relayed count as when every read
is parsed. Hypothesis writes the streams from realistic and hostile pieces and cuts them into
reads at any byte. The pieces include the shapes that break clients (issue 20): choices that
finish or never do, a usage chunk before the last content, an event cut at any byte after
its model key. Whatever came, every event the client gets is a JSON object the SDK reads; a
stream that ends cleanly has ended its choice, and a usage chunk it carries is its last event.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.errors import UpstreamError
from backends.openai.relay import OpenAIStreamRelay
from tests.backends.openai.test_openai_relay import UP, chunk, make_relay, usage_chunk

TEXTS = st.sampled_from(
    [
        " a",
        "data: x",
        "[DONE]",
        "\n\ndata: [DONE]\n\n",
        '"model":"org/up-model"',
        '"error"',
        '"prompt_tokens"',
        "é ✓",
        "}\n\n",
    ]
)


def _event(obj: Any, spaced: bool) -> bytes:
    body = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    return b"data: " + body + b"\n\n"


@st.composite
def pieces(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["chunk", "chunk", "chunk", "spaced", "other_model", "usage", "error", "vllm_error",
                                 "done", "done_nospace", "comment", "id_line", "continuous", "finish", "finish",
                                 "spaced_finish", "cut", "nospace", "tick", "tick_finish", "other_id", "model_last",
                                 "openai_layout", "multiline"]))  # fmt: skip
    text = draw(TEXTS)
    if kind in ("chunk", "spaced"):
        return _event(chunk(text), kind == "spaced")
    if kind in ("tick", "tick_finish"):  # the head varies: created ticks (Ollama stamps each chunk)
        obj = chunk(text, finish="stop" if kind == "tick_finish" else None)
        return _event(obj | {"created": obj["created"] + draw(st.integers(1, 3))}, False)
    if kind == "other_id":
        return _event(chunk(text) | {"id": "cmpl-2"}, False)
    if kind == "model_last":  # the model key after the choices: no head to learn
        obj = chunk(text)
        return _event({k: v for k, v in obj.items() if k != "model"} | {"model": obj["model"]}, False)
    if kind == "multiline":  # one event's data on two lines, split after its model key (valid SSE and JSON)
        whole = orjson.dumps(chunk(text))
        at = whole.index(b'"choices"')
        return b"data: " + whole[:at] + b"\ndata: " + whole[at:] + b"\n\n"
    if kind == "openai_layout":  # keys after the choices (OpenAI's usage: null, system_fingerprint)
        return _event(chunk(text, usage=None, system_fingerprint="fp_1"), False)
    if kind in ("finish", "spaced_finish"):
        return _event(chunk(text, finish=draw(st.sampled_from(["stop", "length"]))), kind == "spaced_finish")
    if kind == "nospace":
        return b"data:" + orjson.dumps(chunk(text)) + b"\n\n"
    if kind == "cut":
        # An event cut anywhere after its (exact, upstream) model key, still framed as an event.
        whole = orjson.dumps(chunk(text, finish=draw(st.sampled_from([None, "stop"]))))
        at = draw(st.integers(min_value=whole.index(b'"model"') + 8, max_value=len(whole) - 1))
        return b"data: " + whole[:at] + b"\n\n"
    if kind == "other_model":
        return _event(chunk(text, model="org/up-model-2024"), False)
    if kind == "usage":
        return _event(usage_chunk(), False)
    if kind == "continuous":
        return _event(chunk(text, usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}), False)
    if kind == "error":
        return _event({"error": {"message": "boom", "type": "server_error"}}, False)
    if kind == "vllm_error":
        return _event({"object": "error", "message": "boom", "type": "BadRequestError", "code": 400}, False)
    if kind == "done":
        return b"data: [DONE]\n\n"
    if kind == "done_nospace":
        return b"data:[DONE]\n\n"
    if kind == "comment":
        return b": keep-alive\n\n"
    return b"id: 7\n" + _event(chunk(text), False)


class ParsedRelay(OpenAIStreamRelay):
    """The reference: every read goes through the event-by-event parse."""

    def _rename(self, block: bytes) -> bytes:
        return self._process_slow(block)


async def _run(relay: OpenAIStreamRelay) -> tuple[list[Any], str, Any, int]:
    events: list[Any] = []
    end = "finished"
    try:
        async for piece in relay:
            for raw in piece.split(b"\n\n")[:-1]:
                assert raw.startswith(b"data:") and b"\n" not in raw, raw  # SSE's space is optional
                events.append(json.loads(raw[len(b"data:") :]))
    except UpstreamError as exc:
        end = f"error:{exc.reason}"
    finally:
        await relay.aclose()
    return events, end, relay.usage, relay.relayed_events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(pieces(), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6),
    between=st.lists(st.integers(min_value=1, max_value=11), max_size=4),  # reads cut between events too
    usage=st.booleans(),
    continuous=st.booleans(),
    # The client's name: as long as the upstream's, the upstream's own (nothing to rename: the
    # byte path's own checks are all that vouch for the model key), shorter.
    public=st.sampled_from(["public-model", UP, "m"]),
)
async def test_the_fast_path_relays_what_the_parse_would(
    parts: list[bytes], cuts: list[int], between: list[int], usage: bool, continuous: bool, public: str
) -> None:
    body = b"".join(parts)
    ends = [len(b"".join(parts[:i])) for i in between if i < len(parts)]
    at = sorted({c for c in [*cuts, *ends] if 0 < c < len(body)})
    reads = [body[a:b] for a, b in zip([0, *at], [*at, len(body)], strict=True)]
    fast, _ = make_relay(list(reads), wants_usage=usage, wants_continuous=continuous, public=public)
    slow, _ = make_relay(list(reads), wants_usage=usage, wants_continuous=continuous, public=public)
    slow.__class__ = ParsedRelay
    got, want = await _run(fast), await _run(slow)
    assert got == want
    events, end, _, _ = got
    for event in events:
        assert event.get("model") in (None, public), event  # never the upstream's id
    if end == "finished":
        assert any(c.get("finish_reason") for e in events for c in e.get("choices") or ()), events
        used = [i for i, e in enumerate(events) if e.get("usage") and not e.get("choices")]
        assert used in ([], [len(events) - 1]), events  # the usage chunk is the last event
    assert UP  # the upstream id the fast path renames (tests.backends.openai.test_openai_relay)


def _openai_like(text: str, finish: str | None) -> dict[str, Any]:
    return chunk(text, finish=finish)


def _vllm_like(text: str, finish: str | None) -> dict[str, Any]:
    """vLLM's chunk: keys after the finish reason (OpenAI's ends the choice there)."""
    obj = chunk(text, finish=finish)
    obj["choices"][0].update(stop_reason=None, token_ids=None)
    return obj


@pytest.mark.parametrize("shape", [_openai_like, _vllm_like])
@pytest.mark.parametrize("which", ["ordinary", "finishing"])
async def test_an_event_cut_at_any_byte_never_reaches_the_client(shape: Any, which: str) -> None:
    """Every cut of an event after its exact model key, in a read the byte path would take whole:
    the client gets valid events, then an error, never the cut event."""
    before = [_event(shape(t, None), False) for t in ("a", "b")]
    whole = orjson.dumps(shape("c", "stop" if which == "finishing" else None))
    tail = [] if which == "finishing" else [_event(shape("d", "stop"), False)]
    for at in range(whole.index(b'"model"') + 8, len(whole)):
        reads = [b"".join(before), b"".join([b"data: " + whole[:at] + b"\n\n", *tail]) + b"data: [DONE]\n\n"]
        events, end, _, _ = await _run(make_relay(reads)[0])
        assert end.startswith("error"), (at, whole[:at])
        assert [e["choices"][0]["text"] for e in events] == ["a", "b"]

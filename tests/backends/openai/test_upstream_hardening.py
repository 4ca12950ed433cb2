"""Hostile-upstream behaviour of the OpenAI-shaped path (issue 13 items 2, 3, 7, 8, 15).

Relay units run over scripted reads (``FakeResponse``); size caps and encodings run the
real backend against the fault-injecting fake upstream (``tests.fakes``).
"""

from __future__ import annotations

import gzip
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from backends.base import UpstreamCall
from backends.errors import UpstreamError, UpstreamTooLargeError, error_from_upstream_body, register_secret
from backends.openai.adapter import OpenAIBackend
from backends.openai.relay import OpenAIStreamRelay
from schemas.completions import CompletionRequest
from schemas.config import OpenAIBackendConfig
from tests.backends.openai.test_openai_relay import PUB, UP, FakeResponse, drain, make_relay
from tests.fakes import Behaviour, FakeUpstream


def chunk(text: str, model: str = UP, finish: str | None = "stop") -> bytes:
    """A chunk that ends its choice unless ``finish`` is None (a stream must end each choice)."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    obj = {"id": "c", "object": "text_completion", "created": 1, "model": model, "choices": [choice], "usage": None}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def texts(out: bytes) -> list[str]:
    return [orjson.loads(e[len(b"data: ") :])["choices"][0]["text"] for e in out.split(b"\n\n") if e]


# --- item 7: the first [DONE] ends the stream -----------------------------------------------


async def test_a_second_done_in_the_same_read_is_not_an_error() -> None:
    relay, resp = make_relay([chunk("a") + b"data: [DONE]\n\n" + b"data: [DONE]\n\n"])
    out = b"".join(await drain(relay))
    assert texts(out) == ["a"] and relay.finished
    assert resp.releases == 1


async def test_events_after_done_are_not_relayed() -> None:
    relay, _ = make_relay([chunk("a") + b"data: [DONE]\n\n" + chunk("late") + b"data: [DONE]\n\n"])
    assert texts(b"".join(await drain(relay))) == ["a"]


# --- item 8: only data events reach the client -------------------------------------------------


@pytest.mark.parametrize(
    "noise",
    [b"retry: 10\n\n", b"event: ping\n\n", b"id: 7\n", b"event: message\n", b": keep-alive\n\n", b"bare line\n\n"],
)
async def test_only_data_events_are_forwarded(noise: bytes) -> None:
    relay, _ = make_relay([noise + chunk("a") + noise + chunk("b") + b"data: [DONE]\n\n"])
    out = b"".join(await drain(relay))
    assert texts(out) == ["a", "b"]
    for event in out.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ") and b"\n" not in event


# --- item 3: one event that never ends ----------------------------------------------------------


def relay_with_cap(chunks: list[bytes], max_event: int) -> tuple[OpenAIStreamRelay, FakeResponse]:
    resp = FakeResponse(chunks)
    request = CompletionRequest.model_validate({"model": PUB, "prompt": "hi", "stream": True})
    call = UpstreamCall(request=request, upstream_model=UP, public_model=PUB, request_id="r")
    relay = OpenAIStreamRelay(
        resp, call, "up", client_wants_usage=False, client_wants_continuous_usage=False, max_event=max_event
    )
    return relay, resp


async def test_an_event_over_max_event_bytes_ends_the_stream_with_an_error() -> None:
    relay, resp = relay_with_cap([chunk("a"), b'data: {"x":"' + b"y" * 4096] + [b"y" * 4096] * 10, 16 * 1024)
    first = await relay.__anext__()
    assert texts(first) == ["a"]
    with pytest.raises(UpstreamTooLargeError) as caught:
        await relay.__anext__()
    assert caught.value.status == 502 and "max_event_bytes" in caught.value.message
    assert resp.releases == 1
    assert resp.reads < 11  # stopped at the cap, not at the end of the upstream's body


async def test_a_long_event_costs_linear_time() -> None:
    """20 MB of one event in 64 KiB reads: each read is touched once, not the whole prefix again."""
    piece = b"y" * 65536

    async def run(reads: int) -> float:
        head = b'data: {"choices":[{"finish_reason":"stop","t":"'
        relay, _ = relay_with_cap([head] + [piece] * reads + [b'"}]}\n\n', b"data: [DONE]\n\n"], 1 << 30)
        started = time.process_time()
        out = b"".join([piece async for piece in relay])
        assert len(out) > reads * len(piece)
        return time.process_time() - started

    # Each size's best of three, with a 5 ms floor: a loaded machine only adds time (tests run beside
    # other work), and a quadratic relay copies ~3 GB for the large run, far past the bound.
    small = min([await run(40) for _ in range(3)])
    large = min([await run(320) for _ in range(3)])
    assert large < max(small, 0.005) * 8 * 3  # 8x the bytes: about 8x the time (quadratic would be 64x)


# --- items 2 and 15: error bodies ---------------------------------------------------------------


def test_a_secret_straddling_the_cut_is_redacted_first() -> None:
    secret = "sk-straddle-0123456789abcdef"
    register_secret(secret)
    body = ("x" * 490 + secret + " and more").encode()  # the 500-char cut falls inside the secret
    message = error_from_upstream_body(400, body, None, "b").message
    assert "sk-str" not in message and secret[:-1] not in message


def test_a_secret_prefix_at_the_cut_is_dropped() -> None:
    secret = "sk-prefix-at-cut-abcdef0123"
    register_secret(secret)
    body = ("x" * 495 + secret[:5]).encode() + b"y" * 100  # only the secret's start reaches the cut
    message = error_from_upstream_body(400, body, None, "b").message
    assert secret[:3] not in message


def test_upstream_param_and_code_survive_a_client_error() -> None:
    body = orjson.dumps({"error": {"message": "too long", "type": "invalid_request_error",
                                   "param": "max_tokens", "code": "context_length_exceeded"}})  # fmt: skip
    error = error_from_upstream_body(400, body, None, "b")
    assert error.envelope()["error"] == {
        "message": "too long",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "context_length_exceeded",
    }


@pytest.mark.parametrize("body", [b'{"error": "Input validation error: bad"}', b"plain text", b'{"detail": "x"}'])
def test_a_client_error_never_gets_a_server_code(body: bytes) -> None:
    for status in (400, 422, 409):
        error = error_from_upstream_body(status, body, None, "b")
        assert error.code is None and error.param is None and error.status < 500


def test_a_param_that_is_not_ours_is_dropped() -> None:
    body = orjson.dumps({"error": {"message": "m", "param": "sampling_params.extra_args", "code": "bad"}})
    assert error_from_upstream_body(400, body, None, "b").param is None


@pytest.mark.parametrize(
    ("param", "kept"),
    [
        # OpenAI's Responses errors name its fields and paths inside them: relayed, they keep them.
        ("context_management", True),
        ("previous_response_id", True),
        ("input[2].content[0].type", True),
        ("tools[0].name", True),
        ("messages[1].content", True),
        # A validator's location, or a path inside a field that is not ours: dropped.
        ("messages.0.content", False),
        ("sampling_params.extra_args", False),
        ("input[0]]", False),
    ],
)
def test_a_path_inside_one_of_our_fields_is_kept(param: str, kept: bool) -> None:
    body = orjson.dumps({"error": {"message": "m", "type": "invalid_request_error", "param": param, "code": None}})
    assert error_from_upstream_body(400, body, None, "b").param == (param if kept else None)


@pytest.mark.parametrize("param", ["messages", "thinking_token_budget", "mm_processor_kwargs"])
def test_a_chat_field_named_by_the_upstream_is_kept(param: str) -> None:
    # vLLM 0.32 names the field it refuses (e.g. per-request mm_processor_kwargs without
    # --trust-request-mm-kwargs); chat's fields are ours too.
    body = orjson.dumps({"error": {"message": "m", "type": "BadRequestError", "param": param, "code": 400}})
    assert error_from_upstream_body(400, body, None, "b").param == param


# --- item 3: bodies over the cap, encodings we did not ask for (through the backend) ---------------


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream()
    await up.start()
    yield up
    await up.stop()


def backend(up: FakeUpstream, transport: str, **limits: int) -> OpenAIBackend:
    fields = {"name": "up", "type": "openai", "base_url": up.url, "transport": transport, "limits": limits}
    config = OpenAIBackendConfig.model_validate({**fields, "timeout": {"total": 5, "first_byte": 5}})
    return OpenAIBackend(config)


def call(**fields: Any) -> UpstreamCall:
    request = CompletionRequest.model_validate({"model": PUB, "prompt": "hi", **fields})
    return UpstreamCall(request=request, upstream_model=UP, public_model=PUB, request_id="r")


TRANSPORTS = ["httptools", "aiohttp", "httpx"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_body_over_max_response_bytes_is_a_502(upstream: FakeUpstream, transport: str) -> None:
    upstream.script.append(Behaviour(kind="raw", body=b"x" * 200_000, events=8192))
    b = backend(upstream, transport, max_response_bytes=64 * 1024)
    try:
        with pytest.raises(UpstreamTooLargeError) as caught:
            await b.complete(call())
    finally:
        await b.close()
    assert caught.value.status == 502 and caught.value.code == "upstream_response_too_large"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_endless_body_stops_at_the_cap_not_the_timeout(upstream: FakeUpstream, transport: str) -> None:
    upstream.script.append(Behaviour(kind="endless", body=b"x" * 8192))
    b = backend(upstream, transport, max_response_bytes=256 * 1024)
    started = time.monotonic()
    try:
        with pytest.raises(UpstreamTooLargeError):
            await b.complete(call())
    finally:
        await b.close()
    assert time.monotonic() - started < 4  # the total timeout is 5 s


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_gzip_we_did_not_ask_for_is_refused(upstream: FakeUpstream, transport: str, stream: bool) -> None:
    bomb = gzip.compress(b"\0" * 10_000_000)  # about 10 KB that inflate to 10 MB
    upstream.script.append(Behaviour(kind="raw", body=bomb, headers={"Content-Encoding": "gzip"}))
    b = backend(upstream, transport)
    try:
        with pytest.raises(UpstreamTooLargeError) as caught:
            if stream:
                await drain_stream(await b.stream(call(stream=True)))
            else:
                await b.complete(call())
    finally:
        await b.close()
    assert caught.value.reason == "encoded"
    assert upstream.requests[-1].headers["Accept-Encoding"] == "identity"


async def drain_stream(stream: Any) -> None:
    try:
        async for _ in stream:
            pass
    finally:
        await stream.aclose()


@pytest.mark.parametrize(
    ("reads", "relayed"),
    [
        ([chunk("a")], None),  # no [DONE] yet
        ([b"data: [DONE]\n\n"], None),  # no choice ever ended: an error, not an empty success
        ([b"data:[DONE]\n\n"], None),
        ([chunk("a") + b"data: [DONE]\n\n"], ["a"]),  # the usual last read: the tail shortcut
        ([chunk("a") + b"data:[DONE]\n\n"], ["a"]),
        ([chunk("a") + b"data: [DONE]\n\n" + b"data: [DONE]\n\n"], ["a"]),  # the first of two
        ([chunk("a") + b"data:[DONE]\n\n" + chunk("late") + b"data: [DONE]\n\n"], ["a"]),  # the tail is not the first
        ([chunk("a"), chunk("b") + b"data: [DONE]\n\n" + chunk("c") + b"data: [DONE]\n\n"], ["a", "b"]),
        ([chunk("x data: [DONE]\n") + b"data: [DONE]\n\n"], ["x data: [DONE]\n"]),  # quoted text is no event
        ([chunk("[DONE]")], None),
        ([chunk("a", model="other") + b"data: [DONE]\n\n" + chunk("late")], ["a"]),  # parsed read: [DONE] still ends it
    ],
)
async def test_the_first_done_event_ends_the_stream(reads: list[bytes], relayed: list[str] | None) -> None:
    relay, _ = make_relay(reads)
    out: list[bytes] = []
    try:
        async for piece in relay:
            out.append(piece)
    except UpstreamError:  # no [DONE]: the body ended too soon
        assert relayed is None
        return
    finally:
        await relay.aclose()
    assert relayed is not None and relay.finished
    assert texts(b"".join(out)) == relayed
    assert relay.relayed_events == len(relayed)
    for event in b"".join(out).split(b"\n\n")[:-1]:
        assert orjson.loads(event[len(b"data: ") :])["model"] == PUB


@pytest.mark.parametrize(
    ("param", "code"),
    [("input", None), ("previous_response_id", "previous_response_not_found"), ("input[0].id", None)],
)
def test_a_404_about_a_field_of_the_request_is_relayed_as_a_404(param: str, code: str | None) -> None:
    """OpenAI's "Item with id 'rs_1' not found" (``param: input``) is about the client's request:
    its 404 and words, not a 502 blaming the base_url."""
    message = "Item with id 'rs_1' not found. Items are not persisted when `store` is set to false."
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}})
    error = error_from_upstream_body(404, body, None, "b")
    assert error.status == 404 and not error.retryable
    assert error.envelope()["error"] == {
        "message": message, "type": "invalid_request_error", "param": param, "code": code,
    }  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        b'{"detail": "Not Found"}',  # no such path (a base_url without /v1)
        b'{"error": {"message": "Invalid URL (POST /responses)", "type": "invalid_request_error", "param": null}}',
        b'{"error": {"message": "no such thing", "param": "sampling_params.x"}}',  # a param not ours
        b'{"error": {"message": "The model `m` does not exist", "param": "model", "code": "model_not_found"}}',
    ],
)
def test_a_404_about_no_field_of_the_request_stays_a_configuration_error(body: bytes) -> None:
    error = error_from_upstream_body(404, body, None, "b")
    assert error.status == 502 and error.code in ("upstream_misconfigured", "upstream_model_not_found")

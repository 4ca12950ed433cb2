"""The gateway's HTTP surface with a raw aiohttp client: error envelopes, request ids,
upstream failures mapped to the right status, mid-stream cuts, keep-alive reuse."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL, MakeGateway, RunningGateway, free_port
from tests.fakes import Behaviour

ENVELOPE_KEYS = {"message", "type", "param", "code"}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def assert_envelope(resp: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    """The response is ``status`` with exactly OpenAI's error envelope; returns the inner object."""
    raw = await resp.read()
    assert resp.status == status, raw
    assert resp.content_type == "application/json"
    assert resp.headers.get("x-request-id")
    body = orjson.loads(raw)
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == ENVELOPE_KEYS
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    assert "Traceback" not in error["message"]
    return error


def header(headers: dict[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def sse_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n"), raw[-200:]
    return [block for block in raw.split(b"\n\n") if block]


def completion(model: str = OPENAI_MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", "max_tokens": 3, **fields}


# --- malformed requests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"model": "gpt-test", "prompt": ', "parse"),
        (b"not json at all", "parse"),
        (b"[1, 2, 3]", "object"),
        (b'"a string"', "object"),
        (b"42", "object"),
        (b"null", "object"),
        (b"", "empty"),
    ],
)
async def test_bad_bodies_are_400_envelopes(
    gateway: RunningGateway, session: aiohttp.ClientSession, body: bytes, words: str
) -> None:
    async with session.post(
        f"{gateway.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        error = await assert_envelope(resp, 400)
    assert error["type"] == "invalid_request_error"
    assert words in error["message"].lower()
    assert gateway.upstream.requests == []


async def test_missing_required_field(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    async with session.post(f"{gateway.url}/v1/completions", json={"model": OPENAI_MODEL}) as resp:
        error = await assert_envelope(resp, 400)
    assert error["param"] == "prompt"


async def test_oversized_body_is_413(make_gateway: MakeGateway, session: aiohttp.ClientSession) -> None:
    gw = await make_gateway(server="max_body_bytes: 1024")
    big = orjson.dumps(completion(prompt="x" * 4096))
    async with session.post(f"{gw.url}/v1/completions", data=big, headers={"Content-Type": "application/json"}) as resp:
        error = await assert_envelope(resp, 413)
    assert error["code"] == "request_too_large"
    assert "1024" in error["message"]
    assert gw.upstream.requests == []
    # Under the limit the same gateway serves normally.
    async with session.post(f"{gw.url}/v1/completions", json=completion()) as resp:
        assert resp.status == 200


async def test_unknown_path_is_404(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    async with session.get(f"{gateway.url}/v1/nope") as resp:
        error = await assert_envelope(resp, 404)
    assert error["code"] == "unknown_url"
    async with session.post(f"{gateway.url}/v1/images/generations", json=completion()) as resp:
        await assert_envelope(resp, 404)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/completions"), ("POST", "/v1/models"), ("PUT", "/health")])
async def test_wrong_method_is_405(
    gateway: RunningGateway, session: aiohttp.ClientSession, method: str, path: str
) -> None:
    async with session.request(method, f"{gateway.url}{path}") as resp:
        error = await assert_envelope(resp, 405)
    assert error["code"] == "method_not_allowed"


async def test_unknown_model_is_404(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    async with session.post(f"{gateway.url}/v1/completions", json=completion(model="ghost")) as resp:
        error = await assert_envelope(resp, 404)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"


async def test_unsupported_parameter_envelope(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    async with session.post(f"{gateway.url}/v1/completions", json=completion(min_p=0.2)) as resp:
        error = await assert_envelope(resp, 400)
    assert error == {**error, "param": "min_p", "code": "unsupported_parameter", "type": "invalid_request_error"}
    assert "up-openai" in error["message"]


# --- request ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/completions", completion()),
        ("POST", "/v1/completions", completion(model=MOCK_MODEL)),
        ("POST", "/v1/completions", completion(stream=True)),
        ("POST", "/v1/completions", completion(temperature=9)),
        ("POST", "/v1/completions", completion(model="ghost")),
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/nope", None),
        ("GET", "/v1/completions", None),
    ],
)
async def test_every_response_has_a_request_id(
    gateway: RunningGateway, session: aiohttp.ClientSession, method: str, path: str, body: Any
) -> None:
    async with session.request(method, f"{gateway.url}{path}", json=body) as resp:
        await resp.read()
        rid = resp.headers.get("x-request-id")
    assert rid and rid.startswith("req-")


async def test_fresh_request_ids_are_unique_and_forwarded(
    gateway: RunningGateway, session: aiohttp.ClientSession
) -> None:
    ids = []
    for _ in range(3):
        async with session.post(f"{gateway.url}/v1/completions", json=completion()) as resp:
            assert resp.status == 200
            ids.append(resp.headers["x-request-id"])
    assert len(set(ids)) == 3
    assert [header(seen.headers, "x-request-id") for seen in gateway.upstream.requests] == ids


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
async def test_client_request_id_is_echoed_and_forwarded(
    gateway: RunningGateway, session: aiohttp.ClientSession, stream: bool, model: str
) -> None:
    rid = "client-trace-42.abc"
    async with session.post(
        f"{gateway.url}/v1/completions", json=completion(model, stream=stream), headers={"X-Request-Id": rid}
    ) as resp:
        assert resp.status == 200
        await resp.read()
        assert resp.headers["x-request-id"] == rid
    assert len(gateway.upstream.requests) == 1
    assert header(gateway.upstream.requests[0].headers, "x-request-id") == rid
    # The gateway's upstream credentials go upstream; nothing of the client's is needed.
    assert header(gateway.upstream.requests[0].headers, "authorization") == (
        "Bearer sk-test-secret" if model == OPENAI_MODEL else None
    )


async def test_client_request_id_echoed_on_errors(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    rid = "trace-err-1"
    async with session.post(f"{gateway.url}/v1/completions", data=b"{", headers={"x-request-id": rid}) as resp:
        await assert_envelope(resp, 400)
        assert resp.headers["x-request-id"] == rid
    async with session.get(f"{gateway.url}/nowhere", headers={"x-request-id": rid}) as resp:
        await assert_envelope(resp, 404)
        assert resp.headers["x-request-id"] == rid


@pytest.mark.parametrize("bad", ["has space", "x" * 200, "semi;colon", "new\\nline"])
async def test_unsafe_client_request_id_is_replaced(
    gateway: RunningGateway, session: aiohttp.ClientSession, bad: str
) -> None:
    async with session.post(f"{gateway.url}/v1/completions", json=completion(), headers={"x-request-id": bad}) as resp:
        assert resp.status == 200
        rid = resp.headers["x-request-id"]
    assert rid != bad and rid.startswith("req-")
    assert header(gateway.upstream.requests[0].headers, "x-request-id") == rid


# --- upstream failures ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_500_is_502(gateway: RunningGateway, session: aiohttp.ClientSession, stream: bool) -> None:
    gateway.upstream.script.append(
        Behaviour(kind="status", status=500, body={"error": {"message": "boom", "type": "server_error"}})
    )
    async with session.post(f"{gateway.url}/v1/completions", json=completion(stream=stream)) as resp:
        error = await assert_envelope(resp, 502)
    assert error["type"] == "upstream_error"
    assert len(gateway.upstream.requests) == 1


async def test_upstream_non_json_body_is_502(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    gateway.upstream.script.append(Behaviour(kind="garbage"))
    async with session.post(f"{gateway.url}/v1/completions", json=completion()) as resp:
        error = await assert_envelope(resp, 502)
    assert error["code"] == "upstream_protocol_error"


async def test_upstream_400_passes_message_as_400(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    gateway.upstream.script.append(
        Behaviour(kind="status", status=400, body={"error": {"message": "prompt is too long", "type": "x"}})
    )
    async with session.post(f"{gateway.url}/v1/completions", json=completion(model=VLLM_MODEL)) as resp:
        error = await assert_envelope(resp, 400)
    assert "prompt is too long" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_connection_refused_is_502(
    make_gateway: MakeGateway, session: aiohttp.ClientSession, stream: bool
) -> None:
    dead = free_port()  # nothing listens there
    gw = await make_gateway(
        extra_backends=f"  - {{name: dead, type: openai, base_url: 'http://127.0.0.1:{dead}/v1',"
        " timeout: {connect: 2}}\n",
        extra_models="  - {name: dead-model, routes: [{backend: dead, model: x}]}\n",
    )
    async with session.post(f"{gw.url}/v1/completions", json=completion("dead-model", stream=stream)) as resp:
        error = await assert_envelope(resp, 502)
    assert error["code"] == "upstream_unreachable"
    assert "Traceback" not in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_429_keeps_retry_after(
    gateway: RunningGateway, session: aiohttp.ClientSession, stream: bool
) -> None:
    gateway.upstream.script.append(
        Behaviour(
            kind="status",
            status=429,
            body={"error": {"message": "slow down", "type": "rate_limit"}},
            headers={"Retry-After": "3"},
        )
    )
    async with session.post(f"{gateway.url}/v1/completions", json=completion(stream=stream)) as resp:
        error = await assert_envelope(resp, 429)
        assert resp.headers.get("Retry-After") == "3"
    assert error["type"] == "rate_limit_error"


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
async def test_mid_stream_cut_ends_with_error_event_then_done(
    gateway: RunningGateway, session: aiohttp.ClientSession, model: str
) -> None:
    gateway.upstream.script.append(Behaviour(kind="cut", events=2))
    async with session.post(
        f"{gateway.url}/v1/completions",
        json=completion(model, max_tokens=8, stream=True, stream_options={"include_usage": True}),
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers.get("x-request-id")
        raw = await resp.read()
    events = sse_events(raw)
    assert events[-1] == b"data: [DONE]"
    assert events[-2].startswith(b"data: ")
    tail = orjson.loads(events[-2][len(b"data: ") :])
    assert set(tail) == {"error"}
    assert set(tail["error"]) == ENVELOPE_KEYS
    assert tail["error"]["type"] == "upstream_error"
    chunks = [orjson.loads(e[len(b"data: ") :]) for e in events[:-2]]
    assert [c["choices"][0]["text"] for c in chunks] == [" t0", " t1"]
    for chunk in chunks:
        assert chunk["model"] == model
        assert all(choice["finish_reason"] is None for choice in chunk["choices"])
        assert chunk.get("usage") is None  # no invented usage either
    assert raw.count(b"[DONE]") == 1


async def test_upstream_error_event_never_looks_like_a_clean_stream(
    gateway: RunningGateway, session: aiohttp.ClientSession
) -> None:
    """An upstream error event ends the answer as an error: a 502 envelope if nothing was sent
    yet, else 200 SSE whose tail is the error event and [DONE]. Never a clean-looking stream."""
    gateway.upstream.script.append(Behaviour(kind="error_event", events=1))
    async with session.post(f"{gateway.url}/v1/completions", json=completion(VLLM_MODEL, stream=True)) as resp:
        if resp.status != 200:
            error = await assert_envelope(resp, 502)
            assert "engine died" in error["message"]
            return
        raw = await resp.read()
    events = sse_events(raw)
    assert events[-1] == b"data: [DONE]"
    tail = orjson.loads(events[-2][len(b"data: ") :])
    assert set(tail["error"]) == ENVELOPE_KEYS
    assert "engine died" in tail["error"]["message"]
    assert raw.count(b"[DONE]") == 1


async def test_events_before_an_upstream_error_event_reach_the_client(
    gateway: RunningGateway, session: aiohttp.ClientSession
) -> None:
    gateway.upstream.script.append(Behaviour(kind="error_event", events=1))
    async with session.post(f"{gateway.url}/v1/completions", json=completion(VLLM_MODEL, stream=True)) as resp:
        assert resp.status == 200
        raw = await resp.read()
    events = sse_events(raw)
    assert orjson.loads(events[0][len(b"data: ") :])["choices"][0]["text"] == " t0"
    assert b"engine died" in events[-2] and events[-1] == b"data: [DONE]"


async def test_cut_before_first_event_is_502_not_200(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    gateway.upstream.script.append(Behaviour(kind="cut", events=0))
    async with session.post(f"{gateway.url}/v1/completions", json=completion(stream=True)) as resp:
        await assert_envelope(resp, 502)


# --- connections ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_keep_alive_reuses_upstream_connections(
    gateway: RunningGateway, session: aiohttp.ClientSession, stream: bool
) -> None:
    for _ in range(20):
        async with session.post(f"{gateway.url}/v1/completions", json=completion(stream=stream)) as resp:
            assert resp.status == 200
            await resp.read()
    assert len(gateway.upstream.requests) == 20
    assert gateway.upstream.connections <= 3

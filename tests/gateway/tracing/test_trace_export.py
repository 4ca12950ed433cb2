"""Traces in a real OTLP receiver (HTTP and gRPC): a request through two routes, the first failing, is one
trace with the server span and both upstream spans, GenAI attributes filled; the context reaches the
upstream as the attempt's own ``traceparent``; streams end with their last chunk."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.conftest import eventually
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.tracing.conftest import Make
from tests.gateway.tracing.receiver import GrpcReceiver, HttpReceiver, Span

TWO_ROUTES = """
server: {host: 127.0.0.1, port: 0}
telemetry: {otlp_endpoint: '$ENDPOINT', protocol: $PROTOCOL, service_name: gw-test}
backends:
  - {name: first, type: openai, base_url: '$up0', timeout: $t}
  - {name: second, type: vllm, base_url: '$up1', timeout: $t, version: '0.11.0'}
models:
  - {name: m, routes: [{backend: first, model: up-first}, {backend: second, model: up-second}]}
"""
INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING = f"00-{INCOMING_TRACE}-00f067aa0ba902b7-01"


def _config(protocol: str) -> str:
    endpoint = "$otlp" if protocol == "http/protobuf" else "$grpc"
    return TWO_ROUTES.replace("$ENDPOINT", endpoint).replace("$PROTOCOL", protocol)


def _spans_of(store: HttpReceiver | GrpcReceiver, trace_id: str, count: int) -> list[Span]:
    spans = store.trace(trace_id)
    assert len(spans) == count, [(s.kind, s.name) for s in store.spans]
    return spans


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_failover_is_one_trace_with_both_attempts(
    make: Make,
    upstreams: list[FakeUpstream],
    receiver: HttpReceiver,
    grpc_receiver: GrpcReceiver,
    session: aiohttp.ClientSession,
    protocol: str,
) -> None:
    store = receiver if protocol == "http/protobuf" else grpc_receiver
    gw = await make(_config(protocol), grpc_url=grpc_receiver.url)
    upstreams[0].script.append(Behaviour(kind="status", status=503, body={"error": {"message": "overloaded"}}))
    payload = {"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "n": 2}
    headers = {"traceparent": INCOMING, "tracestate": "vendor=abc", "User-Agent": "trace-test/1"}
    async with session.post(f"{gw.url}/v1/completions", json=payload, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        request_id = resp.headers["x-request-id"]

    await eventually(lambda: len(store.trace(INCOMING_TRACE)) == 3)
    spans = _spans_of(store, INCOMING_TRACE, 3)
    (server,) = [s for s in spans if s.kind == "server"]
    clients = sorted((s for s in spans if s.kind == "client"), key=lambda s: s.start)
    assert len(clients) == 2
    # One trace: the client's, continued; the server span is the caller's child, the attempts ours.
    assert server.parent_id == "00f067aa0ba902b7"
    assert all(c.parent_id == server.span_id for c in clients)
    assert server.start <= clients[0].start <= clients[1].start and clients[1].end <= server.end
    assert server.resource["service.name"] == "gw-test"

    a = server.attributes
    assert server.name == "text_completion m"
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"] == "m"  # as the client sent it
    assert a["gen_ai.response.model"] == "up-second"  # what answered
    assert a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.request.choice.count"] == 2
    assert a["gen_ai.usage.input_tokens"] == 3 and a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.response.finish_reasons"] == ["length", "length"]
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/completions"
    assert a["http.response.status_code"] == 200 and a["user_agent.original"] == "trace-test/1"
    assert a["gateway.attempts"] == 2 and "error.type" not in a
    assert server.status == 0

    failed, answered = clients
    assert failed.name == "text_completion up-first" and answered.name == "text_completion up-second"
    assert failed.attributes["gateway.backend.name"] == "first"
    assert failed.attributes["gateway.backend.type"] == "openai"
    assert failed.attributes["gen_ai.provider.name"] == "openai"
    assert failed.attributes["error.type"] == "upstream_unavailable" and failed.status == 2
    assert failed.attributes["gateway.upstream.reason"] == "status_503"
    assert failed.attributes["server.address"] == "127.0.0.1"
    assert failed.attributes["server.port"] == upstreams[0].port
    assert failed.attributes["gateway.attempt"] == "first" and "http.request.resend_count" not in failed.attributes
    assert answered.attributes["gateway.backend.name"] == "second"
    assert answered.attributes["gateway.attempt"] == "failover"
    assert answered.attributes["http.request.resend_count"] == 1
    assert answered.attributes["server.port"] == upstreams[1].port
    assert "error.type" not in answered.attributes and answered.status == 0

    # Each upstream got its own attempt's span as parent (not the client's: LiteLLM's bug), in the client's trace.
    for up, span in ((upstreams[0], failed), (upstreams[1], answered)):
        seen = {k.lower(): v for k, v in up.requests[-1].headers.items()}
        assert seen["traceparent"] == f"00-{INCOMING_TRACE}-{span.span_id}-01"
        assert seen["tracestate"] == "vendor=abc"
        assert seen["x-request-id"] == request_id


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_stream_span_ends_with_its_last_chunk(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, session: aiohttp.ClientSession, path: str
) -> None:
    gw = await make(_config("http/protobuf"))
    upstreams[0].script.append(Behaviour(kind="ok", delay=0.02))
    payload: dict[str, object] = {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payload |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    async with session.post(f"{gw.url}{path}", json=payload) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.endswith(b"data: [DONE]\n\n")

    await eventually(lambda: len(receiver.by_kind("server")) == 1 and len(receiver.by_kind("client")) == 1)
    (server,) = receiver.by_kind("server")
    (client,) = receiver.by_kind("client")
    op = "chat" if "chat" in path else "text_completion"
    assert server.attributes["gen_ai.operation.name"] == op and server.name == f"{op} m"
    assert server.attributes["gen_ai.request.stream"] is True
    assert server.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert server.attributes["gen_ai.usage.output_tokens"] == 4
    ttfc = server.attributes["gen_ai.response.time_to_first_chunk"]
    # The first chunk came before the other three (20 ms apart): the span lasted past it, to the last.
    assert 0 < ttfc < (server.end - server.start) / 1e9
    assert (server.end - server.start) / 1e9 >= 0.05
    assert 0 < client.attributes["gen_ai.response.time_to_first_chunk"] <= ttfc
    assert client.end >= client.start + 50_000_000  # the attempt's span covers the whole upstream stream


async def test_sampling_zero_exports_nothing_and_still_propagates(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, session: aiohttp.ClientSession
) -> None:
    config = _config("http/protobuf").replace("service_name: gw-test", "sample_ratio: 0, parent_based: false")
    gw = await make(config, env={"OTEL_BSP_SCHEDULE_DELAY": "5"})
    for headers in ({}, {"traceparent": INCOMING}):
        async with session.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "x"}, headers=headers) as r:
            assert r.status == 200
    sent = [dict((k.lower(), v) for k, v in s.headers.items())["traceparent"] for s in upstreams[0].requests]
    assert sent[0].startswith("00-") and sent[0].endswith("-00")  # a new trace, not sampled
    assert sent[1].startswith(f"00-{INCOMING_TRACE}-") and sent[1].endswith("-00")  # the caller's, not sampled
    assert sent[1].split("-")[2] != "00f067aa0ba902b7"  # our (unrecorded) span as parent, not the caller's
    await asyncio.sleep(0.2)  # forty export rounds
    assert receiver.exports == 0 and not receiver.spans


async def test_parent_based_sampling_follows_the_callers_flag(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, session: aiohttp.ClientSession
) -> None:
    gw = await make(_config("http/protobuf").replace("service_name: gw-test", "sample_ratio: 0"))
    unsampled = f"00-{'1' * 32}-00f067aa0ba902b7-00"
    for headers in ({"traceparent": INCOMING}, {"traceparent": unsampled}, {}):
        async with session.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "x"}, headers=headers) as r:
            assert r.status == 200
    await eventually(lambda: len(receiver.spans) == 2)
    assert {s.trace_id for s in receiver.spans} == {INCOMING_TRACE}  # only the sampled caller's trace


async def test_a_retry_of_the_same_backend_is_its_own_span(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, session: aiohttp.ClientSession
) -> None:
    config = """
server: {host: 127.0.0.1, port: 0}
telemetry: {otlp_endpoint: '$otlp'}
backends:
  - {name: only, type: openai, base_url: '$up0', timeout: $t, retry: {attempts: 2, backoff_base: 0, jitter: 0}}
models:
  - {name: m, routes: [{backend: only, model: up-m}]}
"""
    gw = await make(config)
    upstreams[0].script.append(Behaviour(kind="status", status=503, body={"error": {"message": "busy"}}))
    async with session.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "x"}) as resp:
        assert resp.status == 200
    await eventually(lambda: len(receiver.spans) == 3)
    (server,) = receiver.by_kind("server")
    first, retry = sorted(receiver.by_kind("client"), key=lambda s: s.start)
    assert first.attributes["error.type"] == "upstream_unavailable" and first.attributes["gateway.attempt"] == "first"
    assert retry.attributes["gateway.attempt"] == "retry" and retry.attributes["http.request.resend_count"] == 1
    assert "error.type" not in retry.attributes and server.attributes["gateway.attempts"] == 2
    sent = [{k.lower(): v for k, v in r.headers.items()}["traceparent"] for r in upstreams[0].requests]
    assert [t.split("-")[2] for t in sent] == [first.span_id, retry.span_id]


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_through_the_chat_bridge_is_traced(
    make: Make, upstreams: list[FakeUpstream], receiver: HttpReceiver, session: aiohttp.ClientSession, stream: bool
) -> None:
    config = """
server: {host: 127.0.0.1, port: 0}
telemetry: {otlp_endpoint: '$otlp'}
backends:
  - {name: v, type: vllm, base_url: '$up0', timeout: $t, version: '0.11.0'}
models:
  - {name: m, routes: [{backend: v, model: up-m}]}
"""
    gw = await make(config)
    payload = {"model": "m", "input": "hi", "max_output_tokens": 3, "stream": stream}
    async with session.post(f"{gw.url}/v1/responses", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    await eventually(lambda: len(receiver.spans) == 2)
    (server,) = receiver.by_kind("server")
    (attempt,) = receiver.by_kind("client")
    assert server.name == "chat m" and server.attributes["openai.api.type"] == "responses"
    assert server.attributes["gen_ai.request.max_tokens"] == 3 and server.attributes["http.route"] == "/v1/responses"
    assert attempt.parent_id == server.span_id
    seen = {k.lower(): v for k, v in upstreams[0].requests[-1].headers.items()}
    assert seen["traceparent"] == f"00-{server.trace_id}-{attempt.span_id}-01"  # through the bridge too

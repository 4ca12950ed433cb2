"""A fan-out (``n`` on a server that answers one choice per request) is visible: one client span per part under
the attempt's, each part's upstream request carrying its own span as parent. And every endpoint has its
GenAI operation name."""

from __future__ import annotations

import dataclasses

import respx
from aiohttp.test_utils import make_mocked_request

from gateway.tracing.attributes import OPERATIONS
from gateway.tracing.spans import Finished, Tracing
from gateway.tracing.w3c import Sampler
from schemas.endpoints import Endpoint
from tests.backends.native.helpers import golden_complete, golden_stream, make_backend, make_call, route


def _tracing() -> tuple[Tracing, list[Finished]]:
    spans: list[Finished] = []
    return Tracing(Sampler(1.0, parent_based=True), spans.append), spans


def _trace(tracing: Tracing):  # type: ignore[no-untyped-def]
    request = make_mocked_request("POST", "/v1/completions", headers={"Host": "gw:8080"})
    return tracing.start(request, Endpoint.COMPLETIONS)


async def test_each_part_of_a_fanout_has_its_own_span_and_traceparent() -> None:
    tracing, spans = _tracing()
    trace = _trace(tracing)
    backend = make_backend("tgi")
    attempt = trace.attempt(backend, "tgi-served", False)
    call = dataclasses.replace(make_call("tgi", n=3, max_tokens=8), trace=attempt)
    with respx.mock(assert_all_called=True) as mock:
        upstream = route(mock, "tgi").mock(side_effect=lambda request: golden_complete("tgi"))
        await backend.complete(call)
        sent = [r.request.headers["traceparent"] for r in upstream.calls]
    attempt.end()
    assert len(sent) == 3
    trace_hex, attempt_hex = f"{trace.trace_id:032x}", f"{attempt.span_id:016x}"
    parts = [s for s in spans if s.parent_id == attempt.span_id]
    (whole,) = [s for s in spans if s.span_id == attempt.span_id]
    assert whole.parent_id == trace.span_id and whole.kind == "client"
    assert len(parts) == 3 and {s.attributes["gateway.attempt"] for s in parts} == {"part 0", "part 1", "part 2"}
    assert sorted(sent) == sorted(f"00-{trace_hex}-{p.span_id:016x}-01" for p in parts)
    assert all(attempt_hex not in header for header in sent)  # every request names its part, not the attempt
    await backend.close()


async def test_one_part_sends_the_attempts_own_context() -> None:
    tracing, spans = _tracing()
    trace = _trace(tracing)
    backend = make_backend("tgi")
    attempt = trace.attempt(backend, "tgi-served", False)
    call = dataclasses.replace(make_call("tgi", max_tokens=8, stream=True), trace=attempt)
    with respx.mock() as mock:
        upstream = route(mock, "tgi", stream=True).mock(return_value=golden_stream("tgi"))
        stream = await backend.stream(call)
        async for _ in stream:
            pass
        await stream.aclose()
    attempt.end()
    assert upstream.calls[0].request.headers["traceparent"] == f"00-{trace.trace_id:032x}-{attempt.span_id:016x}-01"
    assert [s.span_id for s in spans] == [attempt.span_id]  # no part spans for a single request
    await backend.close()


def test_every_endpoint_has_an_operation_name() -> None:
    # A new endpoint needs a gen_ai.operation.name (gateway/tracing/attributes.py): this fails until it has one.
    missing = [e.value for e in Endpoint if e.value not in OPERATIONS]
    assert not missing, f"no gen_ai.operation.name for {missing}"
    assert OPERATIONS["completions"] == "text_completion" and OPERATIONS["chat"] == "chat"
    assert OPERATIONS["embeddings"] == "embeddings"


def test_unsampled_requests_record_nothing_and_propagate() -> None:
    spans: list[Finished] = []
    tracing = Tracing(Sampler(0.0, parent_based=True), spans.append)
    request = make_mocked_request(
        "POST",
        "/v1/chat/completions",
        headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
    )
    trace = tracing.start(request, Endpoint.CHAT)
    attempt = trace.attempt(make_backend("tgi"), "x", False)
    part = attempt.part(1)
    assert attempt.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert attempt.headers["traceparent"].endswith("-00")
    assert part.headers["traceparent"] != attempt.headers["traceparent"]
    attempt.end()
    trace.end(200, None, None)
    assert spans == [] and trace.ids[0] == "4bf92f3577b34da6a3ce929d0e0e4736"

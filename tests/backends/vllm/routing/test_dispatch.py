"""The dispatcher's one endpoint loop: who holds an endpoint, and for how long, per kind of call."""

from __future__ import annotations

from backends.base import UpstreamCall
from backends.errors import UpstreamConnectError, UpstreamProtocolError
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.dispatch import Dispatcher
from schemas.completions import CompletionRequest
from schemas.config import PoolRoutingConfig
from tests.fakes import Reply, ScriptedBackend


def _dispatcher(*adapters: ScriptedBackend) -> Dispatcher:
    dispatcher = Dispatcher(
        "pool",
        PoolRoutingConfig(strategy="round-robin", max_attempts=3),
        on_failure=lambda ep, exc: None,
        hopeless=lambda: False,
        describe=lambda: "",
    )
    for i, adapter in enumerate(adapters):
        ep = Endpoint(i, 16, url=f"http://w{i}")
        ep.adapter = adapter
        ep.available = True
        dispatcher.endpoints.append(ep)
    return dispatcher


def _call() -> UpstreamCall:
    return UpstreamCall(CompletionRequest(model="m", prompt="hi", max_tokens=4), "m", "m", "r")


async def test_an_answer_releases_its_endpoint_and_a_failure_moves_on() -> None:
    bad, good = ScriptedBackend("bad"), ScriptedBackend("good")
    bad.queue(Reply(error=UpstreamConnectError("refused", backend="bad")))
    good.queue(Reply())
    dispatcher = _dispatcher(bad, good)
    result = await dispatcher.complete(_call())
    assert b"from good" in result.body
    assert len(bad.calls) == 1 and len(good.calls) == 1
    assert dispatcher.in_flight() == 0


async def test_a_stream_holds_its_endpoint_until_closed() -> None:
    bad, good = ScriptedBackend("bad"), ScriptedBackend("good")
    bad.queue(Reply(error=UpstreamConnectError("refused", backend="bad"), events_before_error=0))
    good.queue(Reply(events=2))
    dispatcher = _dispatcher(bad, good)
    stream = await dispatcher.stream(_call())
    assert dispatcher.in_flight() == 1  # the endpoint that answered, until the stream is closed
    assert [ep.in_flight for ep in dispatcher.endpoints] == [0, 1]
    chunks = [chunk async for chunk in stream]
    assert b" good1" in b"".join(chunks) and b" good2" in b"".join(chunks)
    await stream.aclose()
    assert dispatcher.in_flight() == 0


async def test_a_failure_not_worth_another_try_is_raised_and_releases() -> None:
    only = ScriptedBackend("only")
    only.queue(Reply(error=UpstreamProtocolError("garbage", backend="only"), events_before_error=0))
    dispatcher = _dispatcher(only)
    try:
        await dispatcher.stream(_call())
    except UpstreamProtocolError as exc:
        assert exc.reason == "protocol"
    else:
        raise AssertionError("the stream should have failed")
    assert dispatcher.in_flight() == 0

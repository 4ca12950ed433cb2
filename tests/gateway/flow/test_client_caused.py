"""Client-caused upstream errors (issue 13 item 13, the general rule): a failure whose answer to the
client is a 4xx other than 408/429 is about the request, not the backend. It never counts against
the backend's breaker, and is neither retried nor failed over; it reaches the client as it is."""

from __future__ import annotations

from typing import ClassVar

import aiohttp
import orjson
import pytest

from backends.base import Backend, CompletionResult, CompletionStream, TokenUsage, UpstreamCall
from backends.capabilities import Capabilities, Level
from backends.errors import UpstreamError, UpstreamProtocolError
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.flow.health import CircuitState, client_caused, health_verdict
from gateway.flow.retry import retryable
from gateway.state import STATE
from tests.conftest import serve_app

CONFIG = """
backends:
  - name: a
    type: mock
    circuit_breaker: {consecutive_failures: 2}
    retry: {attempts: 3, backoff_base: 0, jitter: 0}
  - {name: b, type: mock}
models:
  - {name: m, strategy: failover, routes: [{backend: a, model: x}, {backend: b, model: x}]}
"""


class Scripted(Backend):
    """Answers each call with the next scripted error, or a result when the script is empty."""

    kind: ClassVar[str] = "scripted"

    def __init__(self, name: str, errors: list[UpstreamError]) -> None:
        super().__init__(name, Capabilities.of(Level.NATIVE))
        self.errors = errors
        self.calls = 0

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return CompletionResult(b'{"choices": []}', TokenUsage(1, 1))

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        raise NotImplementedError


def empty_prompt(backend: str) -> UpstreamError:
    """How an adapter says that the upstream cannot serve this request (e.g. Ollama's empty prompt)."""
    return UpstreamProtocolError(
        "the upstream cannot generate from an empty prompt", backend=backend, status=400, param="prompt"
    )


@pytest.mark.parametrize(
    ("exc", "caused"),
    [
        (UpstreamProtocolError("x", status=400, param="prompt"), True),
        (UpstreamError("x", status=422), True),
        (UpstreamError("x", status=413), True),
        (UpstreamError("x", status=408), False),
        (UpstreamError("x", status=429), False),
        (UpstreamProtocolError("x"), False),
    ],
)
def test_client_caused_is_a_4xx_other_than_408_and_429(exc: UpstreamError, caused: bool) -> None:
    assert client_caused(exc) is caused
    if caused:
        assert health_verdict(exc) is not False
        assert not retryable(UpstreamError("x", status=exc.status, reason="stream_cut"))


async def test_client_caused_failures_never_open_the_circuit_nor_fail_over() -> None:
    a = Scripted("a", [empty_prompt("a") for _ in range(5)])
    b = Scripted("b", [])
    app = create_app(parse_config(CONFIG, env={}), backends={"a": a, "b": b})
    runner, url = await serve_app(app)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": ""}) as resp:
                    assert resp.status == 400
                    assert orjson.loads(await resp.read())["error"]["param"] == "prompt"
            breaker = app[STATE].router.lookup("m").routes[0].guard.breaker
            assert breaker.state is CircuitState.CLOSED  # five in a row, with 2 allowed
            assert (a.calls, b.calls) == (5, 0)  # neither retried on a nor failed over to b
            async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi"}) as resp:
                assert resp.status == 200
            assert a.calls == 6  # a still takes traffic
    finally:
        await runner.cleanup()

"""GatewayMetrics' hot-path recording, unit level: what the cached value adders write is what
the registry exposes, and an adder falls back to ``inc`` when a child keeps its value elsewhere."""

from __future__ import annotations

from prometheus_client import Counter

from gateway.metrics import NONE, UNKNOWN, GatewayMetrics, _adder
from schemas.endpoints import Endpoint


def _value(m: GatewayMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_request_series_add_up_through_the_cached_adders() -> None:
    m = GatewayMetrics(["m"], ["b"])
    for endpoint in (Endpoint.COMPLETIONS, Endpoint.CHAT, Endpoint.CHAT):
        m.request_started("m", endpoint=endpoint)
    m.request_ended("m", endpoint=Endpoint.CHAT)
    m.request_finished("m", "b", 200, 0.01, endpoint=Endpoint.CHAT)
    m.request_finished("m", "b", 200, 0.02, endpoint=Endpoint.CHAT)
    m.request_finished("invented", None, 404, None, endpoint=Endpoint.COMPLETIONS)
    m.tokens("m", "b", 5, 7, endpoint=Endpoint.CHAT)
    m.tokens("m", "b", 1, 0, endpoint=Endpoint.CHAT)

    assert _value(m, "gateway_requests_in_flight", model="m", endpoint="completions") == 1
    assert _value(m, "gateway_requests_in_flight", model="m", endpoint="chat") == 1
    ok = {"model": "m", "backend": "b", "status": "200", "endpoint": "chat"}
    assert _value(m, "gateway_requests_total", **ok) == 2
    refused = {"model": UNKNOWN, "backend": NONE, "status": "404", "endpoint": "completions"}
    assert _value(m, "gateway_requests_total", **refused) == 1
    pair = {"model": "m", "backend": "b", "endpoint": "chat"}
    assert _value(m, "gateway_request_duration_seconds_count", **pair) == 2
    assert _value(m, "gateway_prompt_tokens_total", **pair) == 6
    assert _value(m, "gateway_completion_tokens_total", **pair) == 7


def test_adder_falls_back_to_inc_without_a_value_object() -> None:
    counter = Counter("c", "c", ("x",), registry=None)
    child = counter.labels("a")
    assert _adder(child) == child._value.inc  # the fast path: the value's own adder

    class Elsewhere:
        def __init__(self) -> None:
            self.total = 0.0

        def inc(self, amount: float = 1) -> None:
            self.total += amount

    other = Elsewhere()
    add = _adder(other)  # type: ignore[arg-type]
    add(2)
    assert other.total == 2

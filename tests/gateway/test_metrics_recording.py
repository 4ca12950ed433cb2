"""GatewayMetrics' hot-path recording, unit level: what the cached value adders write is what
the registry exposes, and an adder falls back to ``inc`` when a child keeps its value elsewhere."""

from __future__ import annotations

from prometheus_client import Counter

from backends.base import TokenUsage
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
    assert _value(m, "gateway_request_duration_seconds_count", **pair, status_class="2xx") == 2
    refused_class = {"model": UNKNOWN, "backend": NONE, "endpoint": "completions", "status_class": "4xx"}
    assert _value(m, "gateway_request_duration_seconds_count", **refused_class) == 0  # no time given: no observation
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


def _samples(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in m.registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")  # creation times differ between two registries
    }


def test_request_closed_records_what_the_three_separate_calls_record() -> None:
    # RequestRecord.close's one call (a cached bundle per model, backend, endpoint) against the
    # calls it replaces, on every shape: usage or none, zero tokens, 499, unknown and missing names.
    cases: list[tuple[str | None, str | None, int, float, TokenUsage | None, Endpoint]] = [
        ("m", "b", 200, 0.01, TokenUsage(5, 7), Endpoint.CHAT),
        ("m", "b", 200, 0.3, TokenUsage(0, 3), Endpoint.CHAT),
        ("m", "b", 499, 0.02, None, Endpoint.CHAT),
        ("m", "b", 499, 0.02, TokenUsage(2, 1), Endpoint.COMPLETIONS),
        ("m", None, 502, 0.5, None, Endpoint.COMPLETIONS),
        (None, None, 400, 0.001, None, Endpoint.COMPLETIONS),
        (None, None, 499, 0.001, None, Endpoint.CHAT),
        ("m", "gone", 200, 0.04, TokenUsage(1, 1), Endpoint.COMPLETIONS),  # a backend no longer known
        ("m", "b", 200, 0.01, TokenUsage(5, 7), Endpoint.CHAT),
    ]
    closed, separate = GatewayMetrics(["m"], ["b"]), GatewayMetrics(["m"], ["b"])
    for model, backend, status, seconds, usage, endpoint in cases:
        closed.request_closed(model, backend, status, seconds, usage, endpoint)
        if usage is not None and model is not None and backend is not None:
            separate.tokens(model, backend, usage.prompt_tokens, usage.completion_tokens, endpoint=endpoint)
        if status == 499:
            separate.client_disconnected(model, backend, endpoint=endpoint)
        separate.request_finished(model, backend, status, seconds, endpoint=endpoint)
    assert _samples(closed) == _samples(separate)
    assert _value(closed, "gateway_client_disconnects_total", model="m", backend="b", endpoint="chat") == 1
    assert _value(closed, "gateway_prompt_tokens_total", model="m", backend="b", endpoint="chat") == 10
    assert ("m", "gone", Endpoint.COMPLETIONS) not in closed._closing  # unknown names keep no bundle
    # every answer's duration, refusals too, under its status class
    refused = {"model": "_unknown", "backend": "_none", "endpoint": "completions", "status_class": "4xx"}
    assert _value(closed, "gateway_request_duration_seconds_count", **refused) == 1
    assert _value(closed, "gateway_request_duration_seconds_count", **refused | {"model": "m"}) is None


def test_exact_spend_and_no_created_series() -> None:
    """The cost counter adds integers and shows their exact decimal: 10,000 charges of 0.000001 add up to
    0.01 exactly (a float counter gives 0.009999999999999155), and no ``*_created`` series exist."""
    m = GatewayMetrics(["m"], ["b"], keys=["team-a"])
    for _ in range(10_000):
        m.spent("m", "b", "team-a", 10**6, False)  # 10^6 units = 0.000001 of the currency
    m.spent("m", "b", "intruder", 3, True)  # an unknown key name is never a label
    assert _value(m, "gateway_cost_total", model="m", backend="b", key="team-a", source="upstream") == 0.01
    assert _value(m, "gateway_cost_total", model="m", backend="b", key="_none", source="estimate") == 3e-12
    drift = 0.0
    for _ in range(10_000):
        drift += 0.000001
    assert drift != 0.01  # what a float counter would show
    m.request_finished("m", "b", 200, 0.1)
    assert not [s for f in m.registry.collect() for s in f.samples if s.name.endswith("_created")]


def test_observer_records_what_observe_records() -> None:
    """The bisecting observer against prometheus-client's own loop: values on, between and past the bounds."""
    from prometheus_client import CollectorRegistry, Histogram

    from gateway.metrics import _histogram, _observer

    registry = CollectorRegistry()
    family = Histogram("h", "h", ("k",), buckets=(0.1, 0.5, 1.0), registry=registry)
    fast, slow = _observer(family.labels("fast")), family.labels("slow").observe
    bounds, _, adds = _histogram(family.labels("fast"))
    assert bounds[-1] == float("inf") and len(adds) == len(bounds)
    for value in (0.0, 0.05, 0.1, 0.10000001, 0.5, 0.7, 1.0, 3.0, 1e9, -1.0):
        fast(value)
        slow(value)
    samples = {
        (s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples if s.labels["k"] == "fast"
    }
    expected = {
        (s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples if s.labels["k"] == "slow"
    }
    assert samples == expected
    assert samples[("h_bucket", "0.1")] == 4 and samples[("h_bucket", "+Inf")] == 10


def test_store_evictions_add_up_through_the_cached_adders() -> None:
    """A full memory store evicts on every save: each (store, reason) series is bound once, and every
    eviction still counts, an unknown reason under ``_unknown``."""
    m = GatewayMetrics(["m"], ["b"])
    for _ in range(3):
        m.store_evicted("responses", "items", 1)
    m.store_evicted("responses", "bytes", 4)
    m.store_evicted("responses", "invented", 2)
    m.store_evicted("responses", "invented", 1)
    m.store_evicted("keys", "items", 5)
    assert _value(m, "gateway_state_store_evictions_total", store="responses", reason="items") == 3
    assert _value(m, "gateway_state_store_evictions_total", store="responses", reason="bytes") == 4
    assert _value(m, "gateway_state_store_evictions_total", store="responses", reason=UNKNOWN) == 3
    assert _value(m, "gateway_state_store_evictions_total", store="keys", reason="items") == 5


def test_a_refusal_named_by_a_path_counts_for_its_field() -> None:
    m = GatewayMetrics(["m"], ["b"])
    for param in ("input[2].output[0]", "input[0].content[1]", "text.format", "top_k", "nonsense[0]"):
        m.unsupported_parameter("b", param, endpoint=Endpoint.RESPONSES)
    name = "gateway_unsupported_parameter_rejections_total"
    assert _value(m, name, backend="b", param="input", endpoint="responses") == 2
    assert _value(m, name, backend="b", param="text.format", endpoint="responses") == 1
    assert _value(m, name, backend="b", param="top_k", endpoint="responses") == 1
    assert _value(m, name, backend="b", param=UNKNOWN, endpoint="responses") == 1

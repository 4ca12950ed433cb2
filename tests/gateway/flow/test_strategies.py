"""Routing strategies: which route goes first, and in which order failover walks the rest."""

from __future__ import annotations

from collections import Counter

from backends.mock import MockBackend
from gateway.clock import Clock
from gateway.flow.admission import Limiter
from gateway.flow.health import CircuitBreaker
from gateway.flow.retry import RetryPolicy
from gateway.flow.router import BackendGuard, Failover, LeastOutstanding, RoundRobin, Route, Weighted
from schemas.config import CircuitBreakerConfig, MockBackendConfig, RetryConfig


def routes(*weights: float) -> list[Route]:
    out = []
    for i, weight in enumerate(weights):
        name = f"b{i}"
        guard = BackendGuard(
            CircuitBreaker(name, CircuitBreakerConfig(), Clock()),
            Limiter(name, None, queue_size=0, timeout=1),
            RetryPolicy.from_config(RetryConfig(), Clock()),
        )
        out.append(Route(MockBackend(MockBackendConfig(name=name, type="mock")), "m", weight, guard))
    return out


def names(order: list[Route]) -> list[str]:
    return [r.backend.name for r in order]


def test_failover_keeps_configuration_order() -> None:
    rs = routes(1, 1, 1)
    assert [names(Failover().order(rs)) for _ in range(3)] == [["b0", "b1", "b2"]] * 3


def test_round_robin_rotates_and_fails_over_to_the_next() -> None:
    rs = routes(1, 1, 1)
    strategy = RoundRobin()
    assert [names(strategy.order(rs)) for _ in range(4)] == [
        ["b0", "b1", "b2"],
        ["b1", "b2", "b0"],
        ["b2", "b0", "b1"],
        ["b0", "b1", "b2"],
    ]


def test_weighted_shares_follow_the_weights_smoothly() -> None:
    rs = routes(3, 1)
    strategy = Weighted()
    firsts = [strategy.order(rs)[0].backend.name for _ in range(400)]
    assert Counter(firsts) == {"b0": 300, "b1": 100}
    # Smooth: the light route comes up once in every window of 4, never starved then flooded.
    assert all("b1" in firsts[i : i + 4] for i in range(0, 400, 4))
    order = strategy.order(rs)
    assert sorted(names(order)) == ["b0", "b1"]  # the other route stays as the failover


def test_weighted_with_fractional_weights() -> None:
    rs = routes(0.5, 0.25, 0.25)
    strategy = Weighted()
    assert Counter(strategy.order(rs)[0].backend.name for _ in range(1000)) == {"b0": 500, "b1": 250, "b2": 250}


def test_least_outstanding_picks_the_least_loaded() -> None:
    rs = routes(1, 1, 1)
    for _ in range(3):
        rs[0].guard.limiter.try_acquire()
    rs[2].guard.limiter.try_acquire()
    strategy = LeastOutstanding()
    assert [names(strategy.order(rs)) for _ in range(2)] == [["b1", "b2", "b0"]] * 2


def test_least_outstanding_ties_take_turns() -> None:
    rs = routes(1, 1)
    strategy = LeastOutstanding()
    assert [strategy.order(rs)[0].backend.name for _ in range(4)] == ["b0", "b1", "b0", "b1"]

"""The routing and resilience keys of the YAML config: defaults, bounds, and YAML paths of mistakes."""

from __future__ import annotations

import pytest

from gateway.configfile import ConfigError, parse_config

BASE = """
server:
  port: 0
{server}
backends:
  - name: a
    type: openai
    base_url: http://127.0.0.1:9/v1
{backend}
models:
  - name: m
{model}
    routes: [{{backend: a, model: x}}]
"""


def config(server: str = "", backend: str = "", model: str = "") -> str:
    return BASE.format(server=server, backend=backend, model=model)


def test_defaults_are_safe() -> None:
    cfg = parse_config(config(), env={})
    backend = cfg.backends[0]
    assert backend.retry.attempts == 1  # no retry unless asked: clients retry themselves
    assert backend.circuit_breaker.enabled and backend.circuit_breaker.consecutive_failures == 5
    assert backend.health_check is None
    assert backend.max_concurrency is None
    assert cfg.server.admission.max_in_flight == 4096 and cfg.server.admission.queue_size == 1024
    assert cfg.server.drain_delay == 0
    assert cfg.models[0].strategy == "failover"


def test_every_knob_parses() -> None:
    cfg = parse_config(
        config(
            server="  drain_delay: 5\n  admission: {max_in_flight: 10, queue_size: 0, queue_timeout: 1,"
            " priority_header: x-tier, default_priority: batch}",
            backend="    max_concurrency: 3\n"
            "    retry: {attempts: 3, backoff_base: 0.1, backoff_max: 2, jitter: 0, max_retry_after: 4, deadline: 9}\n"
            "    circuit_breaker: {consecutive_failures: 2, failure_rate: null, window: 5, min_requests: 5,"
            " cooldown: 3}\n"
            "    health_check: {interval: 1, timeout: 0.5}",
            model="    strategy: least_outstanding",
        ),
        env={},
    )
    b = cfg.backends[0]
    assert (b.max_concurrency, b.retry.attempts, b.retry.deadline) == (3, 3, 9)
    assert b.circuit_breaker.failure_rate is None and b.health_check is not None
    assert cfg.server.admission.priority_header == "x-tier"


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        ({"backend": "    retry: {attempts: 0}"}, "backends[0].retry.attempts"),
        ({"backend": "    retry: {tries: 3}"}, "backends[0].retry.tries"),
        ({"backend": "    max_concurrency: 0"}, "backends[0].max_concurrency"),
        ({"backend": "    circuit_breaker: {window: 5, min_requests: 6}"}, "backends[0].circuit_breaker"),
        ({"backend": "    circuit_breaker: {failure_rate: 1.5}"}, "backends[0].circuit_breaker.failure_rate"),
        ({"backend": "    health_check: {interval: 0}"}, "backends[0].health_check.interval"),
        ({"server": "  admission: {queue_timeout: 0}"}, "server.admission.queue_timeout"),
        ({"server": "  admission: {priority_header: 'bad header'}"}, "server.admission.priority_header"),
        ({"server": "  admission: {default_priority: urgent}"}, "server.admission.default_priority"),
        ({"model": "    strategy: random"}, "models[0].strategy"),
    ],
)
def test_mistakes_name_their_yaml_path(edit: dict[str, str], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(**edit), env={})
    assert f" {path}: " in str(caught.value), str(caught.value)

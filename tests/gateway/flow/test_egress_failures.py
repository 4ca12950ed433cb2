"""Egress failures in the request flow: a refused certificate or refused proxy credentials fail
over to a model's other routes but are never retried on the same backend (its next try meets
the same certificate, the same credentials); an unreachable proxy is retried like any connect
failure. Each is counted as an upstream error under its own reason, and opens the breaker."""

from __future__ import annotations

import pytest

from backends.errors import UpstreamError, UpstreamProxyError, UpstreamTLSError
from backends.transport.egress import proxy_refused, proxy_unreachable
from gateway.flow.health import CircuitState
from gateway.flow.retry import RetryPolicy, retryable, retryable_here
from schemas.config import RetryConfig
from tests.fakes import Reply
from tests.gateway.flow.conftest import FakeClock
from tests.gateway.flow.scripted import flow

RETRY = {"attempts": 3, "backoff_base": 0.5, "backoff_max": 10, "jitter": 0}


def tls() -> UpstreamTLSError:
    return UpstreamTLSError("backend 'a': TLS with the upstream failed: certificate verify failed: x", backend="a")


@pytest.mark.parametrize(
    ("make", "reason", "here"),
    [
        (tls, "tls", False),
        (lambda: proxy_refused(407, "a"), "proxy_auth", False),
        (lambda: proxy_refused(403, "a"), "proxy", False),
        (lambda: proxy_refused(502, "a"), "proxy", True),
        (lambda: proxy_unreachable(ConnectionRefusedError(), "a"), "proxy", True),
    ],
)
def test_what_fails_over_and_what_is_retried_here(make: object, reason: str, here: bool) -> None:
    assert callable(make)
    exc: UpstreamError = make()
    assert exc.status == 502 and exc.reason == reason
    assert retryable(exc) and retryable_here(exc) is here
    clock = FakeClock()
    policy = RetryPolicy.from_config(RetryConfig.model_validate(RETRY), clock)
    assert (policy.start(clock.now()).next_wait(exc) is not None) is here


async def test_a_tls_failure_fails_over_and_is_not_retried_on_its_backend() -> None:
    f = flow("a", "b", a={"retry": RETRY})
    f["a"].default = Reply.fail(tls())
    _, answered = await f.complete()
    assert answered == "b" and f.called() == ["a", "b"]
    assert f.metric("gateway_upstream_errors_total", backend="a", reason="tls") == 1
    assert f.metric("gateway_failovers_total", model="m", backend="a", reason="tls") == 1
    assert f.metric("gateway_retries_total", backend="a", reason="tls") == 0


async def test_with_one_route_the_client_gets_the_tls_failure_at_once() -> None:
    f = flow("a", a={"retry": RETRY, "circuit_breaker": {"consecutive_failures": 1}})
    f["a"].default = Reply.fail(tls())
    with pytest.raises(UpstreamTLSError) as raised:
        await f.complete()
    assert "certificate verify failed" in raised.value.message
    assert f.called() == ["a"] and f.clock.sleeps == []
    assert f.metric("gateway_circuit_state", backend="a") == CircuitState.OPEN  # a backend failure


async def test_proxy_credentials_refused_are_not_retried_but_an_unreachable_proxy_is() -> None:
    f = flow("a", a={"retry": RETRY})
    f["a"].default = Reply.fail(proxy_refused(407, "a"))
    with pytest.raises(UpstreamProxyError) as raised:
        await f.complete()
    assert raised.value.code == "upstream_proxy_auth_failed" and f.called() == ["a"]
    g = flow("a", a={"retry": RETRY})
    g["a"].queue(Reply.fail(proxy_unreachable(ConnectionRefusedError(), "a")))
    _, answered = await g.complete()
    assert answered == "a" and g.called() == ["a", "a"]
    assert g.metric("gateway_retries_total", backend="a", reason="proxy") == 1

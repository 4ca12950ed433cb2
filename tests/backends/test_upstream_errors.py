"""Each upstream error names its kind in ``reason`` (a metrics label) unless the raiser names another."""

from __future__ import annotations

import pytest

from backends.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamTooLargeError,
)
from backends.vllm.routing.dispatch import NoReadyWorkerError


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (UpstreamError, "error"),
        (UpstreamConnectError, "connect"),
        (UpstreamClosedError, "closed"),
        (UpstreamTimeoutError, "timeout"),
        (UpstreamProtocolError, "protocol"),
        (UpstreamTooLargeError, "too_large"),
        (NoReadyWorkerError, "no_ready_worker"),
    ],
)
def test_the_default_reason_is_the_kind_and_a_named_one_wins(kind: type[UpstreamError], reason: str) -> None:
    assert kind("x", backend="b").reason == reason
    named = kind("x", backend="b", reason="stream_cut")
    assert named.reason == "stream_cut" and named.backend == "b"


def test_a_status_error_is_labelled_by_its_status() -> None:
    assert UpstreamStatusError(503, "busy").reason == "status_503"
    assert UpstreamStatusError(503, "busy", reason="status_424").reason == "status_424"

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
    error_fields,
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


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # FastAPI's request validation (vLLM's 422): each location and message, without "body"
        (
            b'{"detail": [{"type": "missing", "loc": ["body", "messages", 0, "content"], "msg": "Field required"},'
            b' {"loc": ["body", "n"], "msg": "Input should be a valid integer", "type": "int_parsing"}]}',
            "messages.0.content: Field required; n: Input should be a valid integer",
        ),
        (b'{"detail": [{"msg": "bad"}]}', "bad"),
        # Other shapes: the upstream's own text, never a Python repr
        (b'{"detail": [{"no": "msg"}]}', '{"detail": [{"no": "msg"}]}'),
        (b'[{"a": 1}, null, true]', '[{"a": 1}, null, true]'),
        (b'{"error": {"message": {"why": ["x"]}}}', '{"why":["x"]}'),
        (b'{"error": {"type": "oops", "inner": null}}', '{"type":"oops","inner":null}'),
    ],
)
def test_an_error_body_reads_as_words_not_as_a_python_repr(body: bytes, message: str) -> None:
    read = error_fields(body)
    assert read.message == message
    assert "'" not in read.message and "None" not in read.message and "True" not in read.message


def test_a_parsed_error_that_is_not_a_known_shape_is_written_as_json() -> None:
    assert error_fields({"weird": [1, None]}).message == '{"weird":[1,null]}'

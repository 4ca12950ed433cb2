"""``telemetry``: OpenTelemetry traces over OTLP (off unless this section or the standard ``OTEL_*`` variables say so).

Every key may be left out; a key left out takes the standard variable when it is set
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``), then the default here. The gateway resolves
them at start (``gateway.tracing.settings``); this module only validates what the file says.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AnyHttpUrl, Field, SecretStr

from schemas.config.common import _Strict

__all__ = ["TelemetryConfig"]


class TelemetryConfig(_Strict):
    """Traces: one server span per request, one client span per upstream attempt (docs/tracing.md)."""

    # The collector: ``http://host:4318`` (http/protobuf: ``/v1/traces`` is appended unless the
    # URL has a path) or ``http://host:4317`` (grpc).
    otlp_endpoint: AnyHttpUrl | None = None
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    # Share of new traces recorded (0..1). An incoming ``traceparent`` decides for its trace
    # while ``parent_based`` is true (the OpenTelemetry default, ``parentbased_traceidratio``).
    # Unsampled requests still send ``traceparent`` upstream: the context always propagates.
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    parent_based: bool = True
    service_name: Annotated[str, Field(min_length=1, max_length=256)] = "completions-gateway"
    # Opt-in: prompts, completions and tool-call arguments as span attributes. Off, none of
    # them is ever recorded; API keys never are.
    capture_content: bool = False
    # Sent with every export (a hosted collector's API key: a secret, never logged).
    headers: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")], SecretStr] = Field(default_factory=dict)
    # Finished spans waiting for export; past it new spans are dropped and counted
    # (``gateway_trace_spans_dropped_total``): a slow collector never holds a request.
    max_queue_size: Annotated[int, Field(ge=64, le=1_000_000)] = 4096
    # Seconds one export may take before it is given up (its spans counted as dropped).
    export_timeout: Annotated[float, Field(gt=0, le=120)] = 10.0

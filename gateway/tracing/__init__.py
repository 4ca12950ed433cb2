"""OpenTelemetry traces: a thin layer the flow calls at fixed points; nothing is recorded when it is off.

- the handler: ``state.tracing.start(request, endpoint)`` opens the request's server span
  (:class:`~gateway.tracing.spans.RequestTrace`), ended by the request's record when it closes;
- the service: ``RequestTrace.attempt(...)`` per upstream attempt (a client span), passed to the
  backend inside the ``Call``, whose ``headers`` carry the attempt's ``traceparent`` upstream;
- :mod:`gateway.tracing.sdk`, the only importer of the OpenTelemetry SDK, exports ended spans
  from a thread of its own.

:func:`build` returns None when tracing is off (``state.tracing`` is then None and the request
path makes no tracing call at all). docs/tracing.md describes the spans and their cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from gateway.tracing.settings import SettingsError, TraceSettings, resolve, trace_problems
from gateway.tracing.spans import AttemptTrace, RequestTrace, Tracing
from gateway.tracing.w3c import Sampler

__all__ = [
    "AttemptTrace",
    "RequestTrace",
    "SettingsError",
    "TraceSettings",
    "Tracing",
    "TracingRuntime",
    "build",
    "resolve",
    "trace_problems",
]


@dataclass(slots=True)
class TracingRuntime:
    """Tracing while the gateway runs: what requests use, and what to shut down at the end."""

    tracing: Tracing
    shutdown: Callable[[float], None]  # flush for at most N seconds, then stop; blocking: call it off the loop


def build(settings: TraceSettings | None, registry: CollectorRegistry | None = None) -> TracingRuntime | None:
    """Start exporting per ``settings`` (None: tracing off, nothing imported); the drop counters go in ``registry``."""
    if settings is None:
        return None
    from gateway.tracing.sdk import Exporter, TraceMetrics

    exporter = Exporter(settings)
    if registry is not None:
        registry.register(TraceMetrics(exporter))
    sampler = Sampler(settings.sample_ratio, parent_based=settings.parent_based)
    tracing = Tracing(sampler, exporter.emit, capture_content=settings.capture_content)
    return TracingRuntime(tracing, exporter.shutdown)
